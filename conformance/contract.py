"""Contract tests: one clause of Proletarian's database behaviour each (enqueue, claim, archive, ...)."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta
from typing import Any, Final

import pytest

from conformance.agents import AgentPool
from conformance.base import SuiteBase
from conformance.capabilities import requires
from conformance.clocks import EPOCH, ManualClock
from conformance.harness import Harness
from proletarian_ref.backend import STATUS_SUCCESS, JobRecord
from proletarian_ref.errors import FailedJobFnError
from proletarian_ref.job import Job, default_serializer, enqueue
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text

DEFAULT_QUEUE_TEXT: Final = to_keyword_text(DEFAULT_QUEUE, what="queue")
# How soon a database must notice a connection that went away and release its transaction's locks.
LOST_CONNECTION_NOTICED_S: Final = 10.0
UNICODE_PAYLOAD: Final = {"email": "ä@example.com", "text": "ǅ😀\u2028\u0000 نص", "n": [1, 2.5, None, True]}


class VerbatimSerializer:
    """Writes a fixed text whatever the payload: lets a test store Transit that is not canonical."""

    def __init__(self, text: str) -> None:
        self.text = text

    def encode(self, payload: Any) -> str:
        return self.text

    def decode(self, text: str) -> Any:
        return default_serializer().decode(text)


class Abort(BaseException):
    """Not an Exception: escapes the worker's handler protection and rolls the transaction back."""


def _ok(job_type: str, payload: Any) -> None:
    return None


