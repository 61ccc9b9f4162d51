"""Clock and zone clauses: times are instants whatever the session's time zone, however skewed the clocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from conformance.base import SuiteBase
from conformance.clocks import EPOCH, ManualClock, frozen
from conformance.harness import Harness
from conformance.sessions import need
from proletarian_ref.backend import STATUS_SUCCESS
from proletarian_ref.job import Job, enqueue
from proletarian_ref.keywords import to_keyword_text

# An offset east of UTC by a fraction of an hour, and a zone with daylight saving time (MySQL needs its
# time zone tables loaded for named zones: mariadb-tzinfo-to-sql /usr/share/zoneinfo | mariadb mysql).
ZONES: Final = ("+05:30", "America/New_York")
QUEUE: Final = "conformance/z"
QUEUE_TEXT: Final = to_keyword_text(QUEUE, what="queue")
# New York springs forward at 2031-03-09 07:00 UTC: enqueued at 01:30 EST, due at 03:30 EDT.
BEFORE_DST: Final = datetime(2031, 3, 9, 6, 30, 0, 250_000, tzinfo=UTC)
SKEW: Final = timedelta(hours=1)


class ZoneTests(SuiteBase):
    """Proletarian stores UTC instants; nothing about a session or a clock may shift them."""

    __test__ = False

    def _enqueue_zoned(self, zoned: Harness, clock_at: datetime, **options: Any) -> Any:
        conn = zoned.connect()
        try:
            job_id = enqueue(
                conn,
                "conformance/job",
                None,
                queue=QUEUE,
                job_table=zoned.job_table,
                job_id_strategy=zoned.job_id_strategy(),
                clock=frozen(clock_at),
                backend=zoned.backend(),
                **options,
            )
            conn.commit()
        finally:
            conn.close()
        return job_id

    def test_times_are_instants_whatever_the_sessions_time_zone(self, harness: Harness) -> None:
        """Z1: every session in +05:30 or America/New_York, the stored and claimed times are the instants.

        Enqueue, claim, retry_at and archive run on sessions in that zone, across a daylight saving
        change; the harness reads the rows in UTC. A backend that writes or reads times as wall-clock
        time of the session's zone shifts them by hours.
        """
        need(harness, "zones")
        job_table, archived_job_table = self.tables(harness)
        enqueued = BEFORE_DST
        due = enqueued + timedelta(hours=1)
        retried = due + timedelta(hours=1, seconds=30)
        finished = retried + timedelta(minutes=10)
        for zone in ZONES:
            harness.clear()
            zoned = harness.zoned(zone)
            try:
                self._enqueue_zoned(zoned, enqueued, process_at=due)
                row = self.only_job(harness)
                self.assert_instant(harness, row.enqueued_at, enqueued, f"Z1 ({zone}): stored enqueued_at")
                self.assert_instant(harness, row.process_at, due, f"Z1 ({zone}): stored process_at")
                backend = zoned.backend()
                with backend.transaction() as conn:
                    early = backend.get_next_job(conn, job_table, QUEUE_TEXT, due - timedelta(minutes=1))
                assert early is None, f"Z1 ({zone}): a job was claimed a minute before its process_at"
                with backend.transaction() as conn:
                    job = backend.get_next_job(conn, job_table, QUEUE_TEXT, due + self.precision(harness))
                    assert job is not None, f"Z1 ({zone}): a due job was not claimed"
                    self.assert_instant(
                        harness, job.enqueued_at, enqueued, f"Z1 ({zone}): claimed enqueued_at"
                    )
                    self.assert_instant(harness, job.process_at, due, f"Z1 ({zone}): claimed process_at")
                    backend.retry_at(conn, job_table, job.job_id, retried)
                self.assert_instant(
                    harness,
                    self.only_job(harness).process_at,
                    retried,
                    f"Z1 ({zone}): process_at after retry",
                )
                with backend.transaction() as conn:
                    job = backend.get_next_job(conn, job_table, QUEUE_TEXT, retried + self.precision(harness))
                    assert job is not None, (
                        f"Z1 ({zone}): a retried job was not claimed at its new process_at"
                    )
                    backend.archive_job(
                        conn, job_table, archived_job_table, job.job_id, STATUS_SUCCESS, finished
                    )
                    backend.delete_job(conn, job_table, job.job_id)
                archived = self.only_archived(harness)
                self.assert_instant(
                    harness, archived.enqueued_at, enqueued, f"Z1 ({zone}): archived enqueued_at"
                )
                self.assert_instant(
                    harness, archived.process_at, retried, f"Z1 ({zone}): archived process_at"
                )
                self.assert_instant(
                    harness, archived.finished_at, finished, f"Z1 ({zone}): archived finished_at"
                )
            finally:
                zoned.close()

    def test_clamping_and_retry_times_hold_across_skewed_clocks(self, harness: Harness) -> None:
        """Z2: with the enqueuer's clock an hour ahead of the worker's (or behind), every time is its clock's.

        A past process_at is clamped to the enqueuer's now, which the worker reaches an hour later; the
        retry is due the delay after the worker's now, the archive is stamped with the worker's now. An
        enqueuer an hour behind makes a job the worker runs at once. Sessions are in +05:30 where the
        harness can set a zone.
        """
        zoned = harness.zoned(ZONES[0]) if harness.supports("zones") else harness
        ahead = EPOCH + SKEW
        try:
            self._enqueue_zoned(zoned, ahead, process_at=ahead - timedelta(minutes=30))
            self.assert_instant(harness, self.only_job(harness).process_at, ahead, "Z2: clamped process_at")
            worker = ManualClock(EPOCH)
            seen: list[int] = []

            def fail_first(job: Job) -> None:
                seen.append(job.attempts)
                if job.attempts == 1:
                    raise RuntimeError("first attempt fails")

            options: dict[str, Any] = {
                "handler_fn_mode": "advanced",
                "retry_strategy_fn": lambda job, exc: {"retries": 1, "delays": [60_000]},
                "backend": zoned.backend(),
                "queue": QUEUE,
            }
            assert self.run_next(zoned, worker, fail_first, **options) is None, (
                "Z2: the worker ran a job clamped to the enqueuer's now before its own clock reached it"
            )
            worker.set(ahead + timedelta(seconds=2))
            assert self.run_next(zoned, worker, fail_first, **options) is True, (
                "Z2: get_next_job returned no job once the worker's clock passed the enqueuer's now"
            )
            retry = ahead + timedelta(seconds=62)
            self.assert_instant(
                harness, self.only_job(harness).process_at, retry, "Z2: the retry's process_at"
            )
            worker.set(retry - timedelta(seconds=30))
            assert self.run_next(zoned, worker, fail_first, **options) is None, "Z2: the retry ran early"
            worker.set(retry)
            assert self.run_next(zoned, worker, fail_first, **options) is True, (
                "Z2: get_next_job returned no job at the retry's process_at, the delay after the worker's now"
            )
            assert seen == [1, 2], f"Z2: the handler saw attempts {seen}; expected [1, 2]"
            archived = self.only_archived(harness)
            self.assert_instant(harness, archived.finished_at, retry, "Z2: finished_at (the worker's now)")
            self.assert_instant(harness, archived.enqueued_at, ahead, "Z2: enqueued_at (the enqueuer's now)")
            harness.clear()
            behind = EPOCH - SKEW
            self._enqueue_zoned(zoned, behind, process_in=timedelta(minutes=10))
            worker.set(EPOCH)
            assert self.run_next(zoned, worker, lambda job: None, **options) is True, (
                "Z2: a job due by an enqueuer's clock an hour behind did not run at the worker's now"
            )
            self.assert_instant(
                harness,
                self.only_archived(harness).process_at,
                behind + timedelta(minutes=10),
                "Z2: process_at",
            )
        finally:
            if zoned is not harness:
                zoned.close()
