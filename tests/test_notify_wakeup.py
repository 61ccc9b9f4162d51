"""Instant wake-up (issue 14.3): enqueue with notify wakes a listening worker; polling stays the fallback."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import pytest
from support import RecordingLog, enqueue_committed, wait_until

from conformance.harness import Harness, MemoryHarness, SqlHarness
from proletarian_ref import ConfigurationError, create_queue_worker, enqueue, enqueue_many
from proletarian_ref import log as ev
from proletarian_ref.backend import Listener, Notifications
from proletarian_ref.backends.postgres import notification_channel
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text
from proletarian_ref.tables import table_name
from proletarian_ref.worker import QueueWorker

# A polling interval no test waits out: a job that runs within the test's wait was woken, not polled.
NEVER_MS = 60_000
# A generous bound on a behaviour, not a timing claim: far below NEVER_MS, far above a wake-up.
WOKEN_WITHIN_S = 5.0


@pytest.fixture(params=["memory", "postgresql"])
def ndb(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """A backend that can announce jobs: the in-memory one and PostgreSQL."""
    if request.param == "memory":
        harness: Harness = MemoryHarness()
    else:
        harness = request.getfixturevalue("pg_db")
    try:
        yield harness
    finally:
        harness.close()


def _worker(db: Harness, done: list[Any], log: RecordingLog, **options: Any) -> QueueWorker:
    return create_queue_worker(
        db.data_source,
        lambda job_type, payload: done.append(payload),
        log=log,
        await_termination_timeout_ms=5_000,
        **db.table_options,
        **options,
    )


def _listener(db: Harness, queue: str = DEFAULT_QUEUE) -> Listener:
    backend = db.backend()
    assert isinstance(backend, Notifications)
    return backend.listen(table_name(db.job_table), to_keyword_text(queue, what="queue"))


def _listening_pids(db: SqlHarness) -> list[int]:
    statement = f'LISTEN "{notification_channel(table_name(db.job_table))}"'
    rows = db.select("SELECT pid FROM pg_stat_activity WHERE query = %s", (statement,))
    return [int(pid) for (pid,) in rows]


def test_a_notified_job_starts_without_waiting_for_the_polling_interval(ndb: Harness) -> None:
    done: list[Any] = []
    log = RecordingLog()
    with _worker(ndb, done, log, polling_interval_ms=NEVER_MS, worker_threads=2):
        assert wait_until(lambda: bool(log.named(ev.LISTENING_FOR_JOBS)))
        enqueue_committed(ndb, "a", 1, notify=True)
        assert wait_until(lambda: done == [1], timeout=WOKEN_WITHIN_S)
        enqueue_committed(ndb, "a", 2, notify=True)  # a worker woken once is woken again
        assert wait_until(lambda: done == [1, 2], timeout=WOKEN_WITHIN_S)
    assert not log.named(ev.LISTENER_UNCONFIRMED)  # its test notification came back


def test_a_batch_announced_once_is_run_whole_by_threads_that_wake_each_other(ndb: Harness) -> None:
    done: list[Any] = []
    log = RecordingLog()
    with _worker(ndb, done, log, polling_interval_ms=NEVER_MS, worker_threads=3):
        assert wait_until(lambda: bool(log.named(ev.LISTENING_FOR_JOBS)))
        conn = ndb.connect()
        try:
            enqueue_many(conn, [("a", n) for n in range(20)], job_table=ndb.job_table, notify=True)
            conn.commit()
        finally:
            conn.close()
        assert wait_until(lambda: sorted(done) == list(range(20)), timeout=WOKEN_WITHIN_S)


def test_a_job_enqueued_without_notify_still_runs_by_polling(ndb: Harness) -> None:
    done: list[Any] = []
    log = RecordingLog()
    with _worker(ndb, done, log, polling_interval_ms=200):
        assert wait_until(lambda: bool(log.named(ev.LISTENING_FOR_JOBS)))
        enqueue_committed(ndb, "a", "polled", notify=False)
        assert wait_until(lambda: done == ["polled"])


def test_a_rolled_back_enqueue_announces_nothing_and_a_committed_one_does(ndb: Harness) -> None:
    listener = _listener(ndb)
    try:
        conn = ndb.connect()
        try:
            enqueue(conn, "a", 1, job_table=ndb.job_table, notify=True)
            conn.rollback()
            # No wait is long enough to prove absence; a commit that follows shows delivery works.
            assert listener.wait(0.5) is False
            enqueue(conn, "a", 2, job_table=ndb.job_table, notify=True)
            conn.commit()
            assert listener.wait(WOKEN_WITHIN_S) is True
        finally:
            conn.close()
    finally:
        listener.close()


def test_a_job_for_another_queue_or_for_later_does_not_wake_the_listener(ndb: Harness) -> None:
    listener = _listener(ndb, "mine")
    try:
        enqueue_committed(ndb, "a", 1, queue="other", notify=True)
        enqueue_committed(ndb, "a", 2, queue="mine", process_in=timedelta(hours=1), notify=True)
        assert listener.wait(0.5) is False
        enqueue_committed(ndb, "a", 3, queue="mine", notify=True)
        assert listener.wait(WOKEN_WITHIN_S) is True
    finally:
        listener.close()


def test_a_killed_listener_connection_is_opened_again_and_wakes_the_worker(ndb: Harness) -> None:
    done: list[Any] = []
    log = RecordingLog()
    with _worker(ndb, done, log, polling_interval_ms=NEVER_MS):
        assert wait_until(lambda: len(log.named(ev.LISTENING_FOR_JOBS)) == 1)
        if isinstance(ndb, SqlHarness):
            assert wait_until(lambda: len(_listening_pids(ndb)) == 1)
            ndb.kill_session(_listening_pids(ndb)[0])
        else:
            [listener] = cast(MemoryHarness, ndb).memory.listeners
            listener.kill()
        assert wait_until(lambda: len(log.named(ev.LISTENING_FOR_JOBS)) == 2)
        [error] = log.named(ev.LISTENER_ERROR)
        assert isinstance(error[ev.THROWABLE], Exception) and error["retry-in-ms"] == 100
        enqueue_committed(ndb, "a", "after", notify=True)
        assert wait_until(lambda: done == ["after"], timeout=WOKEN_WITHIN_S)


def test_stop_closes_the_listener_connection(ndb: Harness) -> None:
    log = RecordingLog()
    worker = _worker(ndb, [], log, polling_interval_ms=NEVER_MS)
    worker.start()
    try:
        assert wait_until(lambda: bool(log.named(ev.LISTENING_FOR_JOBS)))
        if isinstance(ndb, SqlHarness):
            assert wait_until(lambda: len(_listening_pids(ndb)) == 1)
    finally:
        worker.stop()
    if isinstance(ndb, SqlHarness):
        assert wait_until(lambda: _listening_pids(ndb) == [])
    else:
        assert cast(MemoryHarness, ndb).memory.listeners == []


def test_wake_on_notify_false_opens_no_listener(ndb: Harness) -> None:
    log = RecordingLog()
    done: list[Any] = []
    with _worker(ndb, done, log, polling_interval_ms=100, wake_on_notify=False):
        enqueue_committed(ndb, "a", 1, notify=True)
        assert wait_until(lambda: done == [1])
    assert log.named(ev.LISTENING_FOR_JOBS) == []


def test_mysql_accepts_both_options_and_runs_jobs_by_polling(mysql_db: SqlHarness) -> None:
    done: list[Any] = []
    log = RecordingLog()
    with _worker(mysql_db, done, log, polling_interval_ms=100, wake_on_notify=True):
        enqueue_committed(mysql_db, "a", 1, notify=True)
        conn = mysql_db.connect()
        try:
            enqueue_many(conn, [("a", 2)], job_table=mysql_db.job_table, notify=True)
            conn.commit()
        finally:
            conn.close()
        assert wait_until(lambda: sorted(done) == [1, 2])
    assert log.named(ev.LISTENING_FOR_JOBS) == []


def test_notify_and_wake_on_notify_must_be_booleans(ndb: Harness) -> None:
    conn = ndb.connect()
    try:
        with pytest.raises(ConfigurationError, match="notify must be True or False"):
            enqueue(conn, "a", 1, job_table=ndb.job_table, notify="yes")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="notify must be True or False"):
            enqueue_many(conn, [("a", 1)], job_table=ndb.job_table, notify=1)  # type: ignore[arg-type]
    finally:
        conn.close()
    with pytest.raises(ConfigurationError, match="wake_on_notify must be True or False"):
        create_queue_worker(ndb.data_source, print, wake_on_notify=None)  # type: ignore[arg-type]


def test_channel_names_fold_case_and_stay_within_63_bytes() -> None:
    assert notification_channel(table_name("Proletarian.Job")) == "proletarian.proletarian.job"
    long = notification_channel(table_name("s" * 60 + "." + "t" * 60))
    assert len(long) <= 63 and long.startswith("proletarian.")
    assert long != notification_channel(table_name("s" * 60 + "." + "t" * 59 + "u"))


def test_a_pool_lends_no_connection_to_the_listener(pg_db: SqlHarness, pg_dsn: str) -> None:
    from psycopg_pool import ConnectionPool

    done: list[Any] = []
    log = RecordingLog()
    # One connection in the pool, one worker thread: a listener holding it would starve the thread.
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, timeout=2, open=True) as pool:
        worker = create_queue_worker(
            pool,
            lambda job_type, payload: done.append(payload),
            log=log,
            polling_interval_ms=NEVER_MS,
            **pg_db.table_options,
        )
        with worker:
            assert wait_until(lambda: bool(log.named(ev.LISTENING_FOR_JOBS)))
            with pool.connection() as conn:
                enqueue(conn, "a", "pooled", job_table=pg_db.job_table, notify=True)
            assert wait_until(lambda: done == ["pooled"], timeout=WOKEN_WITHIN_S)
        assert wait_until(lambda: _listening_pids(pg_db) == [])
        assert not log.named(ev.SQL_TRANSIENT_EXCEPTION)
        assert pool.get_stats()["pool_size"] == 1


def test_listen_data_source_gives_the_listener_its_own_connections(pg_db: SqlHarness) -> None:
    opened: list[Any] = []
    done: list[Any] = []
    log = RecordingLog()

    def listen_source() -> Any:
        conn = pg_db.connect()
        opened.append(conn)
        return conn

    with _worker(pg_db, done, log, polling_interval_ms=NEVER_MS, listen_data_source=listen_source):
        assert wait_until(lambda: bool(log.named(ev.LISTENING_FOR_JOBS)))
        enqueue_committed(pg_db, "a", 1, notify=True)
        assert wait_until(lambda: done == [1], timeout=WOKEN_WITHIN_S)
    assert len(opened) == 1 and opened[0].closed


def test_interrupt_ends_a_listeners_wait_at_once_and_every_later_one(ndb: Harness) -> None:
    import threading

    listener = _listener(ndb)
    results: list[bool] = []
    try:
        waiting = threading.Thread(target=lambda: results.append(listener.wait(NEVER_MS / 1000)))
        waiting.start()
        listener.interrupt()
        waiting.join(WOKEN_WITHIN_S)
        assert not waiting.is_alive() and results == [False]
        assert listener.wait(NEVER_MS / 1000) is False  # interrupted for good: stop() may come first
    finally:
        listener.close()
    listener.interrupt()  # after close: nothing to write to, and no error
