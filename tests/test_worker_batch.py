"""Batch mode of the queue worker on every backend: one transaction a batch, each failure in a savepoint."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest
from support import FakeClock, enqueue_committed

from conformance.harness import Harness
from proletarian_ref import (
    ConfigurationError,
    FailedJobFnError,
    JobInterrupted,
    create_queue_worker,
    enqueue_many,
    process_next_job,
)
from proletarian_ref.backend import Backend, JobRecord
from proletarian_ref.backends.memory import MemoryBackend
from proletarian_ref.interrupts import interrupted
from proletarian_ref.tables import TableName


def enqueue_numbered(db: Harness, count: int, clock: FakeClock) -> None:
    """Jobs 0..count-1, one second apart, so the batch takes them in that order."""
    for n in range(count):
        enqueue_committed(db, "batch/job", n, clock=clock)
        clock.advance(seconds=1)


def run_batch(db: Harness, handler: Any, **options: Any) -> bool | None:
    return process_next_job(db.data_source, handler, **{**db.table_options, "batch_size": 8, **options})


def queued(db: Harness) -> dict[str, int]:
    """Payload text -> attempts of every job still in the job table."""
    return {job.payload: job.attempts for job in db.jobs()}


def archived(db: Harness) -> dict[str, tuple[str, int]]:
    return {row.payload: (row.status, row.attempts) for row in db.archived_jobs()}


def payload(n: int) -> str:
    return f'["~#\'",{n}]'


def test_a_batch_runs_its_jobs_in_one_transaction_seen_by_others_only_when_it_commits(db: Harness) -> None:
    clock = FakeClock()
    enqueue_numbered(db, 5, clock)
    seen_during: list[tuple[int, int, int]] = []

    def handler(job_type: str, n: int) -> None:
        # Another session, while the batch runs: nothing of the batch is written yet.
        seen_during.append((n, len(db.jobs()), len(db.archived_jobs())))

    assert run_batch(db, handler, clock=clock) is True
    assert seen_during == [(n, 5, 0) for n in range(5)]
    assert db.jobs() == []
    assert archived(db) == {payload(n): (":success", 1) for n in range(5)}


def test_a_batch_takes_at_most_batch_size_jobs_oldest_first(db: Harness) -> None:
    clock = FakeClock()
    enqueue_numbered(db, 5, clock)
    ran: list[int] = []
    assert run_batch(db, lambda t, n: ran.append(n), clock=clock, batch_size=3) is True
    assert ran == [0, 1, 2]
    assert queued(db) == {payload(3): 0, payload(4): 0}


def test_each_failed_job_is_retried_or_archived_while_the_others_archive_as_success(db: Harness) -> None:
    clock = FakeClock()
    enqueue_numbered(db, 4, clock)
    failed: list[Any] = []

    def handler(job_type: str, n: int) -> None:
        if n in (1, 2):
            raise RuntimeError(f"job {n} fails")

    def retry_strategy(job: Any, exc: BaseException) -> dict[str, Any] | None:
        return {"retries": 1, "delays": [60_000]} if job.payload == 1 else None

    run_batch(
        db,
        handler,
        clock=clock,
        retry_strategy_fn=retry_strategy,
        failed_job_fn=lambda job, exc: failed.append(job.payload),
    )
    assert queued(db) == {payload(1): 1}
    assert archived(db) == {
        payload(0): (":success", 1),
        payload(2): (":failure", 1),
        payload(3): (":success", 1),
    }
    assert failed == [2]
    retried = db.jobs()[0]
    assert (retried.process_at - clock()).total_seconds() == 60


def test_a_failed_job_whose_writes_fail_is_left_untouched_and_the_jobs_before_it_commit(db: Harness) -> None:
    clock = FakeClock()
    enqueue_numbered(db, 4, clock)
    ran: list[int] = []

    def handler(job_type: str, n: int) -> None:
        ran.append(n)
        if n == 1:
            raise RuntimeError("job 1 fails")

    def failed_job_fn(job: Any, exc: BaseException) -> None:
        raise RuntimeError("failed_job_fn fails too")

    with pytest.raises(FailedJobFnError):
        run_batch(db, handler, clock=clock, failed_job_fn=failed_job_fn)
    # Job 1's failure archive and delete were rolled back to its savepoint; the batch ended there.
    assert ran == [0, 1]
    assert archived(db) == {payload(0): (":success", 1)}
    assert queued(db) == {payload(n): 0 for n in (1, 2, 3)}


def test_job_interrupted_gives_that_job_back_and_the_finished_ones_commit(db: Harness) -> None:
    clock = FakeClock()
    enqueue_numbered(db, 4, clock)
    ran: list[int] = []

    def handler(job_type: str, n: int) -> None:
        ran.append(n)
        if n == 2:
            raise JobInterrupted("interrupted")

    assert run_batch(db, handler, clock=clock) is False
    assert ran == [0, 1, 2]
    assert archived(db) == {payload(n): (":success", 1) for n in (0, 1)}
    assert queued(db) == {payload(n): 0 for n in (2, 3)}


def test_stop_mid_batch_starts_no_further_handler_and_commits_the_finished_ones(db: Harness) -> None:
    clock = FakeClock()
    enqueue_numbered(db, 5, clock)
    ran: list[int] = []
    stopper: list[threading.Thread] = []

    def handler(job_type: str, n: int) -> None:
        ran.append(n)
        if n == 1:
            thread = threading.Thread(target=worker.stop)
            thread.start()
            stopper.append(thread)  # only once started: the test joins what it finds here
            while not interrupted():
                threading.Event().wait(0.005)

    worker = create_queue_worker(
        db.data_source, handler, clock=clock, batch_size=8, polling_interval_ms=10, **db.table_options
    )
    worker.start()
    stopper_started = threading.Event()
    for _ in range(2000):
        if stopper:
            stopper_started.set()
            break
        threading.Event().wait(0.005)
    assert stopper_started.is_set(), "the handler of job 1 never ran"
    stopper[0].join(30)
    assert not stopper[0].is_alive()
    assert ran == [0, 1]
    assert archived(db) == {payload(n): (":success", 1) for n in (0, 1)}
    assert queued(db) == {payload(n): 0 for n in (2, 3, 4)}


def _rows(db: Harness) -> list[tuple[Any, ...]]:
    return sorted(
        (r.queue, r.job_type, r.payload, r.attempts, r.status, r.enqueued_at, r.process_at, r.finished_at)
        for r in db.archived_jobs()
    )


def test_batch_mode_archives_the_same_rows_as_one_job_a_transaction(db: Harness) -> None:
    def handler(job_type: str, n: int) -> None:
        if n == 2:
            raise RuntimeError("job 2 fails")

    rows: dict[int, list[tuple[Any, ...]]] = {}
    for batch_size in (1, 8):
        db.clear()
        clock = FakeClock()
        enqueue_numbered(db, 4, clock)
        while process_next_job(
            db.data_source, handler, clock=clock, batch_size=batch_size, **db.table_options
        ):
            pass
        rows[batch_size] = _rows(db)
    assert len(rows[1]) == 4
    assert rows[8] == rows[1]


class _OnlyTheFiveVerbs:
    """A backend with Proletarian's five statements and nothing of batch mode."""

    dialect = "memory"
    capabilities = MemoryBackend.capabilities

    def __init__(self) -> None:
        self._inner = MemoryBackend()

    def transaction(self) -> Any:
        return self._inner.transaction()

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        return self._inner.enqueue(conn, job_table, job)

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        return self._inner.get_next_job(conn, job_table, queue, now)

    def archive_job(self, conn: Any, *args: Any) -> None:
        self._inner.archive_job(conn, *args)

    def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        self._inner.delete_job(conn, job_table, job_id)

    def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        self._inner.retry_at(conn, job_table, job_id, retry_at)

    def close(self) -> None:
        return None


