"""stop() keeps its promise under any schedule of claim, pool wait, table lock and stop (issue 11.4).

Once stop() is called no new job is handled; after it returns or raises no claim reaches the database,
no handler starts and nothing is written; its error names what each stuck thread held, never "None".
Every handler start and end, every claim and every write is recorded with its time, and compared with
the moment stop() returned or raised. The moment stop() took effect, and each handler's admission, are
recorded under the lock the worker takes for both, so their order is the order that happened: a
handler admitted just before stop() may record its own start just after it.
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
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support import RecordingLog, enqueue_committed

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

    # Batch mode's verbs (BatchClaim), recorded as their one-job counterparts are.

    def get_next_jobs(self, conn: Any, *args: Any) -> Any:
        began = time.monotonic()
        try:
            return self.inner.get_next_jobs(conn, *args)  # type: ignore[attr-defined]
        except ConnectionReleasedError:
            raise
        finally:
            self.timeline.add("claim", began)

    def archive_jobs(self, conn: Any, *args: Any) -> None:
        self._write("archive_jobs", conn, *args)

    def delete_jobs(self, conn: Any, *args: Any) -> None:
        self._write("delete_jobs", conn, *args)


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


class LockPlan:
    """Takes the table lock when the schedule says, and lets it go when it says (or at the end)."""

    def __init__(self, db: Harness, schedule: Schedule) -> None:
        self._db = db if isinstance(db, SqlHarness) else None
        self._schedule = schedule
        self._lock: TableLock | None = None
        self._timers: list[threading.Timer] = []

    def _take(self) -> None:
        assert self._db is not None
        self._lock = TableLock(self._db)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def begin(self) -> None:
        at, hold = self._schedule.lock_at_ms, self._schedule.lock_for_ms
        if self._db is None or at is None:
            return
        if at == 0:
            self._take()
        else:
            self._timers.append(threading.Timer(at / 1000, self._take))
        if hold is not None:
            self._timers.append(threading.Timer((at + hold) / 1000, self._release))

    def start_timers(self) -> None:
        for timer in self._timers:
            timer.start()

    def finish(self) -> None:
        for timer in self._timers:
            if timer.is_alive() or timer.ident is not None:
                timer.join()
            else:
                timer.cancel()
        self._release()


def run_schedule(
    db: Harness, data_source: Any, worker_threads: int, schedule: Schedule, batch_size: int = 1
) -> None:
    db.clear()
    for n in range(schedule.jobs):
        enqueue_committed(db, "stop/schedule", n)
    timeline = Timeline()
    let_go = threading.Event()

    def handler(job_type: str, payload: int) -> None:
        timeline.add(f"handler-start {payload}")
        if schedule.handler_ms == STUBBORN:
            let_go.wait(30)
        else:
            time.sleep(schedule.handler_ms / 1000)
        timeline.add(f"handler-end {payload}")

    owned = not isinstance(data_source, Backend)
    backend = RecordingBackend(_backend_over(data_source), timeline)
    worker = create_queue_worker(
        None,
        handler,
        backend=backend,
        worker_threads=worker_threads,
        polling_interval_ms=5,
        await_termination_timeout_ms=schedule.timeout_ms,
        log=RecordingLog(),
        batch_size=batch_size,
        **db.table_options,
    )
    record_stop_and_admissions(worker, timeline)
    locks = LockPlan(db, schedule)
    error: ShutdownTimeoutError | None = None
    try:
        locks.begin()
        worker.start()
        locks.start_timers()
        time.sleep(schedule.stop_after_ms / 1000)
        try:
            worker.stop()
        except ShutdownTimeoutError as exc:
            error = exc
        stopped = time.monotonic()
    finally:
        # Let everything that was holding on finish, then look at what happened after stop().
        locks.finish()
        let_go.set()
        for thread in worker._threads:
            thread.join(30)
            assert not thread.is_alive(), f"{thread.name} never ended"
        if owned:
            backend.inner.close()
    check_nothing_happened_after(timeline, stopped, schedule, drained=error is None)
    if error is not None:
        assert "None" not in str(error)
        assert re.findall(r"proletarian\[[^\]]*\]-\d+ \(", str(error)), str(error)
    # Nothing is lost: a job is archived once (its handler finished in time) or queued, attempts 0.
    archived, queued = db.archived_jobs(), db.jobs()
    assert len(archived) + len(queued) == schedule.jobs
    assert all(row.attempts == 1 and row.status == ":success" for row in archived)
    assert all(job.attempts == 0 for job in queued)


def record_stop_and_admissions(worker: Any, timeline: Timeline) -> None:
    """Record "stop-requested" and each "admitted" handler inside the worker's lock, the one its stop
    request and its handlers' admission (may_handle) take, so their times are in the order they happened.
    """
    lock, request_stop, may_handle_for = worker._lock, worker._request_stop, worker._may_handle

    def recorded_request_stop() -> Any:
        with lock:
            listener = request_stop()
            timeline.add("stop-requested")
        return listener

    def recorded_may_handle(n: int) -> Any:
        may_handle = may_handle_for(n)

        def admit(job_context: Any) -> bool:
            with lock:
                admitted = bool(may_handle(job_context))
                if admitted:
                    timeline.add("admitted")
            return admitted

        return admit

    # Replaced on the instance before start(): each poller thread asks for its may_handle as it starts.
    worker._request_stop = recorded_request_stop
    worker._may_handle = recorded_may_handle


def check_nothing_happened_after(
    timeline: Timeline, stopped: float, schedule: Schedule, *, drained: bool
) -> None:
    """No handler was admitted once stop() had taken effect, and none started without an admission; no
    claim, write or commit came after stop() returned, nor, when it returned normally (every handler
    drained), a handler's end.
    """
    late = [e for e in timeline.after(stopped) if drained or not e.startswith("handler-end")]
    assert not late, (late, schedule)
    requested = [at for at, what in timeline.events if what == "stop-requested"]
    assert len(requested) == 1, (timeline.events, schedule)
    assert "admitted" not in timeline.after(requested[0]), schedule
    whats = [what for _, what in timeline.events]
    starts = [what for what in whats if what.startswith("handler-start")]
    assert len(starts) == whats.count("admitted"), (whats, schedule)


# The two schedules of issue 11.4, always tried: threads waiting for the pool's one connection while a
# stubborn handler holds it, and claims blocked by a table lock held past the deadline.
POOL_WAIT = Schedule(
    jobs=2, handler_ms=STUBBORN, stop_after_ms=80, timeout_ms=100, lock_at_ms=None, lock_for_ms=None
)
BLOCKED_CLAIM = Schedule(
    jobs=1, handler_ms=0, stop_after_ms=80, timeout_ms=100, lock_at_ms=0, lock_for_ms=None
)


def _backend_over(data_source: Any) -> Backend:
    from proletarian_ref.backends import backend_for_data_source

    return data_source if isinstance(data_source, Backend) else backend_for_data_source(data_source)


@settings(max_examples=6)
@given(schedule=schedules)
@example(schedule=POOL_WAIT)
@example(schedule=BLOCKED_CLAIM)
@pytest.mark.parametrize("batch_size", [1, 3], ids=["one-job-a-transaction", "batch-mode"])
def test_stop_keeps_its_promise_on_postgresql_with_a_small_pool(
    pg_db: SqlHarness, pg_dsn: str, schedule: Schedule, batch_size: int
) -> None:
    """Three threads share a pool of one or two connections, so some wait for one when stop() runs."""
    from psycopg_pool import ConnectionPool

    with ConnectionPool(pg_dsn, min_size=1, max_size=1 + schedule.jobs % 2, timeout=2, open=True) as pool:
        run_schedule(pg_db, pool, 3, schedule, batch_size)


@settings(max_examples=6)
@given(schedule=schedules)
@example(schedule=POOL_WAIT)
@example(schedule=BLOCKED_CLAIM)
@pytest.mark.parametrize("batch_size", [1, 3], ids=["one-job-a-transaction", "batch-mode"])
def test_stop_keeps_its_promise_on_mysql(mysql_db: SqlHarness, schedule: Schedule, batch_size: int) -> None:
    run_schedule(mysql_db, mysql_db.data_source, 2, schedule, batch_size)


@settings(max_examples=6)
@given(schedule=schedules.filter(lambda s: s.handler_ms != STUBBORN))
@pytest.mark.parametrize("batch_size", [1, 3], ids=["one-job-a-transaction", "batch-mode"])
def test_stop_keeps_its_promise_on_the_memory_backend(schedule: Schedule, batch_size: int) -> None:
    """The memory backend cannot release, so its handlers here all finish within the drain."""
    from conformance import builtin

    memory = builtin.memory()
    run_schedule(
        memory, memory.backend(), 2, Schedule(**{**schedule.__dict__, "timeout_ms": 5_000}), batch_size
    )


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_a_claim_blocked_at_the_deadline_is_cancelled(dialect: str, request: pytest.FixtureRequest) -> None:
    """The release cancels a claim stuck behind a table lock (psycopg's cancel; KILL QUERY from a second
    session on MySQL): the thread ends at once, while the lock is still held, instead of waiting for the
    lock and then giving the row back.
    """
    db: SqlHarness = request.getfixturevalue("pg_db" if dialect == "postgresql" else "mysql_db")
    enqueue_committed(db, "stop/blocked", 0)
    lock = TableLock(db)
    started: list[Any] = []
    worker = create_queue_worker(
        db.data_source,
        lambda job_type, payload: started.append(payload),
        polling_interval_ms=5,
        await_termination_timeout_ms=200,
        log=RecordingLog(),
        **db.table_options,
    )
    try:
        worker.start()
        time.sleep(0.2)  # the claim is now waiting for the lock
        with pytest.raises(ShutdownTimeoutError, match="no job yet: its claim was abandoned"):
            worker.stop()
        for thread in worker._threads:
            thread.join(5)
            assert not thread.is_alive(), "the blocked claim was not cancelled"
    finally:
        lock.release()
    assert started == []
    assert [job.attempts for job in db.jobs()] == [0]
