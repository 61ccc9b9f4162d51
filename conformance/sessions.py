"""Session clauses: a session killed mid-transaction commits nothing; the caller's session is the caller's."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import pytest

from conformance.base import SuiteBase
from conformance.clocks import EPOCH, ManualClock, frozen
from conformance.harness import Harness
from proletarian_ref.backend import STATUS_SUCCESS, Backend, JobRecord
from proletarian_ref.errors import ProletarianError, TransientDatabaseError
from proletarian_ref.job import Job, enqueue
from proletarian_ref.job_ids import JobIdStrategy
from proletarian_ref.tables import TableName

# Where K1 kills the worker's session: right after the claim, inside the handler, between archive and
# delete, after delete (just before the commit), and after a failed attempt's retry_at.
KILL_POINTS: Final = ("claim", "handler", "archive", "delete", "retry")
# An offset zone for the caller's session in C4, so a backend that sets its own zone changes something.
CALLER_ZONE: Final = "+05:30"


def need(harness: Harness, feature: str) -> None:
    """Skip, saying why, when the harness does not provide a feature a clause needs."""
    if not harness.supports(feature):
        pytest.skip(f"{harness.name}: the harness does not provide {feature!r} (see Harness.supports)")


class _KillingBackend:
    """The backend under test, with the session of its transaction killed right after one of its verbs."""

    def __init__(self, backend: Backend, point: str, kill: Callable[[Any], None]) -> None:
        self._backend = backend
        self._point = point
        self._kill = kill
        self.conn: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def _after(self, point: str, conn: Any) -> None:
        if point == self._point:
            self._kill(conn)

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: Any) -> JobRecord | None:
        job = self._backend.get_next_job(conn, job_table, queue, now)
        self.conn = conn
        if job is not None:
            self._after("claim", conn)
        return job

    def archive_job(self, conn: Any, *args: Any) -> None:
        self._backend.archive_job(conn, *args)
        self._after("archive", conn)

    def archive_and_delete_job(self, conn: Any, *args: Any) -> None:
        self._backend.archive_and_delete_job(conn, *args)  # type: ignore[attr-defined]
        # The compact plan (ArchiveAndDelete) has no step between the two: both points come after it.
        self._after("archive", conn)
        self._after("delete", conn)

    # Batch mode's verbs (BatchClaim), killed at the same points, for a harness with a batch_size.

    def get_next_jobs(self, conn: Any, *args: Any) -> list[JobRecord]:
        jobs: list[JobRecord] = self._backend.get_next_jobs(conn, *args)  # type: ignore[attr-defined]
        self.conn = conn
        if jobs:
            self._after("claim", conn)
        return jobs

    def archive_jobs(self, conn: Any, *args: Any) -> None:
        self._backend.archive_jobs(conn, *args)  # type: ignore[attr-defined]
        self._after("archive", conn)

    def delete_jobs(self, conn: Any, *args: Any) -> None:
        self._backend.delete_jobs(conn, *args)  # type: ignore[attr-defined]
        self._after("delete", conn)

    def archive_and_delete_jobs(
        self, conn: Any, job_table: Any, archived_job_table: Any, job_ids: Any, *rest: Any
    ) -> None:
        combined = getattr(self._backend, "archive_and_delete_jobs", None)
        if combined is None:  # a compact plan for one job only: the batch's two statements, each killed after
            self.archive_jobs(conn, job_table, archived_job_table, job_ids, *rest)
            self.delete_jobs(conn, job_table, job_ids)
            return
        combined(conn, job_table, archived_job_table, job_ids, *rest)
        # As archive_and_delete_job: no step between the two, so both points come after it.
        self._after("archive", conn)
        self._after("delete", conn)

    def delete_job(self, conn: Any, *args: Any) -> None:
        self._backend.delete_job(conn, *args)
        self._after("delete", conn)

    def retry_at(self, conn: Any, *args: Any) -> None:
        self._backend.retry_at(conn, *args)
        self._after("retry", conn)


@dataclass(frozen=True, slots=True)
class _SameId:
    """The id strategy of the harness, made to hand out one id already taken: the INSERT must fail."""

    strategy: JobIdStrategy
    job_id: Any

    def generate_id(self) -> Any:
        return self.job_id

    def encode_id(self, job_id: Any) -> Any:
        return self.strategy.encode_id(job_id)

    def decode_id(self, value: Any) -> Any:
        return self.strategy.decode_id(value)


class SessionTests(SuiteBase):
    """What a backend owes a session: its own dies cleanly, the caller's is left as it was."""

    __test__ = False

    # -- K: a killed session ---------------------------------------------------------------------------

    def test_a_session_killed_inside_a_claim_transaction_commits_nothing_and_raises(
        self, harness: Harness
    ) -> None:
        """K1: a session killed at any step of a claim commits nothing, raises, and loses no job.

        The server ends the worker's session right after the claim, in the handler, between archive and
        delete, before the commit, or after retry_at. The backend must raise TransientDatabaseError (never
        go on in a new session, as a driver reconnecting by itself would: its archive and delete would then
        commit outside any claim), the job must be claimable again with its attempts unchanged, and in the
        end every job is archived exactly once.
        """
        need(harness, "sessions")
        ids = [str(self.enqueue_job(harness, EPOCH - timedelta(seconds=s))) for s in (3, 2, 1)]
        oldest = ids[0]
        backend = harness.backend()

        def kill(conn: Any) -> None:
            harness.kill_session(harness.session_of(conn))

        for point in KILL_POINTS:
            killing = _KillingBackend(backend, point, kill)

            def handler(job: Job, killing: _KillingBackend = killing, point: str = point) -> None:
                if point == "handler":
                    kill(killing.conn)
                if point == "retry":
                    raise RuntimeError("fails, to be retried")

            options: dict[str, Any] = {
                "handler_fn_mode": "advanced",
                "retry_strategy_fn": lambda job, exc: {"retries": 1, "delays": [1000]},
            }
            try:
                self.run_next(harness, ManualClock(EPOCH), handler, backend=killing, **options)
            except TransientDatabaseError:
                pass
            except Exception as exc:
                pytest.fail(
                    f"K1 ({point}): a killed session raised {type(exc).__name__}: {exc}; "
                    "expected proletarian_ref.errors.TransientDatabaseError"
                )
            else:
                pytest.fail(
                    f"K1 ({point}): the backend went on after its session was killed (a new session "
                    "wrote outside the claim) instead of raising TransientDatabaseError"
                )
            assert harness.archived_jobs() == [], f"K1 ({point}): the killed transaction's archive stayed"
            jobs = {self.key(harness, job.job_id): job for job in harness.jobs()}
            assert sorted(jobs) == sorted(ids), (
                f"K1 ({point}): the killed transaction changed the job table: {sorted(jobs)}, not {ids}"
            )
            held = jobs[oldest]
            assert held.attempts == 0, f"K1 ({point}): the killed job has attempts {held.attempts}, not 0"
            self.assert_instant(harness, held.process_at, EPOCH - timedelta(seconds=3), f"K1 ({point})")

        ran: list[str] = []
        while self.run_next(harness, ManualClock(EPOCH), lambda job_type, payload: ran.append(job_type)):
            assert len(ran) <= len(ids), f"K1: more runs than jobs after the kills ({len(ran)})"
        archived = [self.key(harness, row.job_id) for row in harness.archived_jobs()]
        assert sorted(archived) == sorted(ids), (
            f"K1: archived {sorted(archived)}, expected each of {ids} once"
        )
        for row in harness.archived_jobs():
            key = self.key(harness, row.job_id)
            assert row.attempts == 1, (
                f"K1: job {key} is archived with attempts {row.attempts}; expected 1: a killed transaction's "
                "retry_at or archive_job was counted"
            )
            assert row.status == STATUS_SUCCESS, (
                f"K1: archive_job wrote status {row.status!r} for job {key}, which succeeded; "
                f"expected {STATUS_SUCCESS!r}"
            )
        assert harness.jobs() == [], "K1: delete_job left archived jobs in the job table"

    # -- C: the caller's transaction and session -------------------------------------------------------

    def _enqueue_on(self, harness: Harness, conn: Any, **options: Any) -> Any:
        options.setdefault("job_id_strategy", harness.job_id_strategy())
        return enqueue(
            conn,
            "conformance/job",
            None,
            job_table=harness.job_table,
            clock=frozen(EPOCH),
            backend=harness.backend(),
            **{**harness.enqueue_options, **options},
        )

    def test_enqueue_leaves_the_callers_earlier_writes_uncommitted(self, harness: Harness) -> None:
        """C1: the caller's writes before and after enqueue stay uncommitted until the caller commits.

        No commit, explicit or implicit: MySQL commits an open transaction before DDL (CREATE TABLE IF NOT
        EXISTS), SET autocommit = 1, LOCK TABLES and the like, which leaves the job itself uncommitted.
        """
        need(harness, "caller_writes")
        conn = harness.connect()
        try:
            harness.caller_write(conn, 1)
            self._enqueue_on(harness, conn)
            assert harness.caller_markers() == [], "C1: enqueue committed the caller's earlier write"
            assert harness.jobs() == [], "C1: the job is visible before the caller committed"
            harness.caller_write(conn, 2)
            assert harness.caller_markers() == [], "C1: a write after enqueue was committed on its own"
            conn.commit()
        finally:
            conn.close()
        assert harness.caller_markers() == [1, 2], "C1: the caller's commit did not commit its writes"
        self.only_job(harness)

    def test_a_callers_rollback_removes_its_writes_and_the_job(self, harness: Harness) -> None:
        """C2: when the caller rolls back, neither its writes nor the job exist; the connection goes on."""
        need(harness, "caller_writes")
        conn = harness.connect()
        try:
            harness.caller_write(conn, 1)
            self._enqueue_on(harness, conn)
            harness.caller_write(conn, 2)
            conn.rollback()
            assert harness.caller_markers() == [], "C2: the caller rolled back, but its writes stayed"
            assert harness.jobs() == [], "C2: the caller rolled back, but the job stayed"
            harness.caller_write(conn, 3)
            self._enqueue_on(harness, conn)
            conn.commit()
        finally:
            conn.close()
        assert harness.caller_markers() == [3], "C2: the transaction after the rollback was not the caller's"
        self.only_job(harness)

    def test_after_an_enqueue_error_the_callers_transaction_is_usable_or_aborted(
        self, harness: Harness
    ) -> None:
        """C3: a failed enqueue leaves the caller's transaction going on or clearly aborted, never half-done.

        The enqueue fails on a duplicate job id. Then nothing of the caller's is committed; the caller's
        next write either joins its earlier one (both commit together) or fails (the transaction is
        aborted, and nothing commits). A backend that rolls back or commits on the caller's behalf fails.
        """
        need(harness, "caller_writes")
        strategy = harness.job_id_strategy()
        taken = self.enqueue_job(harness, EPOCH)
        conn = harness.connect()
        try:
            harness.caller_write(conn, 1)
            try:
                self._enqueue_on(harness, conn, job_id_strategy=_SameId(strategy, taken))
            except ProletarianError:
                pass
            else:
                pytest.fail("C3: enqueue accepted a job id that is already in the job table")
            assert harness.caller_markers() == [], "C3: a failed enqueue committed the caller's earlier write"
            try:
                harness.caller_write(conn, 2)
                went_on = True
            except Exception:  # an aborted transaction refuses it, which is allowed
                went_on = False
            # Committing an aborted transaction may fail; that is allowed, and what it left is checked below.
            with contextlib.suppress(Exception):
                conn.commit()
        finally:
            conn.close()
        markers = harness.caller_markers()
        if went_on:
            assert markers == [1, 2], (
                f"C3: the caller's transaction went on after the failed enqueue, yet committed {markers}, "
                "not [1, 2]: the backend ended the caller's transaction"
            )
        else:
            assert markers == [], f"C3: an aborted transaction committed {markers}"
        assert [self.key(harness, j.job_id) for j in harness.jobs()] == [str(taken)]

    def test_enqueue_leaves_the_callers_session_state_unchanged(self, harness: Harness) -> None:
        """C4: enqueue changes no session state: settings, time zone, isolation, autocommit, user variables.

        The caller's session runs in a time zone of its own (+05:30) when the harness can set one. Its
        state is read before and after an enqueue inside the caller's transaction, and after its commit.
        """
        need(harness, "sessions")
        caller = harness.zoned(CALLER_ZONE) if harness.supports("zones") else harness
        conn = caller.connect()
        try:
            if caller.supports("caller_writes"):
                caller.caller_write(conn, 1)  # so that the state is read inside an open transaction
            before = caller.session_state(conn)
            self._enqueue_on(caller, conn)
            after = caller.session_state(conn)
            conn.commit()
            committed = caller.session_state(conn)
        finally:
            conn.close()
            caller.close()
        for when, state in (("after enqueue", after), ("after the caller's commit", committed)):
            changed = {
                key: (before.get(key), state.get(key))
                for key in sorted(set(before) | set(state))
                if before.get(key) != state.get(key)
            }
            assert not changed, f"C4: the caller's session {when} differs (before, after): {changed}"
