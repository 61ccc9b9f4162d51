"""Handler transaction clauses (H): a handler's writes in the job's transaction commit with its archive."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

import pytest

from conformance.base import SuiteBase
from conformance.capabilities import requires
from conformance.clocks import EPOCH, ManualClock
from conformance.harness import Harness
from conformance.sessions import _KillingBackend, need
from proletarian_ref import current_job
from proletarian_ref.backend import STATUS_FAILURE, STATUS_SUCCESS
from proletarian_ref.errors import JobTransactionError, TransientDatabaseError
from proletarian_ref.job import Job

# Where H1 kills the worker's session: in the handler right after it took the connection (the savepoint),
# after its write, after its follow-up enqueue; then between archive and delete, before the commit, and
# after a failed attempt's retry_at.
HANDLER_KILL_POINTS: Final = ("savepoint", "write", "enqueue", "archive", "delete", "retry")
FOLLOW_UP: Final = "conformance/follow-up"
# Follow-up jobs are due a day after the clause's clock, so no poll of the clause runs them.
FOLLOW_UP_DELAY: Final = timedelta(days=1)


class HandlerTransactionTests(SuiteBase):
    """What a backend owes a handler that writes in the job's transaction (current_job().connection())."""

    __test__ = False

    @staticmethod
    def _write_and_follow_up(harness: Harness, job: Job) -> None:
        tx = current_job()
        harness.caller_write(tx.connection(), int(job.payload))
        tx.enqueue(FOLLOW_UP, job.payload, process_in=FOLLOW_UP_DELAY)

    @requires(handler_transaction=True)
    def test_a_session_killed_around_a_handlers_writes_leaves_both_or_neither(self, harness: Harness) -> None:
        """H1: a kill at any point leaves the handler's writes and the job's archive row both, or neither.

        The handler writes a row and enqueues a follow-up job in the job's transaction. The server ends the
        worker's session right after the handler took the connection, after its write, after its enqueue,
        between archive and delete, before the commit, or after a failed attempt's retry_at. Each time the
        backend raises TransientDatabaseError and neither the write, the follow-up nor the archive row is
        committed; the job is back in the queue with attempts unchanged. In the end each job ran once:
        its write, its follow-up and its archive row committed together, exactly once.
        """
        need(harness, "sessions")
        need(harness, "caller_writes")
        ids = [str(self.enqueue_job(harness, EPOCH - timedelta(seconds=s), payload=s)) for s in (3, 2, 1)]
        backend = harness.backend()

        def kill(conn: Any) -> None:
            harness.kill_session(harness.session_of(conn))

        for point in HANDLER_KILL_POINTS:
            killing = _KillingBackend(backend, point, kill)

            def handler(job: Job, killing: _KillingBackend = killing, point: str = point) -> None:
                tx = current_job()
                conn = tx.connection()
                if point == "savepoint":
                    kill(killing.conn)
                harness.caller_write(conn, int(job.payload))
                if point == "write":
                    kill(killing.conn)
                tx.enqueue(FOLLOW_UP, job.payload, process_in=FOLLOW_UP_DELAY)
                if point == "enqueue":
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
                    f"H1 ({point}): a killed session raised {type(exc).__name__}: {exc}; "
                    "expected proletarian_ref.errors.TransientDatabaseError"
                )
            else:
                pytest.fail(f"H1 ({point}): the worker went on after its session was killed")
            markers = harness.caller_markers()
            assert markers == [], f"H1 ({point}): the handler's write {markers} committed without its job"
            assert harness.archived_jobs() == [], f"H1 ({point}): the killed transaction's archive stayed"
            jobs = {self.key(harness, job.job_id): job for job in harness.jobs()}
            assert sorted(jobs) == sorted(ids), (
                f"H1 ({point}): the job table holds {sorted(jobs)}, not {sorted(ids)}: the handler's "
                "follow-up job committed without its job, or the job was changed"
            )
            assert all(job.attempts == 0 for job in jobs.values()), (
                f"H1 ({point}): a killed job's attempts changed: {[job.attempts for job in jobs.values()]}"
            )

        def finish(job: Job) -> None:
            self._write_and_follow_up(harness, job)

        ran = 0
        while self.run_next(harness, ManualClock(EPOCH), finish, handler_fn_mode="advanced"):
            ran += 1
            assert ran <= len(ids), f"H1: more runs than jobs after the kills ({ran})"
        assert harness.caller_markers() == [1, 2, 3], (
            f"H1: the handlers' writes are {harness.caller_markers()}, not [1, 2, 3] once each"
        )
        archived = harness.archived_jobs()
        assert sorted(self.key(harness, row.job_id) for row in archived) == sorted(ids), (
            "H1: every job is archived exactly once in the end"
        )
        assert all(row.status == STATUS_SUCCESS and row.attempts == 1 for row in archived), (
            f"H1: archived {[(row.status, row.attempts) for row in archived]}, expected :success, attempts 1"
        )
        follow_ups = harness.jobs()
        assert sorted(job.job_type for job in follow_ups) == [f":{FOLLOW_UP}"] * 3, (
            f"H1: the follow-up jobs are {[job.job_type for job in follow_ups]}: one per job expected"
        )

    @requires(handler_transaction=True)
    def test_a_failed_retried_or_refused_handlers_writes_roll_back_alone(self, harness: Harness) -> None:
        """H2: a failing handler's writes and follow-ups roll back; its failure or retry still commits.

        Three jobs whose handlers write and enqueue a follow-up, then: raise with no retries left (archived
        as :failure, failed_job_fn called once outside any current_job()), raise with a retry left (attempts
        1, due again), and call commit() on the job's connection, which must be refused with
        JobTransactionError and fail the job. None of their writes or follow-ups commits.
        """
        need(harness, "caller_writes")
        failures: list[tuple[str, str]] = []

        def failed_job_fn(job: Job, exc: BaseException) -> None:
            try:
                current_job()
                inside = "inside"
            except JobTransactionError:
                inside = "outside"
            failures.append((type(exc).__name__, inside))

        def handler(job: Job) -> None:
            self._write_and_follow_up(harness, job)
            if job.payload == 3:
                current_job().connection().commit()
            raise RuntimeError("fails after writing")

        def retries(job: Job, exc: BaseException) -> Any:
            return {"retries": 1, "delays": [60_000]} if job.payload == 2 else None

        ids = {s: str(self.enqueue_job(harness, EPOCH - timedelta(seconds=s), payload=s)) for s in (3, 2, 1)}
        options: dict[str, Any] = {
            "handler_fn_mode": "advanced",
            "retry_strategy_fn": retries,
            "failed_job_fn": failed_job_fn,
        }
        polls = 0
        while self.run_next(harness, ManualClock(EPOCH), handler, **options) is not None:
            polls += 1  # one a job, or one a batch in batch mode
            assert polls <= len(ids), f"H2: more polls with a job than jobs ({polls})"
        assert harness.caller_markers() == [], (
            f"H2: failed handlers' writes {harness.caller_markers()} committed; the job's savepoint must "
            "roll them back"
        )
        archived = {self.key(harness, row.job_id): row for row in harness.archived_jobs()}
        assert sorted(archived) == sorted([ids[1], ids[3]]), f"H2: archived {sorted(archived)}"
        assert all(row.status == STATUS_FAILURE for row in archived.values()), "H2: not archived as :failure"
        [retried] = harness.jobs()
        assert self.key(harness, retried.job_id) == ids[2] and retried.attempts == 1, (
            f"H2: the job table holds {harness.jobs()}: expected only the retried job, attempts 1, and no "
            "follow-up job"
        )
        assert sorted(failures) == [("JobTransactionError", "outside"), ("RuntimeError", "outside")], (
            f"H2: failed_job_fn saw {failures}: the refused commit must fail its job with JobTransactionError"
        )
