"""MySQL timestamps: exact instants go to the server, which stores them as it does Proletarian's (11.6)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from support import wait_until

from conformance.builtin import MYSQL_ENV
from conformance.harness import SqlHarness
from proletarian_ref import ConfigurationError, create_queue_worker, enqueue, sql
from proletarian_ref.backend import JobRecord
from proletarian_ref.backends.dsn import connection_factory
from proletarian_ref.backends.mysql import TIMESTAMP_MAX, TIMESTAMP_MIN, MySQLBackend
from proletarian_ref.tables import TableName

EXACT = datetime(2026, 1, 1, 0, 0, 0, 999999, tzinfo=UTC)
TABLE = TableName("proletarian", "job")
ARCHIVE = TableName("proletarian", "archived_job")
# enqueue binds its values by position, in the order of the enqueue statement's placeholders.
ENQUEUE_NAMES = sql.positional(sql.render("mysql", "enqueue", TABLE))[1]


class RecordingConnection:
    """Takes statements as a MariaDB connection would and keeps the parameters sent."""

    server_version = "5.5.5-10.11.19-MariaDB"

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def cursor(self, *_: Any) -> RecordingConnection:
        return self

    def execute(self, statement: str, params: dict[str, Any] | tuple[Any, ...]) -> None:
        self.sent.append(
            params if isinstance(params, dict) else dict(zip(ENQUEUE_NAMES, params, strict=True))
        )

    rowcount = 1

    def fetchone(self) -> None:
        return None

    def close(self) -> None:
        pass


def test_mysql_sends_the_exact_instants_as_connector_j_sends_proletarians() -> None:
    # Proletarian's setTimestamp with a UTC Calendar sends the UTC wall clock with its fraction; the
    # server, not the library, makes it whole seconds. So every value sent is the instant, unrounded.
    backend, conn = MySQLBackend(), RecordingConnection()
    later = EXACT + timedelta(seconds=1, microseconds=500001)
    job = JobRecord(b"\x01" * 16, ":q", ":t", "[]", 0, EXACT, later)
    backend.enqueue(conn, TABLE, job)
    backend.get_next_job(conn, TABLE, ":q", EXACT)
    backend.retry_at(conn, TABLE, job.job_id, later)
    backend.archive_job(conn, TABLE, ARCHIVE, job.job_id, ":failure", later)
    naive, naive_later = EXACT.replace(tzinfo=None), later.replace(tzinfo=None)
    enqueued, claimed, retried, archived = conn.sent
    assert (enqueued["enqueued_at"], enqueued["process_at"]) == (naive, naive_later)
    assert claimed["now"] == naive
    assert retried["retry_at"] == naive_later
    assert archived["finished_at"] == naive_later


def test_mysql_sends_an_aware_instant_in_another_zone_as_its_utc_wall_clock() -> None:
    two_hours_east = EXACT.astimezone(timezone(timedelta(hours=2)))
    assert MySQLBackend()._db_time(two_hours_east) == EXACT.replace(tzinfo=None)


@pytest.mark.parametrize(
    "instant",
    [
        TIMESTAMP_MIN - timedelta(microseconds=1),
        TIMESTAMP_MAX + timedelta(microseconds=1),  # MySQL would round 03:14:07.5 up, past the end
        datetime(2100, 1, 1),
    ],
)
def test_mysql_refuses_an_instant_timestamp_cannot_hold_before_any_sql(instant: datetime) -> None:
    conn = RecordingConnection()
    job = JobRecord(b"\x01" * 16, ":q", ":t", "[]", 0, EXACT, instant.replace(tzinfo=UTC))
    with pytest.raises(ConfigurationError, match="outside what MySQL's TIMESTAMP column can hold"):
        MySQLBackend().enqueue(conn, TABLE, job)
    assert conn.sent == []


def test_mysql_takes_both_ends_of_timestamp() -> None:
    backend = MySQLBackend()
    assert backend._db_time(TIMESTAMP_MIN.replace(tzinfo=UTC)) == TIMESTAMP_MIN
    assert backend._db_time(TIMESTAMP_MAX.replace(tzinfo=UTC)) == TIMESTAMP_MAX


def test_mysql_job_retried_twice_after_one_second_ends_two_seconds_after_it_was_enqueued(
    mysql_db: SqlHarness,
) -> None:
    """Proletarian's worker on MySQL archives this job with process_at - enqueued_at = 2 s; so must ours.

    Let W be the server's whole-second mapping (MariaDB truncates, MySQL rounds): monotone, with
    W(x + 1) = W(x) + 1. The job is enqueued at t0 and fails at t1 and t2, each failure setting
    process_at = W(t + 1 s). Stored: enqueued_at = W(t0), final process_at = W(t2) + 1.
    Lower bound: the second run needs the claim's now >= W(t1) + 1 >= W(t0) + 1, so t2 >= W(t0) + 1 and
    W(t2) >= W(t0) + 1: the difference is at least 2 s.
    Upper bound: with L the polling interval plus a claim's and a handler's latency, t1 <= t0 + L and
    t2 <= W(t1) + 1 + L <= t1 + 1.5 + L, so t2 - t0 <= 1.5 + 2L. As W(t2) - W(t0) < t2 - t0 + 1 and is
    whole, the difference is at most 3 s while 2L < 0.5 s. Rounding scheduled times up (the old way)
    gave 4 s. Starting just after a whole second makes 2 s the usual outcome on either server.
    """
    runs: list[float] = []

    def fail(job_type: str, payload: Any) -> None:
        runs.append(time.time())
        raise RuntimeError("fails every time")

    worker = create_queue_worker(
        mysql_db.data_source,
        fail,
        job_table=mysql_db.job_table,
        archived_job_table=mysql_db.archived_job_table,
        retry_strategy_fn=lambda job, exc: {"retries": 2, "delays": [1000]},
        polling_interval_ms=20,
    )
    worker.start()
    try:
        while time.time() % 1 > 0.05:  # just after a whole second
            time.sleep(0.01)
        conn = mysql_db.connect()
        try:
            enqueue(conn, "flaky", None, job_table=mysql_db.job_table)
            conn.commit()
        finally:
            conn.close()
        assert wait_until(lambda: len(mysql_db.archived_jobs()) == 1, timeout=15)
    finally:
        worker.stop()
    [archived] = mysql_db.archived_jobs()
    assert (archived.status, archived.attempts, len(runs)) == (":failure", 3, 3)
    waited = archived.process_at - archived.enqueued_at
    assert timedelta(seconds=2) <= waited <= timedelta(seconds=3), (waited, runs)


# PyMySQL deprecates ping(reconnect=True), yet applications still reconnect with it: this proves what the
# library does when they do, so the driver's warning is expected here.
@pytest.mark.filterwarnings("ignore:The 'reconnect' argument is deprecated:DeprecationWarning")
def test_mysql_worker_connection_is_set_to_utc_again_after_the_driver_reconnects(
    mysql_db: SqlHarness,
) -> None:
    # A reconnected session has the server's defaults and the init_command: '+05:30' here, in which the
    # worker's exact UTC values would be read five and a half hours off.
    conn = connection_factory(os.environ[MYSQL_ENV], init_command="SET time_zone = '+05:30'")()
    backend = MySQLBackend(first_connection=conn)
    try:
        zones = []
        for reconnect in (False, True):
            if reconnect:
                mysql_db.select(f"KILL {conn.thread_id()}")
                conn.ping(reconnect=True)
            with backend.transaction() as same, same.cursor() as cursor:
                cursor.execute("SELECT @@session.time_zone")
                zones.append(cursor.fetchone()[0])
        assert zones == ["+00:00", "+00:00"]
    finally:
        backend.close()
