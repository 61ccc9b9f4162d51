"""What every part of the suite shares: the harness fixture to override, the per-test guard and helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings

from conformance import profiles
from conformance.agents import TxAgent
from conformance.capabilities import unmet_need
from conformance.clocks import ManualClock, frozen
from conformance.harness import Harness
from proletarian_ref.backend import ArchivedJobRecord, Backend, JobRecord
from proletarian_ref.job import enqueue
from proletarian_ref.serializers import Serializer
from proletarian_ref.tables import TableName, table_name
from proletarian_ref.worker import process_next_job

F = TypeVar("F", bound=Callable[..., Any])

STRATEGIES_ATTRIBUTE: Final = "__conformance_strategies__"
# The suite's tests share one function across every subclass (one executor per backend), run for long
# per example, and take the harness fixture; none of that is a mistake here.
SUPPRESSED: Final = (
    HealthCheck.too_slow,
    HealthCheck.function_scoped_fixture,
    HealthCheck.differing_executors,
)


def scaled_examples(weight: float) -> int:
    """A share of the chosen profile's max_examples (read when the suite is imported), at least one."""
    return max(1, round(profiles.active().max_examples * weight))


def property_test(weight: float, **strategies: Any) -> Callable[[F], F]:
    """@given with max_examples scaled from the profile; the strategies stay on the test for the runner."""

    def decorate(test: F) -> F:
        wrapped: Any = settings(
            parent=profiles.active(),
            max_examples=scaled_examples(weight),
            deadline=None,
            suppress_health_check=SUPPRESSED,
        )(given(**strategies)(test))
        setattr(wrapped, STRATEGIES_ATTRIBUTE, strategies)
        result: F = wrapped
        return result

    return decorate


def no_log(event: str, data: Any) -> None:
    return None


class SuiteBase:
    """Base of the suite's parts. Subclass BackendSuite, not this."""

    __test__ = False
    # How long one transaction step may take before it counts as blocked on a lock (seconds).
    step_timeout: ClassVar[float] = 3.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The suite's own classes say __test__ = False; a third party's subclass is a test class unless it
        # says otherwise itself.
        if "__test__" not in cls.__dict__:
            cls.__test__ = True

    @pytest.fixture
    def harness(self) -> Harness:
        """Override in your subclass: yield your installed Harness (see docs/conformance.md)."""
        pytest.fail(
            f"{type(self).__name__} must define a `harness` fixture yielding a conformance Harness",
            pytrace=False,
        )

    @pytest.fixture(autouse=True)
    def _conformance_guard(self, request: pytest.FixtureRequest, harness: Harness) -> Iterator[None]:
        reason = unmet_need(request.function, harness)
        if reason is not None:
            pytest.skip(reason)
        harness.clear()
        try:
            yield
        finally:
            harness.close()

    # -- helpers ---------------------------------------------------------------------------------------

    @staticmethod
    def tables(harness: Harness) -> tuple[TableName, TableName]:
        return table_name(harness.job_table), table_name(
            harness.archived_job_table, option="archived_job_table"
        )

    @staticmethod
    def enqueue_job(
        harness: Harness,
        now: datetime,
        *,
        job_type: str = "conformance/job",
        payload: Any = None,
        serializer: Serializer | None = None,
        backend: Backend | None = None,
        **options: Any,
    ) -> Any:
        """Enqueue one job at clock time `now` on a caller connection and commit it; returns the job id."""
        conn = harness.connect()
        try:
            job_id = enqueue(
                conn,
                job_type,
                payload,
                job_table=harness.job_table,
                serializer=serializer,
                job_id_strategy=harness.job_id_strategy(),
                clock=frozen(now),
                backend=backend if backend is not None else harness.backend(),
                **{**harness.enqueue_options, **options},
            )
            conn.commit()
        finally:
            conn.close()
        return job_id

    @staticmethod
    def run_next(
        harness: Harness,
        clock: ManualClock,
        handler: Callable[..., object],
        *,
        backend: Any = None,
        **options: Any,
    ) -> bool | None:
        """process_next_job on `backend`, else a new backend of the harness: one poll, one transaction."""
        return process_next_job(
            None,
            handler,
            backend=backend if backend is not None else harness.backend(),
            log=no_log,
            clock=clock,
            job_id_strategy=harness.job_id_strategy(),
            job_table=harness.job_table,
            archived_job_table=harness.archived_job_table,
            **{**harness.worker_options, **options},
        )

    @staticmethod
    def claim_in(
        agent: TxAgent, job_table: TableName, queue: str, now: datetime, what: str = "claim"
    ) -> JobRecord | None:
        """get_next_job inside the agent's open transaction, failing if it blocks."""
        backend = agent.backend
        return agent.run(lambda conn: backend.get_next_job(conn, job_table, queue, now), what)

    @staticmethod
    def key(harness: Harness, stored_id: Any) -> str:
        return str(harness.job_id_strategy().decode_id(stored_id))

    @staticmethod
    def only_job(harness: Harness) -> JobRecord:
        jobs = harness.jobs()
        assert len(jobs) == 1, f"expected exactly one job in the job table, found {len(jobs)}: {jobs}"
        return jobs[0]

    @staticmethod
    def only_archived(harness: Harness) -> ArchivedJobRecord:
        archived = harness.archived_jobs()
        assert len(archived) == 1, f"expected exactly one archived job, found {len(archived)}: {archived}"
        return archived[0]

    @staticmethod
    def assert_instant(harness: Harness, actual: datetime, expected: datetime, what: str) -> None:
        """Equal to within the backend's time precision (whole seconds for MySQL TIMESTAMP)."""
        precision = harness.capabilities.time_precision
        assert abs(actual - expected) < precision, (
            f"{what} is {actual.isoformat()}, expected {expected.isoformat()} "
            f"(to within {precision.total_seconds():g} s, the backend's time precision)"
        )

    @staticmethod
    def precision(harness: Harness) -> timedelta:
        return harness.capabilities.time_precision