@pytest.mark.parametrize("bad", [0, -1, 2.0, "8", True, None])
def test_a_batch_size_that_is_not_an_int_of_at_least_one_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="batch_size"):
        create_queue_worker(None, lambda t, p: None, backend=MemoryBackend(), batch_size=bad)
    with pytest.raises(ConfigurationError, match="batch_size"):
        process_next_job(None, lambda t, p: None, backend=MemoryBackend(), batch_size=bad)


def test_batch_mode_on_a_backend_without_it_is_refused_naming_the_backend() -> None:
    backend = _OnlyTheFiveVerbs()
    assert isinstance(backend, Backend)
    with pytest.raises(ConfigurationError, match=r"batch_size=4 .*_OnlyTheFiveVerbs"):
        create_queue_worker(None, lambda t, p: None, backend=backend, batch_size=4)
    # batch_size 1 is Proletarian's own mode, which every backend runs.
    create_queue_worker(None, lambda t, p: None, backend=backend, batch_size=1)


class _CompactForOneJobOnly(MemoryBackend):
    """A backend of one's own whose compact plan (ArchiveAndDelete) predates BatchArchiveAndDelete."""

    compact_plan = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def archive_and_delete_job(self, conn: Any, *args: Any) -> None:
        self.calls.append("archive_and_delete_job")
        job_table, archived_job_table, job_id, status, finished_at = args
        self.archive_job(conn, job_table, archived_job_table, job_id, status, finished_at)
        self.delete_job(conn, job_table, job_id)

    def archive_jobs(self, conn: Any, *args: Any) -> None:
        self.calls.append("archive_jobs")
        super().archive_jobs(conn, *args)

    def delete_jobs(self, conn: Any, *args: Any) -> None:
        self.calls.append("delete_jobs")
        super().delete_jobs(conn, *args)


