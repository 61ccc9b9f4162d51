"""stop() keeps its promise under any schedule of claim, pool wait, table lock and stop (issue 11.4).

Once stop() is called no new job is handled; after it returns or raises no claim reaches the database,
no handler starts and nothing is written; its error names what each stuck thread held, never "None".
Every handler start and end, every claim and every write is recorded with its time, and compared with
the moment stop() returned or raised.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import RecordingLog, enqueue_committed, wait_until

from conformance.harness import Harness, SqlHarness
from proletarian_ref import ShutdownTimeoutError, create_queue_worker
from proletarian_ref.backend import Backend
from proletarian_ref.backends._dbapi import ConnectionReleasedError

STUBBORN = -1  # a handler duration: runs until the test lets it go, ignoring the stop request


@dataclass
class Timeline:
    """What happened when, in time.monotonic() seconds."""

    events: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str, at: float | None = None) -> None:
        with self.lock:
            self.events.append((time.monotonic() if at is None else at, what))

    def after(self, moment: float) -> list[str]:
        with self.lock:
            return [what for at, what in self.events if at > moment]


class RecordingBackend:
    """A lent backend that records each claim that reached the database, each write and each commit."""

    def __init__(self, inner: Backend, timeline: Timeline) -> None:
        self.inner = inner
        self.timeline = timeline
        self._wrote = threading.local()

    def __getattr__(self, name: str) -> Any:  # release_connection, close_thread_connection, dialect ...
        return getattr(self.inner, name)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        self._wrote.value = False
        with self.inner.transaction() as conn:
            yield conn
        if self._wrote.value:
            self.timeline.add("commit")

    def get_next_job(self, conn: Any, *args: Any) -> Any:
        began = time.monotonic()
        try:
            return self.inner.get_next_job(conn, *args)
        except ConnectionReleasedError:
            raise  # refused before it was sent: no claim reached the database
        finally:
            self.timeline.add("claim", began)

    def _write(self, name: str, conn: Any, *args: Any) -> None:
        getattr(self.inner, name)(conn, *args)
        self._wrote.value = True
        self.timeline.add(name)

    def archive_job(self, conn: Any, *args: Any) -> None:
        self._write("archive_job", conn, *args)

    def delete_job(self, conn: Any, *args: Any) -> None:
        self._write("delete_job", conn, *args)

    def retry_at(self, conn: Any, *args: Any) -> None:
        self._write("retry_at", conn, *args)


@dataclass(frozen=True)
class Schedule:
    jobs: int
    handler_ms: int
    stop_after_ms: int
    timeout_ms: int
    lock_at_ms: int | None  # when another session locks the job table, if it does
    lock_for_ms: int | None  # how long; None holds it until after stop()


schedules = st.builds(
    Schedule,
    jobs=st.integers(0, 3),
    handler_ms=st.sampled_from([0, 40, STUBBORN]),
    stop_after_ms=st.sampled_from([0, 20, 80, 200]),
    timeout_ms=st.sampled_from([0, 100, 300]),
    lock_at_ms=st.sampled_from([None, 0, 30]),
    lock_for_ms=st.sampled_from([60, None]),
)


class TableLock:
    """Another session holding the job table's strongest lock, which blocks even SKIP LOCKED claims."""

    def __init__(self, db: SqlHarness) -> None:
        self.dialect = db.dialect
        self._guard = threading.Lock()
        self.conn: Any = db.connect()
        cursor = self.conn.cursor()
        if db.dialect == "postgresql":
            cursor.execute(f"LOCK TABLE {db.job_table} IN ACCESS EXCLUSIVE MODE")
        else:
            # LOCK TABLES wants every table the session then touches; the job table is all it needs.
            cursor.execute(f"LOCK TABLES {db.job_table} WRITE")
        cursor.close()

    def release(self) -> None:
        with self._guard:
            conn, self.conn = self.conn, None
        if conn is None:
            return
        if self.dialect == "mysql":
            cursor = conn.cursor()
            cursor.execute("UNLOCK TABLES")
            cursor.close()
        conn.rollback()
        conn.close()


