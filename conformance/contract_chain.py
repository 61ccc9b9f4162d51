"""The chained-claim clauses (ChainedClaim): a finished job commits before the next claim, which holds its
lock in a transaction of its own (J1-J4); batch mode's chain (ChainedBatchClaim) likewise a batch (J5-J7)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Final, cast

import pytest

from conformance.agents import AgentPool
from conformance.base import SuiteBase, no_log
from conformance.capabilities import requires
from conformance.clocks import EPOCH, ManualClock
from conformance.harness import Harness
from conformance.protocols import NEEDS_CHAINED_BATCH_CLAIM, NEEDS_CHAINED_CLAIM
from proletarian_ref.backend import STATUS_SUCCESS, BatchClaim, ChainedBatchClaim, ChainedClaim
from proletarian_ref.interrupts import interrupted
from proletarian_ref.job import Job
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.worker import create_queue_worker

QUEUE: Final = "conformance/chain"
# The clock the claims run at: every job the clauses enqueue is due by then.
NOW: Final = EPOCH + timedelta(minutes=1)
JOBS: Final = 3
# Batch mode's chain: jobs a batch, and the jobs J5 and J7 enqueue (two whole batches and a partial one).
BATCH: Final = 2
BATCH_JOBS: Final = 5
WITHIN_S: Final = 30.0


class _Planted(Exception):
    """A failure the clause raises inside a chained transaction, to see what its rollback undoes."""


class ChainedClaimTests(SuiteBase):
    """What a backend with ChainedClaim (chained_claims True) owes the worker: skipped, saying so, without."""

    __test__ = False

    def _enqueue_three(self, harness: Harness, count: int = JOBS) -> list[str]:
        """Three (or `count`) jobs of QUEUE, oldest first a second apart: the order every claim must take."""
        return [
            str(self.enqueue_job(harness, EPOCH + timedelta(seconds=n), queue=QUEUE, payload={"n": n}))
            for n in range(count)
        ]

    def _archived(self, harness: Harness) -> list[str]:
        return sorted(self.key(harness, row.job_id) for row in harness.archived_jobs())

    def _queued(self, harness: Harness) -> list[tuple[str, int]]:
        return sorted((self.key(harness, row.job_id), row.attempts) for row in harness.jobs())

    def _chain_worker(self, harness: Harness, backend: Any, handler: Any, batch_size: int = 1) -> Any:
        return create_queue_worker(
            None,
            handler,
            backend=backend,
            queue=QUEUE,
            job_table=harness.job_table,
            archived_job_table=harness.archived_job_table,
            job_id_strategy=harness.job_id_strategy(),
            handler_fn_mode="advanced",
            polling_interval_ms=10,
            worker_threads=1,
            clock=ManualClock(NOW),
            log=no_log,
            batch_size=batch_size,
            **harness.worker_options,
        )

    def _committed_and_locked(
        self, harness: Harness, clause: str, call: str, archived: list[str], unlocked: str
    ) -> None:
        """J2 and J6, inside the chained transaction `call` began: another connection sees `archived` at
        once, and another transaction's claim gets `unlocked`, past the jobs `call` returned and locked."""
        job_table, _ = self.tables(harness)
        queue = to_keyword_text(QUEUE, what="queue")
        assert self._archived(harness) == archived, (
            f"{clause}: after {call} another connection saw archived {self._archived(harness)}; expected "
            f"{archived}: the finished transaction must be committed before it returns"
        )
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            agent = pool.agent()
            agent.begin()
            other = self.claim_in(agent, job_table, queue, NOW, f"{clause}: another transaction's claim")
            agent.rollback()
        assert other is not None and self.key(harness, other.job_id) == unlocked, (
            f"{clause}: while the chained transaction was open another transaction claimed {other}; "
            f"expected job {unlocked}: what {call} returned must stay locked until its transaction ends"
        )

    def _commits_in_turn(self, harness: Harness, clause: str, count: int, batch_size: int) -> None:
        """J1 and J5: one worker thread, `batch_size` jobs a transaction, runs `count` due jobs. From each
        handler, the committed rows read on another connection show every job of the earlier transactions
        archived and gone, this transaction's and the later ones queued; each job runs and is archived once,
        oldest first."""
        ids = self._enqueue_three(harness, count)
        seen: list[tuple[str, list[str], list[str]]] = []
        done = threading.Event()
        claim = "commit_and_get_next_job" if batch_size == 1 else "commit_and_get_next_jobs"

        def handler(job: Job) -> None:
            seen.append(
                (
                    str(job.job_id),  # a handler's Job carries the decoded id, not the stored one
                    self._archived(harness),
                    [key for key, _ in self._queued(harness)],
                )
            )
            if len(seen) == count:
                done.set()

        backend = harness.backend()
        worker = self._chain_worker(harness, backend, handler, batch_size=batch_size)
        worker.start()
        try:
            assert done.wait(WITHIN_S), f"{clause}: ran {len(seen)} of {count} jobs within {WITHIN_S:.0f} s"
        finally:
            worker.stop()
        assert [job for job, _, _ in seen] == ids, (
            f"{clause}: the worker ran {[job for job, _, _ in seen]}; expected each job once, oldest first: "
            f"{ids}"
        )
        for n, (job, archived, queued) in enumerate(seen):
            before = n - n % batch_size  # the jobs of the transactions before this job's
            assert archived == sorted(ids[:before]) and queued == sorted(ids[before:]), (
                f"{clause}: while job {job} ran, another connection saw archived {archived} and queued "
                f"{queued}; expected archived {sorted(ids[:before])} and queued {sorted(ids[before:])} "
                f"({claim} must commit what finished before it claims again)"
            )
        assert self._archived(harness) == sorted(ids) and self._queued(harness) == [], (
            f"{clause}: archived {self._archived(harness)}, queued {self._queued(harness)}; expected every "
            "job archived once and none queued"
        )
        assert {row.status for row in harness.archived_jobs()} == {STATUS_SUCCESS}

    def _stop_after_first(self, harness: Harness, clause: str, count: int, batch_size: int) -> None:
        """J4 and J7: one worker thread, `batch_size` jobs a transaction, `count` due jobs. The handler of
        the first transaction's last job starts stop() from another thread and returns once stop has begun:
        that transaction's jobs are archived, the later ones never started and stay queued, attempts 0."""
        ids = self._enqueue_three(harness, count)
        first = ids[:batch_size]
        ran: list[str] = []
        stopper: list[threading.Thread] = []
        backend = harness.backend()

        def handler(job: Job) -> None:
            ran.append(str(job.job_id))  # decoded already, as above
            if len(ran) == batch_size:
                thread = threading.Thread(target=worker.stop, name=f"conformance-{clause.lower()}-stop")
                thread.start()
                stopper.append(thread)  # started: the test joins it
                # stop() tells the running handler before it waits for it: then return, a success.
                deadline = time.monotonic() + WITHIN_S
                while not interrupted() and time.monotonic() < deadline:
                    time.sleep(0.005)
                assert interrupted(), f"{clause}: stop() did not begin"

        worker = self._chain_worker(harness, backend, handler, batch_size=batch_size)
        worker.start()
        try:
            deadline = time.monotonic() + WITHIN_S
            while not stopper and time.monotonic() < deadline:
                time.sleep(0.01)
            assert stopper, f"{clause}: the worker did not finish its first transaction's jobs"
            stopper[0].join(WITHIN_S)
        finally:
            worker.stop()
        assert ran == first, f"{clause}: handlers ran for {ran}; expected only the first ones {first}"
        assert self._archived(harness) == sorted(first), (
            f"{clause}: archived {self._archived(harness)}; expected {sorted(first)}, the jobs that ran"
        )
        assert self._queued(harness) == sorted((key, 0) for key in ids[batch_size:]), (
            f"{clause}: the job table holds {self._queued(harness)}; expected {ids[batch_size:]} untouched, "
            "attempts 0 (no claim starts once stop() has begun, and a claim racing it goes back)"
        )

    @requires(NEEDS_CHAINED_CLAIM)
    def test_each_job_of_a_chain_commits_before_the_next_handler_runs(self, harness: Harness) -> None:
        """J1: a worker on a chained backend commits each job before the next job's handler runs.

        One worker thread runs three due jobs. From each handler, the committed rows read on another
        connection show every earlier job archived and gone from the job table, and this job and the later
        ones still queued; in the end each job ran once and is archived once.
        """
        self._commits_in_turn(harness, "J1", JOBS, 1)

    @requires(NEEDS_CHAINED_CLAIM)
    def test_commit_and_get_next_job_commits_then_locks_the_next_job_in_a_new_transaction(
        self, harness: Harness
    ) -> None:
        """J2: commit_and_get_next_job commits, then claims the oldest due job and holds its lock.

        In one transaction() block: claim A, archive and delete it, then commit_and_get_next_job returns B.
        Another connection sees A archived at once; another transaction claims C, not B (B is locked); once
        the block ends, B is claimable again, attempts unchanged, and nothing of B was written.
        """
        job_table, archived_table = self.tables(harness)
        a, b, c = self._enqueue_three(harness)
        queue = to_keyword_text(QUEUE, what="queue")
        backend = harness.backend()
        with backend.transaction() as conn:
            first = backend.get_next_job(conn, job_table, queue, NOW)
            assert first is not None and self.key(harness, first.job_id) == a, (
                f"J2: the first claim returned {first}; expected job {a}"
            )
            backend.archive_job(conn, job_table, archived_table, first.job_id, STATUS_SUCCESS, NOW)
            backend.delete_job(conn, job_table, first.job_id)
            chained = cast(ChainedClaim, backend).commit_and_get_next_job(conn, job_table, queue, NOW)
            assert chained is not None and self.key(harness, chained.job_id) == b, (
                f"J2: commit_and_get_next_job returned {chained}; expected the oldest due job {b}"
            )
            self._committed_and_locked(harness, "J2", "commit_and_get_next_job", [a], c)
        assert self._queued(harness) == sorted([(b, 0), (c, 0)]), (
            f"J2: after the block the job table holds {self._queued(harness)}; expected {b} and {c} with "
            "attempts 0"
        )
        assert self._archived(harness) == [a]

    @requires(NEEDS_CHAINED_CLAIM)
    def test_an_error_after_a_chained_claim_rolls_back_that_transaction_only(self, harness: Harness) -> None:
        """J3: an error after commit_and_get_next_job undoes the new transaction only.

        Claim A, archive and delete it, chain to B and write B's retry; then the block raises. A stays
        archived (its transaction had committed), B is queued again with its attempts and due time as
        before, and a claim finds it at once.
        """
        job_table, archived_table = self.tables(harness)
        a, b, c = self._enqueue_three(harness)
        queue = to_keyword_text(QUEUE, what="queue")
        backend = harness.backend()
        with pytest.raises(_Planted), backend.transaction() as conn:
            first = backend.get_next_job(conn, job_table, queue, NOW)
            assert first is not None
            backend.archive_job(conn, job_table, archived_table, first.job_id, STATUS_SUCCESS, NOW)
            backend.delete_job(conn, job_table, first.job_id)
            chained = cast(ChainedClaim, backend).commit_and_get_next_job(conn, job_table, queue, NOW)
            assert chained is not None
            backend.retry_at(conn, job_table, chained.job_id, NOW + timedelta(days=1))
            raise _Planted("J3 rolls the chained transaction back")
        assert self._archived(harness) == [a], (
            f"J3: after the chained transaction rolled back, archived {self._archived(harness)}; expected "
            f"[{a}]: the job finished before the chain was committed and must stay archived"
        )
        assert self._queued(harness) == sorted([(b, 0), (c, 0)]), (
            f"J3: after the rollback the job table holds {self._queued(harness)}; expected {b} and {c} "
            "with attempts 0 (the chained transaction's retry rolled back)"
        )
        with backend.transaction() as conn:
            again = backend.get_next_job(conn, job_table, queue, NOW)
        assert again is not None and self.key(harness, again.job_id) == b, (
            f"J3: the next claim returned {again}; expected job {b}, unlocked and due as before"
        )

    @requires(NEEDS_CHAINED_CLAIM)
    def test_stop_during_a_chain_starts_no_further_job(self, harness: Harness) -> None:
        """J4: once stop() begins, a chained worker starts no further handler.

        The first job's handler starts stop() from another thread and returns once stop has begun. That
        job is archived; the later jobs were never started and stay queued, attempts 0.
        """
        self._stop_after_first(harness, "J4", JOBS, 1)

    @requires(NEEDS_CHAINED_BATCH_CLAIM)
    def test_each_batch_of_a_chain_commits_before_the_next_batch_runs(self, harness: Harness) -> None:
        """J5: a batch-mode worker on a chained backend commits each batch before the next batch's handlers.

        One worker thread, two jobs a batch, five due jobs. From each handler, the committed rows read on
        another connection show every job of the earlier batches archived and gone, and the jobs of this
        batch and the later ones still queued; in the end each job ran once and is archived once.
        """
        self._commits_in_turn(harness, "J5", BATCH_JOBS, BATCH)

    @requires(NEEDS_CHAINED_BATCH_CLAIM)
    def test_commit_and_get_next_jobs_commits_then_locks_the_next_batch_in_a_new_transaction(
        self, harness: Harness
    ) -> None:
        """J6: commit_and_get_next_jobs commits, then claims up to its limit of the oldest due jobs and holds
        their locks.

        In one transaction() block: claim A (limit 1), archive and delete it, then commit_and_get_next_jobs
        with limit 2 returns B and C. Another connection sees A archived at once; another transaction claims
        D, not B or C (they are locked); once the block ends, B, C and D are queued, attempts unchanged.
        """
        job_table, archived_table = self.tables(harness)
        a, b, c, d = self._enqueue_three(harness, 4)
        queue = to_keyword_text(QUEUE, what="queue")
        backend = harness.backend()
        claim = cast(BatchClaim, backend)
        with backend.transaction() as conn:
            first = claim.get_next_jobs(conn, job_table, queue, NOW, 1)
            assert [self.key(harness, job.job_id) for job in first] == [a], (
                f"J6: the first claim returned {first}; expected job {a}"
            )
            finished = [first[0].job_id]
            claim.archive_jobs(conn, job_table, archived_table, finished, STATUS_SUCCESS, NOW)
            claim.delete_jobs(conn, job_table, finished)
            chained = cast(ChainedBatchClaim, backend).commit_and_get_next_jobs(
                conn, job_table, queue, NOW, 2
            )
            got = [self.key(harness, job.job_id) for job in chained]
            assert got == [b, c], (
                f"J6: commit_and_get_next_jobs(limit=2) returned {got}; expected the two oldest due jobs "
                f"{[b, c]}"
            )
            self._committed_and_locked(harness, "J6", "commit_and_get_next_jobs", [a], d)
        assert self._queued(harness) == sorted([(b, 0), (c, 0), (d, 0)]), (
            f"J6: after the block the job table holds {self._queued(harness)}; expected {b}, {c} and {d} "
            "with attempts 0"
        )
        assert self._archived(harness) == [a]

    @requires(NEEDS_CHAINED_BATCH_CLAIM)
    def test_stop_during_a_chained_batch_claims_no_further_batch(self, harness: Harness) -> None:
        """J7: once stop() begins, a chained batch-mode worker claims and starts no further batch.

        Two jobs a batch: the second job's handler, the first batch's last, starts stop() from another
        thread and returns once stop has begun. The first batch is archived whole; the later jobs were
        never started and stay queued, attempts 0.
        """
        self._stop_after_first(harness, "J7", BATCH_JOBS, BATCH)
