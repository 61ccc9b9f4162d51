"""The conformance suite's own machinery: collection, capability needs, loading, and the invariant checker."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest

from conformance import BackendSuite, Harness, drain, load_harness, requires
from conformance.capabilities import unmet_need
from conformance.clocks import EPOCH, VirtualClock
from conformance.workload import (
    Call,
    Enqueued,
    Outcome,
    PlannedJob,
    Recorder,
    Script,
    Workload,
    check_outcome,
)
from proletarian_ref.backend import STATUS_FAILURE, STATUS_SUCCESS, ArchivedJobRecord, Capabilities, JobRecord
from proletarian_ref.job_ids import PostgresqlUuidStrategy

QUEUE = "conformance/q"


def test_importing_the_suite_imports_no_database_driver() -> None:
    code = (
        "import sys, conformance, conformance.suite, conformance.builtin;"
        "loaded = {'psycopg', 'psycopg2', 'pymysql', 'psycopg_pool'} & set(sys.modules);"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_base_class_is_not_collected_and_a_subclass_is() -> None:
    class TestSomething(BackendSuite):
        pass

    assert BackendSuite.__dict__["__test__"] is False
    assert TestSomething.__test__ is True


def test_requires_refuses_a_capability_that_does_not_exist() -> None:
    with pytest.raises(TypeError, match="unknown capabilities"):
        requires(teleports=True)


def test_an_unmet_need_names_the_backend_and_the_capability() -> None:
    @requires(multi_process=True)
    def needs_processes() -> None:
        return None

    memory = load_harness("conformance.builtin:memory")
    assert unmet_need(needs_processes, memory) == (
        "memory: capabilities.multi_process is False; this test needs True"
    )


def test_load_harness_remembers_how_to_build_the_same_harness_again() -> None:
    harness = load_harness("conformance.builtin:memory", job_table="x.job", archived_job_table="x.archived")
    assert harness.factory is not None
    again = harness.factory.load()
    assert isinstance(again, Harness)
    assert (again.job_table, again.archived_job_table) == ("x.job", "x.archived")


@pytest.mark.parametrize("spec", ["conformance.builtin", "conformance.builtin:nothing", ":memory"])
def test_load_harness_refuses_a_bad_factory_name(spec: str) -> None:
    with pytest.raises(ValueError, match=r"factory|callable"):
        load_harness(spec)


# -- the invariant checker, on outcomes made up by hand -----------------------------------------------


def _one_job_outcome(calls: list[Call], archived_attempts: int = 1) -> tuple[Outcome, Workload]:
    job_id = uuid.UUID(int=7)
    plan = PlannedJob(QUEUE, "a/b", None, "now", timedelta(0), Script(0, 0, 0, 0))
    entry = Enqueued(job_id, str(job_id), plan, '["~#\'",null]', EPOCH, EPOCH)
    archived = ArchivedJobRecord(
        job_id,
        ":conformance/q",
        ":a/b",
        entry.payload_text,
        archived_attempts,
        STATUS_SUCCESS,
        EPOCH,
        EPOCH,
        EPOCH,
    )
    stored = JobRecord(job_id, ":conformance/q", ":a/b", entry.payload_text, 0, EPOCH, EPOCH)
    outcome = Outcome([entry], [stored], calls, [], True, [], [archived])
    return outcome, Workload((plan,), {QUEUE: (1,)})


def _call(attempt: int, start_ns: int, end_ns: int, started: timedelta = timedelta(0)) -> Call:
    return Call(
        str(uuid.UUID(int=7)), "w", QUEUE, QUEUE, attempt, EPOCH, EPOCH + started, EPOCH, start_ns, end_ns
    )


def _check(outcome: Outcome, workload: Workload) -> list[str]:
    return check_outcome(outcome, workload, PostgresqlUuidStrategy(), Capabilities().time_precision)


def test_the_checker_accepts_a_job_that_ran_once_as_planned() -> None:
    assert _check(*_one_job_outcome([_call(1, 0, 10)])) == []


def test_the_checker_reports_two_overlapping_runs_of_one_job() -> None:
    problems = _check(*_one_job_outcome([_call(1, 0, 10), _call(2, 5, 15)]))
    assert any(p.startswith("P-overlap") for p in problems)
    assert any(p.startswith("P-runs") for p in problems)


def test_the_checker_reports_a_run_before_process_at() -> None:
    problems = _check(*_one_job_outcome([_call(1, 0, 10, started=-timedelta(seconds=1))]))
    assert [p for p in problems if p.startswith("P-early")]


def test_the_checker_reports_a_wrong_archived_attempt_count() -> None:
    problems = _check(*_one_job_outcome([_call(1, 0, 10)], archived_attempts=2))
    assert [p for p in problems if p.startswith("P-status")]


def test_the_checker_reports_a_job_that_was_never_archived() -> None:
    outcome, workload = _one_job_outcome([_call(1, 0, 10)])
    outcome.archived = []
    assert [p for p in _check(outcome, workload) if p.startswith("P-lost")]


# -- the drain itself ------------------------------------------------------------------------------------


class _ReportThenStall(Recorder):
    """A recorder whose handler thread loses the CPU right after reporting a call, as under load."""

    def call(self, call: Call) -> None:
        super().call(call)
        time.sleep(0.3)


def test_the_drain_lets_the_last_jobs_failure_be_written_before_it_stops_the_workers(
    db: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last planned call is a failure with no retry left: it must be archived as failed. Stopping the
    # workers as soon as the call is reported made stop() give the job back untouched (and a second worker,
    # not yet stopped, could run it again): P-lost, or a job run twice, with no fault of the backend's.
    monkeypatch.setattr(drain, "Recorder", _ReportThenStall)
    plan = PlannedJob(QUEUE, "a/b", None, "now", timedelta(0), Script(1, 0, 0, 0))
    workload = Workload((plan,), {QUEUE: (1, 1)})
    outcome = drain.drain_in_threads(db, workload, VirtualClock.start(speed=600.0))
    assert check_outcome(outcome, workload, db.job_id_strategy(), db.capabilities.time_precision) == []
    assert [(row.status, row.attempts) for row in outcome.archived] == [(STATUS_FAILURE, 1)]
