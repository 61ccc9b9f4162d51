"""Batch mode's clauses (BatchClaim): get_next_jobs alone and concurrently, and one savepoint per job."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final, cast

import pytest

from conformance.agents import AgentPool, TxAgent
from conformance.base import SuiteBase
from conformance.capabilities import requires
from conformance.clocks import EPOCH, ManualClock
from conformance.contract import Abort
from conformance.harness import Harness
from conformance.protocols import NEEDS_BATCH_CLAIM
from proletarian_ref.backend import STATUS_SUCCESS, BatchClaim, JobRecord
from proletarian_ref.errors import FailedJobFnError
from proletarian_ref.job import Job, default_serializer
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.tables import TableName

QUEUE: Final = "conformance/g"
QUEUE_TEXT: Final = to_keyword_text(QUEUE, what="queue")
OTHER_QUEUE: Final = "conformance/g-other"
# Seconds after EPOCH, each job's process_at and payload: distinct (no ties to order by luck) and inserted
# in an order far from process_at order, so that reading the table in insertion (heap) order is wrong.
OFFSETS: Final = (40, 35, 30, 25, 5, 20, 15, 10, 45, 50, 1, 55)
# The claims' now: every offset up to 50 is due, 55 is not.
NOW: Final = EPOCH + timedelta(seconds=50)
DUE: Final = tuple(sorted(o for o in OFFSETS if EPOCH + timedelta(seconds=o) <= NOW))


def _offsets(jobs: list[JobRecord]) -> list[int]:
    serializer = default_serializer()
    return [int(serializer.decode(job.payload)) for job in jobs]


class BatchClaimTests(SuiteBase):
    """What a backend with BatchClaim (the worker's batch mode) owes: skipped, saying so, without it."""

    __test__ = False

    def _enqueue_offsets(self, harness: Harness, offsets: tuple[int, ...] = OFFSETS) -> dict[int, str]:
        """One job of QUEUE per offset, in the order given; older jobs of another queue. Offset -> job key."""
        keys = {
            offset: str(
                self.enqueue_job(
                    harness, EPOCH, queue=QUEUE, process_at=EPOCH + timedelta(seconds=offset), payload=offset
                )
            )
            for offset in offsets
        }
        for offset in (2, 3):
            self.enqueue_job(harness, EPOCH - timedelta(seconds=offset), queue=OTHER_QUEUE, payload=-offset)
        # Fresh statistics: PostgreSQL then reads a table this small in heap order unless told the order.
        harness.analyze()
        return keys

    @staticmethod
    def _claim_many(agent: TxAgent, job_table: TableName, limit: int, what: str) -> list[JobRecord]:
        claim = cast(BatchClaim, agent.backend)
        return agent.run(lambda conn: claim.get_next_jobs(conn, job_table, QUEUE_TEXT, NOW, limit), what)

    @requires(NEEDS_BATCH_CLAIM)
    def test_a_batch_claim_returns_at_most_its_limit_of_due_jobs_oldest_first(self, harness: Harness) -> None:
        """G1: get_next_jobs returns min(limit, due) jobs of its queue, oldest process_at first, rows intact.

        Twelve jobs inserted out of process_at order (distinct times, the table analyzed), one not yet due,
        two older ones of another queue: limits 1, 4 and 20 give exactly the oldest due jobs in order,
        never a job of another queue, never one not due, never more than the limit.
        """
        job_table, _ = self.tables(harness)
        self._enqueue_offsets(harness)
        stored = {self.key(harness, job.job_id): job for job in harness.jobs()}
        backend = harness.backend()
        claim = cast(BatchClaim, backend)
        taken: list[int] = []
        for limit in (1, 4, 20):
            with backend.transaction() as conn:
                jobs = claim.get_next_jobs(conn, job_table, QUEUE_TEXT, NOW, limit)
                expected = list(DUE[len(taken) : len(taken) + limit])
                got = _offsets(jobs)
                assert len(jobs) <= limit, (
                    f"G1: get_next_jobs(limit={limit}) returned {len(jobs)} jobs {got}; expected at most "
                    f"{limit}, the oldest due first: {expected}"
                )
                assert got == expected, (
                    f"G1: get_next_jobs(limit={limit}) returned the jobs due at +{got} s; expected the "
                    f"{len(expected)} oldest due jobs of {QUEUE_TEXT} in process_at order, +{expected} s "
                    "(only due jobs of its queue, oldest first, as many as the limit allows)"
                )
                for job in jobs:
                    row = stored[self.key(harness, job.job_id)]
                    assert (job.queue, job.job_type, job.payload, job.attempts) == (
                        row.queue,
                        row.job_type,
                        row.payload,
                        row.attempts,
                    ), f"G1: get_next_jobs returned {job}, which is not the stored row {row}"
                    self.assert_instant(harness, job.process_at, row.process_at, "G1: claimed process_at")
                    self.assert_instant(harness, job.enqueued_at, row.enqueued_at, "G1: claimed enqueued_at")
                claim.delete_jobs(conn, job_table, [job.job_id for job in jobs])
            taken.extend(got)
        left = sorted(_offsets(harness.jobs()))
        assert left == [-3, -2, 55], (
            f"G1: after claiming and deleting every due job, the table holds {left}; expected the other "
            "queue's two jobs and the one not yet due (delete_jobs removed the wrong rows)"
        )

    @requires(NEEDS_BATCH_CLAIM, skip_locked=True)
    def test_concurrent_batch_claims_take_disjoint_jobs_oldest_free_first(self, harness: Harness) -> None:
        """G2: open transactions' batch claims skip each other's rows without waiting; each job once.

        Three transactions claim 2, 3 and 5 of six due jobs in turn: each gets the oldest jobs no other
        holds, none waits, none is claimed twice; the last finds the one left, a fourth finds none. After
        the first rolls back, the fourth gets its two.
        """
        job_table, _ = self.tables(harness)
        keys = self._enqueue_offsets(harness, (30, 10, 50, 20, 40, 1))
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            first, second, third = pool.agent(), pool.agent(), pool.agent()
            claimed: list[list[int]] = []
            for agent, limit in ((first, 2), (second, 3), (third, 5)):
                agent.begin()
                jobs = self._claim_many(
                    agent, job_table, limit, f"G2: get_next_jobs(limit={limit}) beside open batch claims"
                )
                claimed.append(_offsets(jobs))
                ids = [self.key(harness, job.job_id) for job in jobs]
                assert ids == [keys[o] for o in claimed[-1]], "G2: get_next_jobs returned ids of other rows"
            fourth = pool.agent()
            fourth.begin()
            none_free = self._claim_many(fourth, job_table, 5, "G2: a batch claim while every job is held")
            first.rollback()
            again = self._claim_many(fourth, job_table, 5, "G2: claiming again once the first rolled back")
            for agent in (second, third, fourth):
                agent.rollback()
        assert none_free == [], (
            f"G2: a batch claim while open transactions held every due job got +{_offsets(none_free)} s; "
            "expected none (held rows are skipped, never claimed twice)"
        )
        assert claimed == [[1, 10], [20, 30, 40], [50]], (
            f"G2: three open transactions' batch claims (limits 2, 3, 5) got the jobs due at +{claimed} s; "
            "expected [[1, 10], [20, 30, 40], [50]]: each the oldest jobs no other transaction holds, "
            "none twice, at most its limit"
        )
        assert _offsets(again) == [1, 10], (
            f"G2: after the first transaction rolled back, a batch claim got +{_offsets(again)} s; "
            "expected its two jobs, +[1, 10] s (the rollback must release their row locks)"
        )

    @requires(NEEDS_BATCH_CLAIM)
    def test_each_savepoint_undoes_only_the_writes_of_its_own_block(self, harness: Harness) -> None:
        """G3: savepoint() undoes its own block's writes only: an earlier block's retry stays, later ones run.

        In one transaction of a three-job batch: a savepoint around the first job's retry_at, one around
        the second's retry_at that raises (the error goes on), one around the third's archive and delete.
        After the commit the first is rescheduled (attempts 1), the second untouched, the third archived.
        """
        job_table, archived_job_table = self.tables(harness)
        self._enqueue_offsets(harness, (1, 5, 10))
        before = {job.payload: job for job in harness.jobs()}
        backend = harness.backend()
        claim = cast(BatchClaim, backend)
        later = NOW + timedelta(minutes=10)
        with backend.transaction() as conn:
            first, second, third = claim.get_next_jobs(conn, job_table, QUEUE_TEXT, NOW, 3)
            with claim.savepoint(conn):
                backend.retry_at(conn, job_table, first.job_id, later)
            with pytest.raises(Abort), claim.savepoint(conn):
                backend.retry_at(conn, job_table, second.job_id, later)
                raise Abort
            with claim.savepoint(conn):
                backend.archive_job(conn, job_table, archived_job_table, third.job_id, STATUS_SUCCESS, NOW)
                backend.delete_job(conn, job_table, third.job_id)
        self._assert_first_kept_second_undone(harness, before, later, "G3")
        archived = default_serializer().decode(self.only_archived(harness).payload)
        assert archived == 10, (
            f"G3: the archived job is the one due at +{archived} s; expected the third block's, +10 s"
        )

    def _assert_first_kept_second_undone(
        self, harness: Harness, before: dict[str, JobRecord], retry_at: datetime, clause: str
    ) -> None:
        rows = {job.payload: job for job in harness.jobs()}
        serializer = default_serializer()
        by_offset = {int(serializer.decode(text)): row for text, row in rows.items()}
        first, second = by_offset.get(1), by_offset.get(5)
        assert first is not None and second is not None, (
            f"{clause}: the first two jobs of the batch are not both in the job table: {sorted(by_offset)}"
        )
        assert first.attempts == 1, (
            f"{clause}: the first job's retry was undone: attempts {first.attempts}, process_at "
            f"{first.process_at.isoformat()}; expected attempts 1 (savepoint: rolling back a later job's "
            "block undid an earlier one's writes, as one savepoint for the whole batch would)"
        )
        self.assert_instant(
            harness, first.process_at, retry_at, f"{clause}: the first job's retried process_at"
        )
        original = before[second.payload]
        assert second.attempts == original.attempts, (
            f"{clause}: the second job's undone retry left attempts {second.attempts}; expected "
            f"{original.attempts} (savepoint: its block's writes must be rolled back)"
        )
        self.assert_instant(
            harness, second.process_at, original.process_at, f"{clause}: the second job's process_at"
        )

    @requires(NEEDS_BATCH_CLAIM)
    def test_a_batch_keeps_a_failed_jobs_retry_when_a_later_jobs_failure_write_fails(
        self, harness: Harness
    ) -> None:
        """G4: in batch mode, a job's failure write that fails undoes that job's writes only.

        A batch of three: the first job fails and is rescheduled, the second fails with no retries left
        and its failed_job_fn raises, so its failure archive rolls back. The first keeps its retry
        (attempts 1, the new process_at), the second and third are untouched, nothing is archived, and
        the worker raises FailedJobFnError after the commit.
        """
        self._enqueue_offsets(harness, (1, 5, 10))
        before = {job.payload: job for job in harness.jobs()}
        clock = ManualClock(NOW)
        ran: list[int] = []

        def fail(job: Job) -> None:
            ran.append(int(job.payload))
            raise RuntimeError("fails")

        def strategy(job: Job, exc: BaseException) -> dict[str, Any] | None:
            return {"retries": 1, "delays": [60_000]} if job.payload == 1 else None

        def failed_job_fn(job: Job, exc: BaseException) -> None:
            raise RuntimeError("failed_job_fn fails too")

        options: dict[str, Any] = {
            **harness.worker_options,
            "batch_size": 3,
            "queue": QUEUE,
            "handler_fn_mode": "advanced",
            "retry_strategy_fn": strategy,
            "failed_job_fn": failed_job_fn,
        }
        with pytest.raises(FailedJobFnError):
            self.run_next(harness, clock, fail, **options)
        assert ran == [1, 5], (
            f"G4: the batch ran the jobs due at +{ran} s; expected +[1, 5] s (it ends there)"
        )
        self._assert_first_kept_second_undone(harness, before, NOW + timedelta(seconds=60), "G4")
        assert harness.archived_jobs() == [], "G4: the second job's rolled-back failure archive stayed"
