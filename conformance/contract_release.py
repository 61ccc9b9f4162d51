"""The release clauses (release_connection): stop() gives a stuck handler's job back, and only that job (L1);
a job past the worker's job_timeout_ms is given back the same way and runs again exactly once (L2)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Final

import pytest

from conformance.agents import AgentPool
from conformance.base import SuiteBase, no_log
from conformance.capabilities import requires
from conformance.clocks import EPOCH, ManualClock
from conformance.harness import Harness
from conformance.protocols import NEEDS_RELEASE
from proletarian_ref.backend import STATUS_SUCCESS, JobRecord
from proletarian_ref.errors import ShutdownTimeoutError
from proletarian_ref.job import Job
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.tables import TableName
from proletarian_ref.worker import QueueWorker, create_queue_worker

STUCK: Final = "conformance/l-stuck"
BESIDE: Final = "conformance/l-beside"
# How long stop() waits for the stuck handler before it releases it: short, the handler never returns.
AWAIT_MS: Final = 100
# Bounds on the waits for a handler to start and for a worker thread to end once its handler returned.
STARTED_WITHIN_S: Final = 10.0
ENDED_WITHIN_S: Final = 10.0
# A released job must be claimable well before its handler returns, not at the same instant: a connection
# closed by its client is rolled back by the server on its own time (PostgreSQL's backend ends after the
# socket does), so another transaction may look a few milliseconds too soon under load.
RELEASED_WITHIN_S: Final = 5.0


class ReleaseTests(SuiteBase):
    """What a backend with release_connection owes QueueWorker.stop(): skipped, saying so, without it."""

    __test__ = False

    def _worker(
        self, harness: Harness, backend: Any, queue: str, handler: Any, name: str, **options: Any
    ) -> QueueWorker:
        return create_queue_worker(
            None,
            handler,
            backend=backend,
            queue=queue,
            queue_worker_id=name,
            job_table=harness.job_table,
            archived_job_table=harness.archived_job_table,
            job_id_strategy=harness.job_id_strategy(),
            handler_fn_mode="advanced",
            polling_interval_ms=10,
            worker_threads=1,
            await_termination_timeout_ms=AWAIT_MS,
            clock=ManualClock(EPOCH + timedelta(seconds=1)),
            log=no_log,
            **{**harness.worker_options, **options},
        )

    def _claim_both(
        self, harness: Harness, job_table: TableName, within_s: float, step: str
    ) -> tuple[JobRecord | None, JobRecord | None]:
        """The released job and the other worker's, claimed in one transaction of another backend and
        rolled back, tried again until the released one comes or `within_s` passes: (released, held)."""
        released: JobRecord | None = None
        held: JobRecord | None = None
        deadline = time.monotonic() + within_s
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            agent = pool.agent()
            while released is None and time.monotonic() < deadline:
                agent.begin()
                released, held = (
                    self.claim_in(
                        agent,
                        job_table,
                        to_keyword_text(queue, what="queue"),
                        EPOCH + timedelta(seconds=2),
                        step.format(queue),
                    )
                    for queue in (STUCK, BESIDE)
                )
                agent.rollback()
                if released is None:
                    time.sleep(0.01)
        return released, held

    @requires(NEEDS_RELEASE)
    def test_stop_releases_the_stuck_handlers_job_and_no_other(self, harness: Harness) -> None:
        """L1: stop() of a worker whose handler ignores it gives that job back at once, and only that job.

        Two workers share one backend, each running a handler that waits (one job each). Stopping the first
        raises ShutdownTimeoutError after its await time; then another transaction claims its job while the
        handler still waits (at once, allowing the server RELEASED_WITHIN_S to roll back a closed connection),
        attempts unchanged, while the second worker's job stays held. When the released handler finally
        returns nothing of it is written (no archive); the second worker's job is archived as usual.
        """
        job_table, _ = self.tables(harness)
        stuck_id = self.enqueue_job(harness, EPOCH, queue=STUCK)
        beside_id = self.enqueue_job(harness, EPOCH, queue=BESIDE)
        backend = harness.backend()
        started = {STUCK: threading.Event(), BESIDE: threading.Event()}
        go_on = {STUCK: threading.Event(), BESIDE: threading.Event()}

        def handler(job: Job) -> None:
            queue = STUCK if str(job.job_id) == str(stuck_id) else BESIDE
            started[queue].set()
            # Ignores stop(): waits for the test alone, within a bound so a broken run cannot hang.
            go_on[queue].wait(STARTED_WITHIN_S + ENDED_WITHIN_S)

        stuck = self._worker(harness, backend, STUCK, handler, "conformance-l1-stuck")
        beside = self._worker(harness, backend, BESIDE, handler, "conformance-l1-beside")
        stuck_thread: threading.Thread | None = None
        try:
            # One after the other: on InnoDB a batch claim of one queue can lock the record ending its scan,
            # the other queue's job (claim_locks_only_the_claimed_row), which that worker would then skip.
            for worker, queue in ((stuck, STUCK), (beside, BESIDE)):
                worker.start()
                assert started[queue].wait(STARTED_WITHIN_S), (
                    f"L1: the worker of {queue} did not start its job"
                )
            stuck_thread = next(t for t in threading.enumerate() if t.name == "conformance-l1-stuck-1")
            with pytest.raises(ShutdownTimeoutError):
                stuck.stop()
            released, held = self._claim_both(
                harness, job_table, RELEASED_WITHIN_S, "L1: claiming the job of {} after stop()"
            )
            assert released is not None, (
                "L1: after stop() released its stuck handler, no other transaction could claim its job "
                f"within {RELEASED_WITHIN_S:g} s while the handler still ran; expected it claimable at once "
                "(release_connection must roll back that thread's transaction)"
            )
            assert self.key(harness, released.job_id) == str(stuck_id) and released.attempts == 0, (
                f"L1: the released job came back as {released}; expected job {stuck_id} with attempts 0"
            )
            assert held is None, (
                "L1: stopping one worker released the job another worker on the same backend is still "
                "running (release_connection released another thread's transaction)"
            )
            go_on[STUCK].set()
            stuck_thread.join(ENDED_WITHIN_S)
            assert not stuck_thread.is_alive(), "L1: the released worker thread did not end after its handler"
            go_on[BESIDE].set()
            beside.stop()
        finally:
            for event in go_on.values():
                event.set()
            if stuck_thread is not None:
                stuck_thread.join(ENDED_WITHIN_S)
            beside.stop()
        archived = [self.key(harness, row.job_id) for row in harness.archived_jobs()]
        assert archived == [str(beside_id)], (
            f"L1: archived {archived}; expected only the other worker's job {beside_id} (a released "
            "handler that returns must write nothing: its transaction is gone)"
        )
        assert all(row.status == STATUS_SUCCESS for row in harness.archived_jobs())
        left = self.only_job(harness)
        assert (self.key(harness, left.job_id), left.attempts) == (str(stuck_id), 0), (
            f"L1: the released job is left as {left}; expected job {stuck_id}, attempts 0"
        )

    @requires(NEEDS_RELEASE)
    def test_a_job_past_its_timeout_is_given_back_and_runs_again_exactly_once(self, harness: Harness) -> None:
        """L2: a job whose handler outlasts job_timeout_ms and its grace is given back, and runs again once.

        Two workers share one backend. The first has job_timeout_ms and a handler that ignores the bound on
        its first run; past the grace its job is claimable by another transaction at once, attempts
        unchanged, while the second worker's running job stays held. When the late handler returns nothing
        of it is written, and the same worker runs the job again, once, and archives it (attempts 1).
        """
        job_table, _ = self.tables(harness)
        beside_id = self.enqueue_job(harness, EPOCH, queue=BESIDE)
        stuck_id: Any = None
        backend = harness.backend()
        started = {STUCK: threading.Event(), BESIDE: threading.Event()}
        go_on = {STUCK: threading.Event(), BESIDE: threading.Event()}
        runs: list[str] = []

        def handler(job: Job) -> None:
            queue = STUCK if str(job.job_id) == str(stuck_id) else BESIDE
            runs.append(queue)
            if runs.count(queue) > 1:
                return
            started[queue].set()
            go_on[queue].wait(STARTED_WITHIN_S + ENDED_WITHIN_S)  # ignores the bound

        timed = self._worker(
            harness,
            backend,
            STUCK,
            handler,
            "conformance-l2-timed",
            job_timeout_ms=AWAIT_MS,
            job_timeout_grace_ms=AWAIT_MS,
        )
        beside = self._worker(harness, backend, BESIDE, handler, "conformance-l2-beside")
        try:
            # The other worker's job claimed before this one exists: on InnoDB a batch claim can lock the
            # record ending its scan (claim_locks_only_the_claimed_row), which would hold the job given back.
            for worker, queue in ((beside, BESIDE), (timed, STUCK)):
                if queue == STUCK:
                    stuck_id = self.enqueue_job(harness, EPOCH, queue=STUCK)
                worker.start()
                assert started[queue].wait(STARTED_WITHIN_S), (
                    f"L2: the worker of {queue} did not start its job"
                )
            released, held = self._claim_both(
                harness, job_table, STARTED_WITHIN_S, "L2: claiming the job of {} past its bound"
            )
            assert released is not None, (
                "L2: a job whose handler outlasted job_timeout_ms and its grace stayed held; expected it "
                "claimable by another transaction (its transaction ended, rolled back by the server)"
            )
            assert self.key(harness, released.job_id) == str(stuck_id) and released.attempts == 0, (
                f"L2: the timed-out job came back as {released}; expected job {stuck_id} with attempts 0"
            )
            assert held is None, (
                "L2: ending a timed-out job's transaction released the job another worker on the same "
                "backend is running"
            )
            go_on[STUCK].set()
            deadline = time.monotonic() + ENDED_WITHIN_S
            while time.monotonic() < deadline and not any(
                self.key(harness, row.job_id) == str(stuck_id) for row in harness.archived_jobs()
            ):
                time.sleep(0.02)
            go_on[BESIDE].set()
        finally:
            for event in go_on.values():
                event.set()
            timed.stop()
            beside.stop()
        archived = sorted(
            (self.key(harness, row.job_id), row.attempts, row.status) for row in harness.archived_jobs()
        )
        assert archived == sorted(
            [(str(stuck_id), 1, STATUS_SUCCESS), (str(beside_id), 1, STATUS_SUCCESS)]
        ), (
            f"L2: archived {archived}; expected each job once, attempts 1 (the late handler writes nothing, "
            "the job's second run is its one archived attempt)"
        )
        assert sorted(runs) == sorted([STUCK, STUCK, BESIDE]), (
            f"L2: the handlers ran {runs}; expected the timed-out job twice (once past its bound, once "
            "again) and the other once"
        )
