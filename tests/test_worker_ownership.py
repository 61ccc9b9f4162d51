"""A worker closes only what it opened; stop() releases its own stuck jobs and never another worker's.

Two workers on one backend (or one pool) poll two queues: stopping the idle one must leave the busy
one's job running, and a stop() that releases must release only the stopping worker's job (issue 11.5).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from support import RecordingLog, enqueue_committed, wait_until

from conformance.harness import Harness, SqlHarness
from proletarian_ref import ShutdownTimeoutError, create_queue_worker, process_next_job
from proletarian_ref import log as ev
from proletarian_ref.backend import Backend
from proletarian_ref.tables import table_name


class Gate:
    """A handler that records its payload and then waits until the test opens the gate."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.open = threading.Event()

    def __call__(self, job_type: str, payload: Any) -> None:
        self.started.append(payload)
        assert self.open.wait(30), "the test never opened the gate"


class CountingFactory:
    """A connection factory that remembers every connection it made, to see which are still open."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self.made: list[Any] = []

    def __call__(self) -> Any:
        conn = self._connect()
        self.made.append(conn)
        return conn

    def still_open(self) -> int:
        return sum(1 for conn in self.made if _is_open(conn))


def _is_open(conn: Any) -> bool:
    closed = getattr(conn, "closed", None)
    if isinstance(closed, bool):
        return not closed  # psycopg, memory
    return bool(conn.open)  # PyMySQL


class CloseSpy:
    """Wraps a Backend's close() to see whether a worker called it."""

    def __init__(self, backend: Backend) -> None:
        self.calls = 0
        original = backend.close

        def close() -> None:
            self.calls += 1
            original()

        backend.close = close  # type: ignore[method-assign]


def _worker(data_source: Any, db: Harness, queue: str, handler: Any, **options: Any) -> Any:
    return create_queue_worker(
        data_source,
        handler,
        queue=queue,
        polling_interval_ms=10,
        log=RecordingLog(),
        **db.table_options,
        **options,
    )


def check_idle_stop_leaves_the_busy_worker_alone(db: Harness, shared: Any, lent: Backend | None) -> None:
    """Stop the idle worker of two on one backend or pool; the busy one's job runs on and is archived."""
    enqueue_committed(db, "own/busy", "busy", queue="own/b")
    gate = Gate()
    idle = _worker(shared, db, "own/a", lambda job_type, payload: None)
    busy = _worker(shared, db, "own/b", gate)
    spy = CloseSpy(lent) if lent is not None else None
    try:
        idle.start()
        busy.start()
        assert wait_until(lambda: gate.started == ["busy"], timeout=20)
        assert idle.stop() is True
        assert busy.running
        gate.open.set()
        assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=20)
        [row] = db.archived_jobs()
        assert (row.queue, row.status, row.attempts) == (":own/b", ":success", 1)
        assert busy.stop() is True
        if spy is not None:
            assert spy.calls == 0, "a worker closed a backend it was lent"
    finally:
        gate.open.set()
        idle.stop()
        busy.stop()


def check_release_touches_only_the_stopping_workers_job(
    db: SqlHarness, shared: Any, lent: Backend | None
) -> None:
    """Both workers' handlers are stuck; stopping one releases its job and leaves the other's held."""
    mine = enqueue_committed(db, "own/stuck", "mine", queue="own/a")
    enqueue_committed(db, "own/stuck", "theirs", queue="own/b")
    gate_a, gate_b = Gate(), Gate()
    log_a = RecordingLog()
    a = create_queue_worker(
        shared,
        gate_a,
        queue="own/a",
        polling_interval_ms=10,
        await_termination_timeout_ms=200,
        log=log_a,
        **db.table_options,
    )
    b = _worker(shared, db, "own/b", gate_b)
    try:
        a.start()
        b.start()
        assert wait_until(lambda: gate_a.started == ["mine"] and gate_b.started == ["theirs"], timeout=20)
        with pytest.raises(ShutdownTimeoutError, match="released back to the queue"):
            a.stop()
        assert [data[ev.JOB_ID] for data in log_a.named(ev.JOB_RELEASED)] == [mine]
        # The released job is claimable at once by someone else, attempts unchanged ...
        ran: list[Any] = []
        with _worker(db.data_source, db, "own/a", lambda job_type, payload: ran.append(payload)):
            assert wait_until(lambda: ran == ["mine"], timeout=20)
        # ... while the other worker's job is still its own: its handler finishes and it is archived.
        assert b.running
        gate_b.open.set()
        assert wait_until(lambda: len(db.archived_jobs()) == 2, timeout=20)
        rows = {row.queue: (row.status, row.attempts) for row in db.archived_jobs()}
        assert rows == {":own/a": (":success", 1), ":own/b": (":success", 1)}
        assert b.stop() is True
    finally:
        gate_a.open.set()
        gate_b.open.set()
        b.stop()