class _CompactForBatchesToo(_CompactForOneJobOnly):
    def archive_and_delete_jobs(self, conn: Any, *args: Any) -> None:
        self.calls.append("archive_and_delete_jobs")
        job_table, archived_job_table, job_ids, status, finished_at = args
        MemoryBackend.archive_jobs(self, conn, job_table, archived_job_table, job_ids, status, finished_at)
        MemoryBackend.delete_jobs(self, conn, job_table, job_ids)


@pytest.mark.parametrize(
    ("backend_class", "calls"),
    [
        (_CompactForOneJobOnly, ["archive_jobs", "delete_jobs"]),
        (_CompactForBatchesToo, ["archive_and_delete_jobs"]),
    ],
    ids=["without-archive_and_delete_jobs", "with-archive_and_delete_jobs"],
)
def test_a_compact_backend_ends_a_batch_with_archive_and_delete_jobs_only_if_it_has_it(
    backend_class: type[_CompactForOneJobOnly], calls: list[str]
) -> None:
    backend = backend_class()
    with backend.transaction() as conn:
        enqueue_many(conn, [("batch/job", n) for n in range(3)], backend=backend)
    seen: list[int] = []
    assert process_next_job(None, lambda t, n: seen.append(n), backend=backend, batch_size=8) is True
    assert seen == [0, 1, 2]
    assert backend.calls == calls
    assert backend.db.jobs() == []
    assert sorted(row.payload for row in backend.db.archived_jobs()) == [payload(n) for n in range(3)]
    backend.compact_plan = False
    backend.calls.clear()
    with backend.transaction() as conn:
        enqueue_many(conn, [("batch/job", 3)], backend=backend)
    assert process_next_job(None, lambda t, n: seen.append(n), backend=backend, batch_size=8) is True
    assert backend.calls == ["archive_jobs", "delete_jobs"]  # the plan off: the two batch statements
