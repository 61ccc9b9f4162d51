"""A worker's connection dies, times out, deadlocks or cannot be had: its job runs again, it goes on."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from fix_throwaway import ThrowawayMySQL, TrackedConnections, dsn_of, kill_connection, server_id
from support import RecordingLog, enqueue_committed, wait_until

from conformance.harness import Harness, SqlHarness
from proletarian_ref import TransientDatabaseError, create_queue_worker, enqueue
from proletarian_ref import log as ev
from proletarian_ref.backends.dsn import connection_factory
from proletarian_ref.job_ids import default_job_id_strategy

pytestmark = pytest.mark.sql_only


class FirstRunHeld:
    """A handler whose first run waits until the test has broken something, then returns normally."""

    def __init__(self, before_return: Callable[[], None] | None = None) -> None:
        self.runs: list[Any] = []
        self.started = threading.Event()
        self.go_on = threading.Event()
        self._before_return = before_return

    def __call__(self, job_type: str, payload: Any) -> None:
        self.runs.append(payload)
        if len(self.runs) == 1:
            self.started.set()
            assert self.go_on.wait(20), "the test never let the first run finish"
            if self._before_return is not None:
                self._before_return()


def sql_harness(db: Harness) -> SqlHarness:
    assert isinstance(db, SqlHarness)
    return db


def stored_id(db: SqlHarness, job_id: Any) -> Any:
    return default_job_id_strategy(db.dialect).encode_id(job_id)


def assert_ran_again_and_archived_once(db: SqlHarness, log: RecordingLog, job_id: Any, payload: Any) -> None:
    """The shared verdict: one archive row, attempts as if the broken run never happened, logged."""
    assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=30), db.jobs()
    (row,) = db.archived_jobs()
    assert row.job_id == stored_id(db, job_id)
    assert (row.status, row.attempts) == (":success", 1)
    assert db.jobs() == []
    transient = log.named(ev.SQL_TRANSIENT_EXCEPTION)
    assert transient, "the broken run must be logged"
    assert transient[0][ev.JOB_ID] == job_id, "the log must say which job was hit"
    assert isinstance(transient[0][ev.THROWABLE], TransientDatabaseError)
    assert not log.named(ev.JOB_WORKER_ERROR)


def assert_keeps_serving(db: SqlHarness, worker: Any) -> None:
    before = len(db.archived_jobs())
    enqueue_committed(db, "fault/after", "after")
    assert wait_until(lambda: len(db.archived_jobs()) == before + 1, timeout=30)
    assert worker.running


def test_a_job_whose_connection_is_killed_mid_run_runs_again_and_the_worker_carries_on(db: Harness) -> None:
    sql = sql_harness(db)
    tracked = TrackedConnections(sql.data_source)
    handler = FirstRunHeld()
    log = RecordingLog()
    job_id = enqueue_committed(sql, "fault/job", "payload")
    # No listener: on PostgreSQL its connection would come from the same factory, and the one connection
    # open here must be the job's (the wake-up has tests of its own for a killed listener).
    worker = create_queue_worker(
        tracked, handler, polling_interval_ms=10, log=log, wake_on_notify=False, **sql.table_options
    )
    with worker:
        assert handler.started.wait(20)
        (connection_id,) = tracked.open_ids()
        kill_connection(sql, connection_id)
        handler.go_on.set()
        assert_ran_again_and_archived_once(sql, log, job_id, "payload")
        assert handler.runs == ["payload", "payload"]
        assert_keeps_serving(sql, worker)


# Each entry: connection options that end an idle transaction after about a second, and a word of the
# server's message. MariaDB's idle_transaction_timeout is its equivalent of PostgreSQL's; wait_timeout
# (MySQL and MariaDB) ends any connection idle that long, an open transaction or not.
IDLE_TIMEOUTS = {
    "postgresql": [
        ("idle_in_transaction_session_timeout", {"options": "-c idle_in_transaction_session_timeout=500"})
    ],
    "mysql": [
        ("wait_timeout", {"init_command": "SET SESSION wait_timeout = 1"}),
        ("idle_transaction_timeout", {"init_command": "SET SESSION idle_transaction_timeout = 1"}),
    ],
}


def test_a_handler_outlasting_the_idle_transaction_timeout_runs_again_and_the_worker_carries_on(
    db: Harness, request: pytest.FixtureRequest
) -> None:
    """Proletarian #26: the server ends the claiming transaction while the handler runs.

    Proletarian logs job-worker-error and stops the worker. Here the error is transient: the job stays
    queued with attempts unchanged, runs again, and the worker keeps polling. A handler that always
    outlasts the timeout runs again forever, so the timeout must exceed the longest job (or be off for
    the worker's role); the log names the job each time.
    """
    sql = sql_harness(db)
    for setting, overrides in IDLE_TIMEOUTS[sql.dialect]:
        sql.clear()
        connect = connection_factory(dsn_of(request, sql), **overrides)
        try:
            connect().close()
        except Exception as exc:  # idle_transaction_timeout is MariaDB only
            assert setting == "idle_transaction_timeout", exc
            continue
        handler = FirstRunHeld(before_return=lambda: time.sleep(2.2))
        log = RecordingLog()
        job_id = enqueue_committed(sql, "fault/long", setting)
        worker = create_queue_worker(connect, handler, polling_interval_ms=10, log=log, **sql.table_options)
        with worker:
            handler.go_on.set()
            assert_ran_again_and_archived_once(sql, log, job_id, setting)
            if setting == "idle_in_transaction_session_timeout":
                assert "idle-in-transaction" in str(log.named(ev.SQL_TRANSIENT_EXCEPTION)[0][ev.THROWABLE])
            assert_keeps_serving(sql, worker)


def archive_row_sql(db: SqlHarness) -> str:
    return (
        f"INSERT INTO {db.archived_job_table} (job_id, queue, job_type, payload, attempts, status, "
        "enqueued_at, process_at, finished_at) VALUES (%s, ':q', ':t', 'p', 1, ':success', %s, %s, %s)"
    )


def lock_options(db: SqlHarness) -> dict[str, Any]:
    """The worker waits at most a second for a row lock, and checks for deadlocks quickly."""
    if db.dialect == "postgresql":
        return {"options": "-c lock_timeout=1000 -c deadlock_timeout=100"}
    return {"init_command": "SET SESSION innodb_lock_wait_timeout = 1"}


def waits_for_a_lock(db: SqlHarness, conn: Any) -> bool:
    """Whether the connection `conn` is running a statement that waits for a row lock now."""
    if db.dialect == "postgresql":
        query = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
    else:
        # MariaDB's information_schema.innodb_trx is a cache that can lag by seconds; the processlist
        # is live, and a statement still running here can only be waiting for the lock.
        query = "SELECT count(*) FROM information_schema.processlist WHERE id = %s AND command = 'Query'"
    return int(db.select(query, (server_id(conn),))[0][0]) > 0


def test_a_lock_wait_timeout_while_archiving_leaves_the_job_to_run_again(
    db: Harness, request: pytest.FixtureRequest
) -> None:
    """Another transaction holds the archive row the worker needs; the worker's wait times out.

    PostgreSQL lock_timeout (55P03) and MySQL innodb_lock_wait_timeout (1205) are transient errors: the
    claiming transaction rolls back, the job stays queued with attempts unchanged and runs again once
    the other transaction has gone.
    """
    sql = sql_harness(db)
    blocker = sql.connect()
    cursor = blocker.cursor()
    now = datetime.now(UTC).replace(microsecond=0)
    job_id = enqueue_committed(sql, "fault/locked", "locked")

    def hold_the_archive_row() -> None:
        if sql.dialect == "mysql":
            cursor.execute("SET time_zone = '+00:00'")
        cursor.execute(archive_row_sql(sql), (stored_id(sql, job_id), now, now, now))

    handler = FirstRunHeld()
    log = RecordingLog()
    connect = connection_factory(dsn_of(request, sql), **lock_options(sql))
    worker = create_queue_worker(connect, handler, polling_interval_ms=10, log=log, **sql.table_options)
    try:
        with worker:
            assert handler.started.wait(20)
            hold_the_archive_row()
            handler.go_on.set()
            assert wait_until(lambda: bool(log.named(ev.SQL_TRANSIENT_EXCEPTION)), timeout=20)
            blocker.rollback()
            assert_ran_again_and_archived_once(sql, log, job_id, "locked")
            message = str(log.named(ev.SQL_TRANSIENT_EXCEPTION)[0][ev.THROWABLE]).lower()
            assert "lock" in message
            assert_keeps_serving(sql, worker)
    finally:
        blocker.close()


def test_a_deadlock_while_archiving_leaves_the_job_to_run_again(
    db: Harness, request: pytest.FixtureRequest
) -> None:
    """The worker holds the job row, another transaction the archive row, and each wants the other's.

    The database ends one of them; when that is the worker (PostgreSQL 40P01, MySQL 1213), its claim
    rolls back, the job stays queued with attempts unchanged and runs again.
    """
    sql = sql_harness(db)
    other = sql.connect()
    cursor = other.cursor()
    now = datetime.now(UTC).replace(microsecond=0)
    job_id = enqueue_committed(sql, "fault/deadlock", "deadlock")
    key = stored_id(sql, job_id)
    other_got_row = threading.Event()

    failures: list[BaseException] = []

    def other_wants_the_job_row() -> None:
        try:
            cursor.execute(f"SELECT job_id FROM {sql.job_table} WHERE job_id = %s FOR UPDATE", (key,))
            cursor.fetchall()
        except BaseException as exc:
            failures.append(exc)
            raise
        other_got_row.set()

    handler = FirstRunHeld()
    log = RecordingLog()
    connect = connection_factory(dsn_of(request, sql), **lock_options(sql))
    worker = create_queue_worker(connect, handler, polling_interval_ms=10, log=log, **sql.table_options)
    waiter = threading.Thread(target=other_wants_the_job_row, daemon=True)
    try:
        with worker:
            assert handler.started.wait(20)
            if sql.dialect == "mysql":
                cursor.execute("SET time_zone = '+00:00'")
                # InnoDB rolls back the transaction that changed fewer rows: make that the worker.
                for _ in range(20):
                    cursor.execute(
                        f"INSERT INTO {sql.job_table} (job_id, queue, job_type, payload, attempts, "
                        "enqueued_at, process_at) VALUES (%s, ':fault/ballast', ':t', 'p', 0, %s, %s)",
                        (uuid.uuid4().bytes, now, now),
                    )
            else:
                # PostgreSQL ends the waiter whose deadlock_timeout expires first: make that the worker.
                cursor.execute("SET deadlock_timeout = '20s'")
            cursor.execute(archive_row_sql(sql), (key, now, now, now))
            waiter.start()
            assert wait_until(lambda: waits_for_a_lock(sql, other), timeout=10), failures
            handler.go_on.set()
            assert other_got_row.wait(20), "the database should have ended the worker's transaction"
            other.rollback()
            assert_ran_again_and_archived_once(sql, log, job_id, "deadlock")
            assert "deadlock" in str(log.named(ev.SQL_TRANSIENT_EXCEPTION)[0][ev.THROWABLE]).lower()
            assert_keeps_serving(sql, worker)
    finally:
        waiter.join(20)
        other.close()


def test_an_exhausted_connection_pool_makes_the_worker_wait_not_stop(pg_db: SqlHarness, pg_dsn: str) -> None:
    """Proletarian #5: more threads (and enqueuers) than pooled connections.

    A thread that gets no connection within the pool's timeout logs sql-transient-exception, waits
    (backing off up to a second) and polls again; the jobs all run and the worker keeps going.
    """
    from psycopg_pool import ConnectionPool

    sql = pg_db
    log = RecordingLog()
    ran: list[Any] = []

    def slow(job_type: str, payload: Any) -> None:
        # Longer than the pool's timeout, so threads without a connection time out while others run.
        ran.append(payload)
        time.sleep(0.3)

    with ConnectionPool(pg_dsn, min_size=2, max_size=2, timeout=0.2, open=True) as pool:
        for n in range(10):
            with pool.connection(timeout=20) as conn:
                enqueue(conn, "fault/pooled", n, job_table=sql.job_table)
        worker = create_queue_worker(
            pool, slow, worker_threads=4, polling_interval_ms=10, log=log, **sql.table_options
        )
        with worker:
            # An enqueuer shares the pool with the worker, as in Proletarian #5; it waits longer.
            for n in range(10, 20):
                with pool.connection(timeout=20) as conn:
                    enqueue(conn, "fault/pooled", n, job_table=sql.job_table)
            assert wait_until(lambda: len(sql.archived_jobs()) == 20, timeout=60)
            assert worker.running
    assert sorted(ran) == list(range(20))
    assert log.named(ev.SQL_TRANSIENT_EXCEPTION), "some thread should have found the pool empty"
    assert "couldn't get a connection" in str(log.named(ev.SQL_TRANSIENT_EXCEPTION)[0][ev.THROWABLE])
    assert not log.named(ev.JOB_WORKER_ERROR)


def test_a_connection_limit_makes_surplus_mysql_threads_wait_not_stop(
    throwaway_mysql: ThrowawayMySQL,
) -> None:
    """MySQL's own limit on a user's connections (error 1203) is transient too: the threads without a
    connection keep trying, those with one run the jobs, and the worker never stops.
    """
    server = throwaway_mysql
    admin = server.harness("proletarian.job_fault_limit", "proletarian.archived_job_fault_limit")
    user = f"fault_limited_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE USER '{user}'@'localhost' WITH MAX_USER_CONNECTIONS 2")
    admin.execute(f"GRANT ALL ON proletarian.* TO '{user}'@'localhost'")
    try:
        connect = connection_factory(f"mysql://{user}@127.0.0.1:{server.port}/proletarian")
        log = RecordingLog()
        ran: list[Any] = []
        for n in range(20):
            enqueue_committed(admin, "fault/limited", n)
        worker = create_queue_worker(
            connect,
            lambda job_type, payload: ran.append(payload),
            worker_threads=4,
            polling_interval_ms=10,
            log=log,
            **admin.table_options,
        )
        with worker:
            assert wait_until(lambda: len(admin.archived_jobs()) == 20, timeout=60)
            assert wait_until(lambda: bool(log.named(ev.SQL_TRANSIENT_EXCEPTION)), timeout=10)
            assert worker.running
        assert sorted(ran) == list(range(20))
        assert "max_user_connections" in str(log.named(ev.SQL_TRANSIENT_EXCEPTION)[0][ev.THROWABLE])
        assert not log.named(ev.JOB_WORKER_ERROR)
    finally:
        admin.execute(f"DROP USER '{user}'@'localhost'")


def test_a_read_only_server_is_transient_and_the_worker_connects_again(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    """A primary demoted by Patroni still gets connections from HAProxy until its health check notices.

    Its answer to the claim is read_only_sql_transaction (25006). The worker logs it as transient, drops
    that connection and connects again (here, as through the proxy once it has noticed, to a server that
    takes writes), and runs the job; it does not stop. The read-only server is made with
    default_transaction_read_only, which answers as a standby does. tests/test_scale_patroni.py meets
    the real thing.
    """
    sql = pg_db
    log = RecordingLog()
    ran: list[Any] = []
    read_only = connection_factory(pg_dsn, options="-c default_transaction_read_only=on")
    writable = connection_factory(pg_dsn)
    handed: list[str] = []

    def data_source() -> Any:
        # The first two connections reach the read-only server, the next ones a writable one.
        handed.append("read-only" if len(handed) < 2 else "writable")
        return read_only() if handed[-1] == "read-only" else writable()

    enqueue_committed(sql, "fault/read-only", "demoted")
    worker = create_queue_worker(
        data_source,
        lambda job_type, payload: ran.append(payload),
        worker_threads=1,
        polling_interval_ms=10,
        wake_on_notify=False,
        log=log,
        **sql.table_options,
    )
    with worker:
        assert wait_until(lambda: len(sql.archived_jobs()) == 1, timeout=30), log.events
        assert worker.running
    assert ran == ["demoted"]
    assert handed[:3] == ["read-only", "read-only", "writable"], "each read-only connection is dropped"
    transient = log.named(ev.SQL_TRANSIENT_EXCEPTION)
    assert len(transient) == 2
    assert all("ReadOnlySqlTransaction" in str(event[ev.THROWABLE]) for event in transient)
    assert not log.named(ev.JOB_WORKER_ERROR)