def test_stopping_the_idle_worker_of_two_on_one_backend_leaves_the_busy_one_running(db: Harness) -> None:
    backend = db.make_backend()
    try:
        check_idle_stop_leaves_the_busy_worker_alone(db, backend, backend)
    finally:
        backend.close()


@pytest.mark.sql_only
def test_a_stop_that_releases_on_a_shared_backend_releases_only_its_own_job(db: Harness) -> None:
    assert isinstance(db, SqlHarness)
    backend = db.make_backend()
    try:
        check_release_touches_only_the_stopping_workers_job(db, backend, backend)
        # The backend still works for its owner after both workers stopped.
        with backend.transaction() as conn:
            assert backend.get_next_job(conn, table_name(db.job_table), ":own/none", _now()) is None
    finally:
        backend.close()


def test_two_workers_on_one_pool_stop_independently_and_leave_the_pool_open(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    from psycopg_pool import ConnectionPool

    with ConnectionPool(pg_dsn, min_size=1, max_size=4, open=True) as pool:
        check_idle_stop_leaves_the_busy_worker_alone(pg_db, pool, None)
        pg_db.clear()
        check_release_touches_only_the_stopping_workers_job(pg_db, pool, None)
        assert not pool.closed
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.sql_only
def test_a_worker_closes_the_connections_it_opened_from_a_factory_and_nothing_else(db: Harness) -> None:
    """From a factory the worker opens its own connections, and stop() closes every one of them.

    On a lent backend its threads close the connections they opened as they end, and only those: the
    other worker's stay open until that one stops, and the backend itself is never closed.
    """
    assert isinstance(db, SqlHarness)
    # On PostgreSQL a worker also listens (wake_on_notify): its listener's connection is its own too, and
    # the listener's test notification goes out on a connection opened and closed for it.
    listening = db.dialect == "postgresql"
    own = CountingFactory(db.connect)
    with _worker(own, db, "own/a", lambda job_type, payload: None, worker_threads=2):
        assert wait_until(lambda: len(own.made) == (4 if listening else 2), timeout=20)
        assert wait_until(lambda: own.still_open() == (3 if listening else 2), timeout=20)
    assert own.made and own.still_open() == 0

    shared = CountingFactory(db.connect)
    backend_class: Any = type(db.make_backend())
    backend = backend_class(shared)  # over the counting factory, lent to both workers
    spy = CloseSpy(backend)
    a = _worker(None, db, "own/a", lambda job_type, payload: None, backend=backend)
    b = _worker(backend, db, "own/b", lambda job_type, payload: None)
    try:
        a.start()
        b.start()
        assert wait_until(lambda: len(shared.made) == (6 if listening else 2), timeout=20)
        assert wait_until(lambda: shared.still_open() == (4 if listening else 2), timeout=20)
        assert a.stop() is True
        assert shared.still_open() == (2 if listening else 1)
        assert b.stop() is True
        assert shared.still_open() == 0
        assert spy.calls == 0
    finally:
        a.stop()
        b.stop()
        backend.close()


def test_process_next_job_never_closes_a_backend_it_was_given(db: Harness) -> None:
    backend = db.make_backend()
    spy = CloseSpy(backend)
    try:
        enqueue_committed(db, "own/once", 1)
        assert process_next_job(backend, lambda job_type, payload: None, **db.table_options) is True
        assert (
            process_next_job(None, lambda job_type, payload: None, backend=backend, **db.table_options)
            is None
        )
        assert spy.calls == 0
    finally:
        backend.close()


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