class ContractTests(SuiteBase):
    """The clauses of the backend contract, each proven on its own."""

    __test__ = False

    # -- E: enqueue ------------------------------------------------------------------------------------

    def test_enqueue_writes_queue_and_job_type_as_keyword_text(self, harness: Harness) -> None:
        """E1: queue and job_type are stored as EDN keyword text, the default queue ":proletarian/default"."""
        self.enqueue_job(harness, EPOCH, job_type="my.ns/type")
        row = self.only_job(harness)
        assert (row.queue, row.job_type) == (":proletarian/default", ":my.ns/type")
        harness.clear()
        self.enqueue_job(harness, EPOCH, job_type=":other.ns/job-type", queue="my.ns/queue")
        row = self.only_job(harness)
        assert (row.queue, row.job_type) == (":my.ns/queue", ":other.ns/job-type")

    def test_enqueue_writes_the_transit_text_as_the_payload(self, harness: Harness) -> None:
        """E2: the payload column holds the serializer's Transit text exactly, unicode and size intact."""
        self.enqueue_job(harness, EPOCH, payload={"email": "a"})
        assert self.only_job(harness).payload == '["^ ","~:email","a"]'
        serializer = default_serializer()
        # 4,500 times "x\uD83D\uDE00" (as Proletarian escapes 😀) is 58.5 kB: large, yet inside MySQL's TEXT.
        for payload in (UNICODE_PAYLOAD, "x😀" * 4_500):
            harness.clear()
            self.enqueue_job(harness, EPOCH, payload=payload)
            text = self.only_job(harness).payload
            assert text == serializer.encode(payload), "the stored payload text is not the text enqueued"
            assert serializer.decode(text) == payload

    def test_enqueue_starts_attempts_at_zero_and_stamps_the_clocks_now(self, harness: Harness) -> None:
        """E3: attempts is 0; enqueued_at and process_at are the enqueuer's clock now, not the database's."""
        now = EPOCH + timedelta(milliseconds=250)
        self.enqueue_job(harness, now)
        row = self.only_job(harness)
        assert row.attempts == 0
        self.assert_instant(harness, row.enqueued_at, now, "enqueued_at")
        self.assert_instant(harness, row.process_at, now, "process_at")

    def test_enqueue_clamps_a_process_at_in_the_past_to_now(self, harness: Harness) -> None:
        """E4: a process_at before now, or a negative process_in, makes the job due now."""
        self.enqueue_job(harness, EPOCH, process_at=EPOCH - timedelta(hours=3))
        self.assert_instant(harness, self.only_job(harness).process_at, EPOCH, "process_at")
        harness.clear()
        self.enqueue_job(harness, EPOCH, process_in=timedelta(minutes=-5))
        self.assert_instant(harness, self.only_job(harness).process_at, EPOCH, "process_at")

    def test_enqueue_keeps_a_process_at_in_the_future(self, harness: Harness) -> None:
        """E5: a future process_at (or now + process_in) is stored as given, enqueued_at stays now."""
        later = EPOCH + timedelta(seconds=90, milliseconds=250)
        self.enqueue_job(harness, EPOCH, process_at=later)
        row = self.only_job(harness)
        self.assert_instant(harness, row.process_at, later, "process_at")
        self.assert_instant(harness, row.enqueued_at, EPOCH, "enqueued_at")
        harness.clear()
        self.enqueue_job(harness, EPOCH, process_in=timedelta(minutes=5))
        self.assert_instant(
            harness, self.only_job(harness).process_at, EPOCH + timedelta(minutes=5), "process_at"
        )

    def test_enqueue_returns_the_id_the_row_holds(self, harness: Harness) -> None:
        """E6: enqueue returns the job's id, which is the row's id and new for every job."""
        first = self.enqueue_job(harness, EPOCH)
        second = self.enqueue_job(harness, EPOCH)
        assert first != second
        assert sorted(self.key(harness, j.job_id) for j in harness.jobs()) == sorted(
            [str(first), str(second)]
        )

    @requires(transactional_enqueue=True)
    def test_enqueue_joins_the_callers_transaction(self, harness: Harness) -> None:
        """E7: enqueue never commits: the job is invisible until the caller commits, gone if it rolls back."""
        job_table, _ = self.tables(harness)
        backend = harness.backend()
        conn = harness.connect()
        try:
            options: dict[str, Any] = {
                "job_table": harness.job_table,
                "job_id_strategy": harness.job_id_strategy(),
                "clock": ManualClock(EPOCH),
                "backend": backend,
                **harness.enqueue_options,
            }
            enqueue(conn, "conformance/job", None, **options)
            assert harness.jobs() == [], (
                "E7: the job is committed before the caller committed; expected it invisible until then: "
                "enqueue committed the caller's transaction"
            )
            with AgentPool(harness.make_backend, self.step_timeout) as pool:
                agent = pool.agent()
                agent.begin()
                claimed = self.claim_in(agent, job_table, DEFAULT_QUEUE_TEXT, EPOCH, "claim")
                agent.rollback()
            assert claimed is None, "E7: a worker claimed a job whose enqueue was not committed"
            conn.rollback()
            assert harness.jobs() == [], (
                "E7: the job stayed after the caller rolled back; expected it gone: enqueue committed it"
            )
            enqueue(conn, "conformance/job", None, **options)
            conn.commit()
            self.only_job(harness)
        finally:
            conn.close()

    # -- S: claim --------------------------------------------------------------------------------------

    def test_claim_returns_a_due_job_with_every_column_intact(self, harness: Harness) -> None:
        """S1: the claimed job is the stored row: id, queue, job_type, payload, attempts and both times."""
        job_table, _ = self.tables(harness)
        self.enqueue_job(
            harness,
            EPOCH,
            payload=UNICODE_PAYLOAD,
            queue="conformance/s1",
            process_at=EPOCH + timedelta(seconds=30),
        )
        stored = self.only_job(harness)
        backend = harness.backend()
        with backend.transaction() as conn:
            claimed = backend.get_next_job(conn, job_table, ":conformance/s1", EPOCH + timedelta(seconds=31))
        assert claimed is not None, "S1: a due job was not claimed"
        assert self.key(harness, claimed.job_id) == self.key(harness, stored.job_id)
        assert (claimed.queue, claimed.job_type, claimed.payload, claimed.attempts) == (
            stored.queue,
            stored.job_type,
            stored.payload,
            stored.attempts,
        )
        self.assert_instant(harness, claimed.enqueued_at, stored.enqueued_at, "claimed enqueued_at")
        self.assert_instant(harness, claimed.process_at, stored.process_at, "claimed process_at")

    def test_claim_leaves_a_job_alone_until_its_process_at(self, harness: Harness) -> None:
        """S2: a job is claimed only once process_at <= the worker's now, and then at exactly process_at."""
        job_table, _ = self.tables(harness)
        due = EPOCH + timedelta(seconds=60)
        self.enqueue_job(harness, EPOCH, process_at=due)
        backend = harness.backend()
        with backend.transaction() as conn:
            early = backend.get_next_job(conn, job_table, DEFAULT_QUEUE_TEXT, due - self.precision(harness))
        assert early is None, "S2: a job was claimed before its process_at"
        self.only_job(harness)
        with backend.transaction() as conn:
            on_time = backend.get_next_job(conn, job_table, DEFAULT_QUEUE_TEXT, due)
        assert on_time is not None, "S2: a job was not claimed at its process_at (process_at <= now)"

    def test_claim_takes_the_oldest_process_at_first(self, harness: Harness) -> None:
        """S3: jobs come out in process_at order, whatever order they were enqueued in, whatever the plan."""
        job_table, _ = self.tables(harness)
        # Newest first, so that reading the table in insertion (heap) order gives the wrong answer; and
        # enough of them that, with fresh statistics, PostgreSQL's planner prefers exactly that read.
        offsets = [40, 35, 30, 25, 5, 20, 15, 10, 45, 50, 1, 55]
        for offset in offsets:
            self.enqueue_job(harness, EPOCH, process_at=EPOCH + timedelta(seconds=offset), payload=offset)
        harness.analyze()
        serializer = default_serializer()
        backend = harness.backend()
        order: list[int] = []
        for _ in offsets:
            with backend.transaction() as conn:
                job = backend.get_next_job(conn, job_table, DEFAULT_QUEUE_TEXT, EPOCH + timedelta(minutes=5))
                assert job is not None, f"S3: a due job was not claimed after {order}"
                order.append(serializer.decode(job.payload))
                backend.delete_job(conn, job_table, job.job_id)
        assert order == sorted(offsets), f"S3: jobs were claimed in the order {order}, not by process_at"

    def test_claim_takes_only_jobs_of_its_own_queue(self, harness: Harness) -> None:
        """S4: a worker of one queue never sees another queue's jobs, however old."""
        job_table, _ = self.tables(harness)
        self.enqueue_job(harness, EPOCH - timedelta(hours=1), queue="conformance/other")
        mine = self.enqueue_job(harness, EPOCH, queue="conformance/mine")
        backend = harness.backend()
        with backend.transaction() as conn:
            job = backend.get_next_job(conn, job_table, ":conformance/mine", EPOCH)
            nothing = backend.get_next_job(conn, job_table, ":conformance/none", EPOCH)
        assert job is not None and self.key(harness, job.job_id) == str(mine), (
            "S4: claimed another queue's job"
        )
        assert nothing is None, "S4: a queue with no jobs returned a job"

    @requires(skip_locked=True)
    def test_a_claimed_job_is_skipped_by_a_second_transaction_without_waiting(self, harness: Harness) -> None:
        """S5 (SKIP LOCKED): while one transaction holds a job, another sees none and does not block."""
        job_table, _ = self.tables(harness)
        self.enqueue_job(harness, EPOCH)
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            first, second = pool.agent(), pool.agent()
            first.begin()
            second.begin()
            held = self.claim_in(first, job_table, DEFAULT_QUEUE_TEXT, EPOCH, "claim")
            assert held is not None
            other = self.claim_in(
                second,
                job_table,
                DEFAULT_QUEUE_TEXT,
                EPOCH,
                "S5: claiming while another transaction holds the only job",
            )
            assert other is None, (
                "S5: get_next_job in a second transaction returned the job another open transaction holds; "
                "expected None: the claim neither locked the row (FOR UPDATE) nor skipped locked ones"
            )
            first.rollback()
            again = self.claim_in(second, job_table, DEFAULT_QUEUE_TEXT, EPOCH, "claim")
            assert again is not None, "S5: the job was not claimable once the holder rolled back"
            second.rollback()

    @requires(skip_locked=True)
    def test_open_transactions_claim_different_jobs_oldest_first(self, harness: Harness) -> None:
        """S6 (no double claiming): each of several open transactions gets its own job, oldest first."""
        job_table, _ = self.tables(harness)
        ids = [
            self.enqueue_job(harness, EPOCH - timedelta(seconds=offset), payload=offset)
            for offset in (30, 20, 10)
        ]
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            agents = [pool.agent() for _ in ids]
            claimed: list[str] = []
            for agent in agents:
                agent.begin()
                job = self.claim_in(
                    agent,
                    job_table,
                    DEFAULT_QUEUE_TEXT,
                    EPOCH,
                    "S6: claiming while other transactions hold jobs",
                )
                assert job is not None, (
                    f"S6: a transaction found no job while {len(ids) - len(claimed)} were free"
                )
                claimed.append(self.key(harness, job.job_id))
            for agent in agents:
                agent.rollback()
        assert len(set(claimed)) == len(claimed), (
            f"S6: get_next_job gave open transactions the same job: {claimed}; expected a job each: the "
            "claim did not lock the row it returned"
        )
        assert claimed == [str(i) for i in ids], "S6: the transactions did not get the oldest free job each"

    @requires(skip_locked=True, claim_locks_only_the_claimed_row=True)
    def test_an_empty_poll_of_one_queue_hides_no_job_of_another(self, harness: Harness) -> None:
        """S7: a transaction whose claim found nothing holds no lock a claim of another queue meets."""
        job_table, _ = self.tables(harness)
        # Every queue name around "conformance/b" in sort order, so whichever way the backend's index
        # runs, the empty queue's scan ends next to the other queue's jobs.
        oldest = self.enqueue_job(harness, EPOCH - timedelta(seconds=2), queue="conformance/b")
        self.enqueue_job(harness, EPOCH - timedelta(seconds=1), queue="conformance/b")
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            polls = [pool.agent() for _ in ("conformance/a", "conformance/c")]
            for agent, queue in zip(polls, (":conformance/a", ":conformance/c"), strict=True):
                agent.begin()
                polled = self.claim_in(agent, job_table, queue, EPOCH)
                assert polled is None, (
                    f"S7: get_next_job of {queue}, a queue with no jobs, returned job "
                    f"{self.key(harness, polled.job_id)} of queue {polled.queue}; expected None"
                )
            worker = pool.agent()
            worker.begin()
            job = self.claim_in(worker, job_table, ":conformance/b", EPOCH, "S7: claiming beside empty polls")
            for agent in (*polls, worker):
                agent.rollback()
        assert job is not None, (
            "S7: get_next_job of :conformance/b returned None beside open empty polls of other queues; "
            "expected its oldest job: the empty polls' claims locked rows they did not return"
        )
        assert self.key(harness, job.job_id) == str(oldest), (
            f"S7: get_next_job of :conformance/b returned job {self.key(harness, job.job_id)} beside open "
            f"empty polls of other queues; expected its oldest job {oldest}, which the empty polls locked"
        )

    # -- A: archive ------------------------------------------------------------------------------------

    def test_archive_copies_every_column_and_adds_one_attempt(self, harness: Harness) -> None:
        """A1: the archive copies id, queue, job_type, payload, enqueued_at, process_at; attempts + 1."""
        job_table, archived_job_table = self.tables(harness)
        self.enqueue_job(
            harness,
            EPOCH,
            job_type="conformance/a1",
            payload=UNICODE_PAYLOAD,
            queue="conformance/archive",
            process_at=EPOCH + timedelta(seconds=30),
        )
        backend = harness.backend()
        queue = ":conformance/archive"
        with backend.transaction() as conn:
            job = backend.get_next_job(conn, job_table, queue, EPOCH + timedelta(seconds=40))
            assert job is not None, "A1: get_next_job returned None for a due job"
            backend.retry_at(conn, job_table, job.job_id, EPOCH + timedelta(seconds=100))
        stored = self.only_job(harness)
        finished = EPOCH + timedelta(seconds=101)
        with backend.transaction() as conn:
            job = backend.get_next_job(conn, job_table, queue, EPOCH + timedelta(seconds=100))
            assert job is not None, "A1: get_next_job returned None for a job due at its retry_at"
            backend.archive_job(conn, job_table, archived_job_table, job.job_id, STATUS_SUCCESS, finished)
            backend.delete_job(conn, job_table, job.job_id)
        row = self.only_archived(harness)
        assert self.key(harness, row.job_id) == self.key(harness, stored.job_id), "A1: job_id not copied"
        assert (row.queue, row.job_type) == (stored.queue, stored.job_type), (
            "A1: queue or job_type not copied"
        )
        assert row.payload == stored.payload, "A1: payload text not copied"
        assert row.attempts == stored.attempts + 1 == 2, (
            f"A1: archive_job wrote attempts {row.attempts} for a job stored with {stored.attempts} "
            "(after one retry_at); expected 2: archive_job adds one"
        )
        assert row.status == STATUS_SUCCESS, (
            f"A1: archive_job wrote status {row.status!r}; expected {STATUS_SUCCESS!r}, the one it was given"
        )
        self.assert_instant(harness, row.enqueued_at, stored.enqueued_at, "A1: archived enqueued_at")
        self.assert_instant(harness, row.process_at, stored.process_at, "A1: archived process_at")
        self.assert_instant(harness, row.finished_at, finished, "A1: archived finished_at")
        assert harness.jobs() == [], "A1: delete_job left the archived job in the job table"

    def test_archive_keeps_the_payload_text_byte_for_byte(self, harness: Harness) -> None:
        """A2: the archive copies the stored text; it never decodes and re-encodes the payload."""
        text = '["^ ",  "~:email" , "ä@example.com", "~:note", "😀\\u0000"]'
        self.enqueue_job(harness, EPOCH, serializer=VerbatimSerializer(text))
        assert self.only_job(harness).payload == text
        seen: list[Any] = []
        assert self.run_next(harness, ManualClock(EPOCH), lambda t, p: seen.append(p)) is True
        assert seen == [{"email": "ä@example.com", "note": "😀\x00"}]
        assert self.only_archived(harness).payload == text, "A2: the archived payload text differs"

    def test_a_finished_job_is_archived_as_success_at_the_clocks_now(self, harness: Harness) -> None:
        """A3: success archives ":success", attempts 1, finished_at = the worker's clock; deletes the job."""
        self.enqueue_job(harness, EPOCH)
        clock = ManualClock(EPOCH + timedelta(seconds=5, milliseconds=500))
        assert self.run_next(harness, clock, _ok) is True
        row = self.only_archived(harness)
        assert row.status == ":success", (
            f"A3: archive_job wrote status {row.status!r} for a finished job; expected ':success'"
        )
        assert row.attempts == 1, f"A3: archive_job wrote attempts {row.attempts} for a first run; expected 1"
        self.assert_instant(harness, row.finished_at, clock(), "A3: finished_at")
        assert harness.jobs() == [], "A3: the archived job is still in the job table"

    def test_a_job_failing_without_retries_is_archived_as_failure(self, harness: Harness) -> None:
        """A4: a failure with no retries left archives ":failure", attempts 1; failed_job_fn runs once."""
        self.enqueue_job(harness, EPOCH)
        failed: list[Job] = []

        def fail(job_type: str, payload: Any) -> None:
            raise RuntimeError("boom")

        assert self.run_next(harness, ManualClock(EPOCH), fail, failed_job_fn=lambda j, e: failed.append(j))
        row = self.only_archived(harness)
        assert row.status == ":failure", (
            f"A4: archive_job wrote status {row.status!r} for a failed job; expected ':failure'"
        )
        assert row.attempts == 1, f"A4: archive_job wrote attempts {row.attempts} for a first run; expected 1"
        assert [j.attempts for j in failed] == [1]
        assert harness.jobs() == []

    # -- D: delete -------------------------------------------------------------------------------------

    def test_delete_removes_exactly_that_job(self, harness: Harness) -> None:
        """D1: delete removes the claimed job and nothing else, and archives nothing."""
        job_table, _ = self.tables(harness)
        first = self.enqueue_job(harness, EPOCH - timedelta(seconds=1))
        second = self.enqueue_job(harness, EPOCH)
        backend = harness.backend()
        with backend.transaction() as conn:
            job = backend.get_next_job(conn, job_table, DEFAULT_QUEUE_TEXT, EPOCH)
            assert job is not None and self.key(harness, job.job_id) == str(first)
            backend.delete_job(conn, job_table, job.job_id)
        assert [self.key(harness, j.job_id) for j in harness.jobs()] == [str(second)], "D1: wrong jobs left"
        assert harness.archived_jobs() == [], "D1: delete archived the job"

    # -- R: retry --------------------------------------------------------------------------------------

    def test_retry_sets_process_at_and_adds_one_attempt(self, harness: Harness) -> None:
        """R1: retry_at stores the new process_at and attempts + 1, and changes nothing else."""
        job_table, _ = self.tables(harness)
        self.enqueue_job(harness, EPOCH, payload=UNICODE_PAYLOAD)
        before = self.only_job(harness)
        retry_at = EPOCH + timedelta(seconds=75, milliseconds=500)
        backend = harness.backend()
        with backend.transaction() as conn:
            job = backend.get_next_job(conn, job_table, DEFAULT_QUEUE_TEXT, EPOCH)
            assert job is not None
            backend.retry_at(conn, job_table, job.job_id, retry_at)
        after = self.only_job(harness)
        assert after.attempts == 1, f"R1: retry_at left attempts {after.attempts}; expected 1 (it adds one)"
        self.assert_instant(harness, after.process_at, retry_at, "R1: process_at after retry")
        assert (after.queue, after.job_type, after.payload) == (before.queue, before.job_type, before.payload)
        self.assert_instant(harness, after.enqueued_at, before.enqueued_at, "R1: enqueued_at after retry")
        assert harness.archived_jobs() == []

    def test_a_failed_job_with_retries_left_waits_its_delay(self, harness: Harness) -> None:
        """R2: a retried job is due its delay after the failure, runs again as attempt 2, then archives 2."""
        self.enqueue_job(harness, EPOCH)
        clock = ManualClock(EPOCH + timedelta(seconds=1))
        strategy = {"retries": 2, "delays": [60_000]}
        seen: list[int] = []

        def fail_once(job: Job) -> None:
            seen.append(job.attempts)
            if job.attempts == 1:
                raise RuntimeError("first attempt fails")

        options: dict[str, Any] = {"handler_fn_mode": "advanced", "retry_strategy_fn": lambda j, e: strategy}
        assert self.run_next(harness, clock, fail_once, **options) is True, (
            "R2: get_next_job returned no job for a job due now"
        )
        row = self.only_job(harness)
        assert row.attempts == 1, (
            f"R2: retry_at left attempts {row.attempts} after a failed attempt; expected 1"
        )
        retry_at = EPOCH + timedelta(seconds=61)
        self.assert_instant(harness, row.process_at, retry_at, "R2: process_at after the failure")
        clock.set(retry_at - self.precision(harness))
        assert self.run_next(harness, clock, fail_once, **options) is None, "R2: the job ran before its delay"
        clock.set(retry_at)
        assert self.run_next(harness, clock, fail_once, **options) is True, (
            "R2: get_next_job returned no job at the retry's process_at (retry_at moves process_at)"
        )
        assert seen == [1, 2], f"R2: the handler saw attempts {seen}; expected [1, 2] (retry_at adds one)"
        archived = self.only_archived(harness)
        assert (archived.status, archived.attempts) == (STATUS_SUCCESS, 2), (
            f"R2: archive_job wrote status {archived.status!r} and attempts {archived.attempts} after the "
            f"second run; expected {STATUS_SUCCESS!r} and 2"
        )
        self.assert_instant(
            harness, archived.process_at, retry_at, "R2: archived process_at (the last run's)"
        )

    # -- T: transactions -------------------------------------------------------------------------------

    def test_a_rolled_back_claim_leaves_the_job_claimable_with_attempts_unchanged(
        self, harness: Harness
    ) -> None:
        """T1: a handler that escapes with a non-Exception rolls back; the job stays, attempts unchanged."""
        self.enqueue_job(harness, EPOCH)
        before = self.only_job(harness)

        def abort(job_type: str, payload: Any) -> None:
            raise Abort

        with pytest.raises(Abort):
            self.run_next(harness, ManualClock(EPOCH), abort)
        after = self.only_job(harness)
        assert (after.attempts, after.payload) == (before.attempts, before.payload) == (0, before.payload)
        self.assert_instant(harness, after.process_at, before.process_at, "T1: process_at after rollback")
        assert harness.archived_jobs() == []
        seen: list[int] = []
        assert self.run_next(harness, ManualClock(EPOCH), seen.append, handler_fn_mode="advanced")
        assert len(seen) == 1 and self.only_archived(harness).attempts == 1

    def test_a_rolled_back_retry_or_archive_changes_nothing(self, harness: Harness) -> None:
        """T2: retry_at, archive_job and delete_job all vanish with their transaction's rollback."""
        job_table, archived_job_table = self.tables(harness)
        self.enqueue_job(harness, EPOCH)
        before = self.only_job(harness)
        backend = harness.backend()
        with pytest.raises(Abort), backend.transaction() as conn:
            job = backend.get_next_job(conn, job_table, DEFAULT_QUEUE_TEXT, EPOCH)
            assert job is not None
            backend.retry_at(conn, job_table, job.job_id, EPOCH + timedelta(hours=1))
            raise Abort
        after = self.only_job(harness)
        assert after.attempts == 0, "T2: a rolled-back retry still counted an attempt"
        self.assert_instant(
            harness, after.process_at, before.process_at, "T2: process_at after a rolled-back retry"
        )
        with pytest.raises(Abort), backend.transaction() as conn:
            job = backend.get_next_job(conn, job_table, DEFAULT_QUEUE_TEXT, EPOCH)
            assert job is not None
            backend.archive_job(conn, job_table, archived_job_table, job.job_id, STATUS_SUCCESS, EPOCH)
            backend.delete_job(conn, job_table, job.job_id)
            raise Abort
        assert harness.archived_jobs() == [], "T2: a rolled-back archive stayed"
        assert self.only_job(harness).attempts == 0

    def test_a_failing_failed_job_fn_rolls_back_the_failure(self, harness: Harness) -> None:
        """T3: when failed_job_fn raises, the failure archive and delete roll back; attempts unchanged."""
        self.enqueue_job(harness, EPOCH)

        def fail(job_type: str, payload: Any) -> None:
            raise RuntimeError("boom")

        def failed_job_fn(job: Job, exc: BaseException) -> None:
            raise RuntimeError("failed_job_fn fails too")

        with pytest.raises(FailedJobFnError):
            self.run_next(harness, ManualClock(EPOCH), fail, failed_job_fn=failed_job_fn)
        assert self.only_job(harness).attempts == 0
        assert harness.archived_jobs() == [], "T3: the failure archive survived the rollback"

    def test_a_connection_lost_mid_transaction_releases_the_job(self, harness: Harness) -> None:
        """T4: a transaction whose connection dies leaves its job claimable, attempts unchanged."""
        job_table, _ = self.tables(harness)
        self.enqueue_job(harness, EPOCH)
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            lost, other = pool.agent(), pool.agent()
            lost.begin()
            held = self.claim_in(lost, job_table, DEFAULT_QUEUE_TEXT, EPOCH, "claim")
            assert held is not None
            lost.run(lambda c: c.close(), "closing the connection mid-transaction")
            # Committing on a closed connection fails; the point is what the database did.
            with contextlib.suppress(Exception):
                lost.commit()
            # The database notices the lost connection on its own time, so the job becomes claimable soon
            # after, not at once: poll for it as a worker would, within a bound.
            job: JobRecord | None = None
            deadline = time.monotonic() + LOST_CONNECTION_NOTICED_S
            while job is None and time.monotonic() < deadline:
                other.begin()
                job = self.claim_in(other, job_table, DEFAULT_QUEUE_TEXT, EPOCH, "T4: claiming a lost job")
                other.rollback()
                if job is None:
                    threading.Event().wait(0.02)
        assert job is not None, (
            f"T4: the job of a lost transaction was not claimable within {LOST_CONNECTION_NOTICED_S:g} s"
        )
        assert job.attempts == 0
        assert harness.archived_jobs() == []
