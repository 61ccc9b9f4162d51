"""stop() with jobs in flight: drain until the deadline, then release the rest to another worker."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support import RecordingLog, enqueue_committed, wait_until

from conformance import builtin
from conformance.harness import Harness, SqlHarness
from proletarian_ref import ShutdownTimeoutError, create_queue_worker
from proletarian_ref import log as ev


class Stubborn:
    """A handler that ignores the stop request (it never looks at interrupted()) until let go."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.finished: list[Any] = []
        self.let_go = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, job_type: str, payload: Any) -> None:
        with self._lock:
            self.started.append(payload)
        assert self.let_go.wait(30), "the test never let the handler go"
        with self._lock:
            self.finished.append(payload)


def test_stop_drains_jobs_that_finish_before_the_deadline(db: Harness) -> None:
    for n in range(3):
        enqueue_committed(db, "fault/drain", n)
    started = threading.Semaphore(0)

    def slow(job_type: str, payload: Any) -> None:
        started.release()
        time.sleep(0.4)  # not proletarian_ref.sleep: this handler does not honour the stop request

    log = RecordingLog()
    shut_down = threading.Event()
    worker = create_queue_worker(
        db.data_source,
        slow,
        worker_threads=3,
        polling_interval_ms=10,
        await_termination_timeout_ms=10_000,
        log=log,
        on_shutdown=shut_down.set,
        **db.table_options,
    )
    worker.start()
    for _ in range(3):
        assert started.acquire(timeout=20)
    began = time.monotonic()
    assert worker.stop() is True
    assert time.monotonic() - began < 5
    assert sorted(row.status for row in db.archived_jobs()) == [":success"] * 3
    assert shut_down.is_set() and log.named(ev.COMPLETED_SHUTDOWN)
    assert not log.named(ev.JOB_RELEASED)


@pytest.mark.sql_only
def test_stop_releases_jobs_still_running_at_the_deadline_to_another_worker(db: Harness) -> None:
    """The jobs of handlers that outlast await_termination_timeout_ms go back to the queue at once.

    stop() closes those threads' connections, so the database rolls their claims back: another worker
    runs the jobs right away with attempts unchanged. When the old handlers finally return, nothing of
    theirs is written. stop() then raises ShutdownTimeoutError and skips on_shutdown, like Proletarian,
    because those handlers were still running.
    """
    assert isinstance(db, SqlHarness)
    check_release_at_the_deadline(db, db.data_source)


def test_stop_releases_jobs_of_a_pooled_worker_too(pg_db: SqlHarness, pg_dsn: str) -> None:
    from psycopg_pool import ConnectionPool

    with ConnectionPool(pg_dsn, min_size=2, max_size=4, open=True) as pool:
        check_release_at_the_deadline(pg_db, pool)


def check_release_at_the_deadline(db: SqlHarness, data_source: Any) -> None:
    ids = [enqueue_committed(db, "fault/stuck", n) for n in range(2)]
    stubborn = Stubborn()
    log = RecordingLog()
    shut_down = threading.Event()
    first = create_queue_worker(
        data_source,
        stubborn,
        worker_threads=2,
        polling_interval_ms=10,
        await_termination_timeout_ms=300,
        log=log,
        on_shutdown=shut_down.set,
        **db.table_options,
    )
    try:
        first.start()
        assert wait_until(lambda: len(stubborn.started) == 2, timeout=20)
        began = time.monotonic()
        with pytest.raises(ShutdownTimeoutError, match="released back to the queue"):
            first.stop()
        assert time.monotonic() - began < 5
        assert not first.running and not shut_down.is_set()
        assert sorted(data[ev.JOB_ID] for data in log.named(ev.JOB_RELEASED)) == sorted(ids)

        # Released means claimable now, not after a TCP timeout, and not counted as an attempt.
        assert sorted(job.attempts for job in db.jobs()) == [0, 0]
        ran: list[Any] = []
        second = create_queue_worker(
            db.data_source,
            lambda job_type, payload: ran.append(payload),
            polling_interval_ms=10,
            log=RecordingLog(),
            **db.table_options,
        )
        with second:
            assert wait_until(lambda: len(db.archived_jobs()) == 2, timeout=20)
        assert sorted(ran) == [0, 1]
        assert [row.attempts for row in db.archived_jobs()] == [1, 1]

        # The old handlers return late: nothing of theirs reaches the database.
        stubborn.let_go.set()
        assert wait_until(lambda: len(log.named(ev.RELEASED_JOB_RETURNED)) == 2, timeout=20)
        assert sorted(stubborn.finished) == [0, 1]
        assert len(db.archived_jobs()) == 2 and db.jobs() == []
        assert not log.named(ev.JOB_WORKER_ERROR) and not log.named(ev.SQL_TRANSIENT_EXCEPTION)
        assert first.stop() is True  # the second stop logs already-shut-down and calls on_shutdown
        assert shut_down.is_set()
    finally:
        stubborn.let_go.set()


def test_stop_on_a_backend_that_cannot_release_still_raises_and_says_so() -> None:
    memory = builtin.memory()
    enqueue_committed(memory, "fault/stuck", 0)
    stubborn = Stubborn()
    worker = create_queue_worker(
        memory.data_source,
        stubborn,
        polling_interval_ms=10,
        await_termination_timeout_ms=100,
        log=RecordingLog(),
        **memory.table_options,
    )
    worker.start()
    try:
        assert wait_until(lambda: len(stubborn.started) == 1, timeout=20)
        with pytest.raises(ShutdownTimeoutError, match="this backend cannot release it"):
            worker.stop()
    finally:
        stubborn.let_go.set()
    assert wait_until(lambda: len(memory.archived_jobs()) == 1, timeout=20)