def run_schedule(db: Harness, data_source: Any, worker_threads: int, schedule: Schedule) -> None:
    db.clear()
    for n in range(schedule.jobs):
        enqueue_committed(db, "stop/schedule", n)
    timeline = Timeline()
    let_go = threading.Event()
    handled: list[int] = []

    def handler(job_type: str, payload: int) -> None:
        timeline.add(f"handler-start {payload}")
        handled.append(payload)
        if schedule.handler_ms == STUBBORN:
            let_go.wait(30)
        else:
            time.sleep(schedule.handler_ms / 1000)
        timeline.add(f"handler-end {payload}")

    inner = data_source if isinstance(data_source, Backend) else None
    backend = RecordingBackend(inner if inner is not None else _backend_over(data_source), timeline)
    worker = create_queue_worker(
        None,
        handler,
        backend=backend,  # type: ignore[arg-type]
        worker_threads=worker_threads,
        polling_interval_ms=5,
        await_termination_timeout_ms=schedule.timeout_ms,
        log=RecordingLog(),
        **db.table_options,
    )
    lock: TableLock | None = None
    timers: list[threading.Timer] = []
    try:
        if schedule.lock_at_ms is not None and isinstance(db, SqlHarness):

            def take_lock() -> None:
                nonlocal lock
                lock = TableLock(db)

            if schedule.lock_at_ms == 0:
                take_lock()
            else:
                timers.append(threading.Timer(schedule.lock_at_ms / 1000, take_lock))
        worker.start()
        for timer in timers:
            timer.start()
        if schedule.lock_for_ms is not None and schedule.lock_at_ms is not None:
            release_at = (schedule.lock_at_ms + schedule.lock_for_ms) / 1000
            timers.append(threading.Timer(release_at, lambda: lock and lock.release()))
            timers[-1].start()
        time.sleep(schedule.stop_after_ms / 1000)
        stop_called = time.monotonic()
        error: ShutdownTimeoutError | None = None
        try:
            worker.stop()
        except ShutdownTimeoutError as exc:
            error = exc
        stopped = time.monotonic()
        # Let everything that was holding on finish, then look at what happened after stop().
        for timer in timers:
            timer.join()
        if lock is not None:
            lock.release()
        let_go.set()
        for thread in worker._threads:
            thread.join(30)
            assert not thread.is_alive(), f"{thread.name} never ended"
    finally:
        for timer in timers:
            timer.cancel()
        if lock is not None:
            lock.release()
        let_go.set()

    late = timeline.after(stopped)
    assert not [e for e in late if e.startswith(("handler-start", "claim", "archive", "delete", "commit"))], (
        late,
        schedule,
    )
    assert not [e for e in timeline.after(stop_called) if e.startswith("handler-start")], schedule
    if error is not None:
        message = str(error)
        assert "None" not in message
        names = re.findall(r"proletarian\[[^\]]*\]-\d+ \(", message)
        assert names, message
    # Nothing is lost: a job is archived once (its handler finished in time) or queued, attempts 0.
    archived = db.archived_jobs()
    queued = db.jobs()
    assert len(archived) + len(queued) == schedule.jobs
    assert all(row.attempts == 1 and row.status == ":success" for row in archived)
    assert all(job.attempts == 0 for job in queued)
    if not isinstance(data_source, Backend):
        backend.inner.close()


def _backend_over(data_source: Any) -> Backend:
    from proletarian_ref.backends import backend_for_data_source

    return backend_for_data_source(data_source)


@settings(max_examples=8)
@given(schedule=schedules)
def test_stop_keeps_its_promise_on_postgresql_with_a_small_pool(
    pg_db: SqlHarness, pg_dsn: str, schedule: Schedule
) -> None:
    """Three threads share a pool of one or two connections, so some wait for one when stop() runs."""
    from psycopg_pool import ConnectionPool

    with ConnectionPool(pg_dsn, min_size=1, max_size=1 + schedule.jobs % 2, timeout=2, open=True) as pool:
        run_schedule(pg_db, pool, 3, schedule)


@settings(max_examples=8)
@given(schedule=schedules)
def test_stop_keeps_its_promise_on_mysql(mysql_db: SqlHarness, schedule: Schedule) -> None:
    run_schedule(mysql_db, mysql_db.data_source, 2, schedule)


@settings(max_examples=8)
@given(schedule=schedules.filter(lambda s: s.handler_ms != STUBBORN))
def test_stop_keeps_its_promise_on_the_memory_backend(schedule: Schedule) -> None:
    """The memory backend cannot release, so its handlers here all finish within the drain."""
    from conformance import builtin

    memory = builtin.memory()
    run_schedule(memory, memory.backend(), 2, Schedule(**{**schedule.__dict__, "timeout_ms": 5_000}))
