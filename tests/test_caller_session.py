"""enqueue leaves the caller's session as it found it and stores the intended UTC instant (issue 11.2)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support import FakeClock

from conformance.harness import SqlHarness
from proletarian_ref import (
    DatabaseError,
    PayloadTooLargeError,
    SerializationError,
    constant_id_strategy,
    enqueue,
    enqueue_many,
)
from proletarian_ref.backends.dsn import connection_factory

# An instant with a fraction below half a second: MariaDB's truncation and MySQL's rounding store the same
# whole second, so one expected value serves both servers.
T = datetime(2026, 3, 14, 15, 9, 26, 250000, tzinfo=UTC)
ZONES = ["+05:30", "-08:00", "Europe/Oslo", "America/New_York", "SYSTEM", "+00:00"]
# The hour a daylight-saving change repeats: both instants read 02:30 (Oslo) or 01:30 (New York) locally.
REPEATED_HOURS = {
    "Europe/Oslo": (datetime(2026, 10, 25, 0, 30, 0, 250000, tzinfo=UTC), timedelta(hours=1)),
    "America/New_York": (datetime(2026, 11, 1, 5, 30, 0, 250000, tzinfo=UTC), timedelta(hours=1)),
}
# Session variables an enqueue changes by its nature, not by touching the session: the server's clock,
# the transaction the INSERT opens (it joins the caller's, so that is the point), the last generated id
# and a failed statement's diagnostics counts (where the server lists them).
VOLATILE = {
    "timestamp",
    "in_transaction",
    "last_insert_id",
    "identity",
    "insert_id",
    "warning_count",
    "error_count",
}


def mysql_session(conn: Any) -> dict[str, str]:
    with conn.cursor() as cursor:
        cursor.execute("SHOW SESSION VARIABLES")
        state = {str(name): str(value) for name, value in cursor.fetchall()}
        cursor.execute("SELECT @@autocommit, @@session.time_zone, @@sql_mode")
        autocommit, zone, mode = cursor.fetchone()
    state.update({"@@autocommit": str(autocommit), "@@session.time_zone": zone, "@@sql_mode": mode})
    for name in ("time_zone", "sql_mode", "autocommit", "character_set_client", "collation_connection"):
        assert name in state  # the snapshot covers what the issue names
    assert "tx_isolation" in state or "transaction_isolation" in state
    state["user variables"] = repr(user_variables(conn))
    return {name: value for name, value in state.items() if name not in VOLATILE}


def user_variables(conn: Any) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        try:
            cursor.execute("SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.USER_VARIABLES")
        except Exception:  # MySQL keeps them in performance_schema instead
            cursor.execute(
                "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM performance_schema.user_variables_by_thread "
                "WHERE THREAD_ID = PS_CURRENT_THREAD_ID()"
            )
        return sorted(cursor.fetchall())


@pytest.fixture(params=["server's own way", "portable way"])
def caller(request: pytest.FixtureRequest, mysql_db: SqlHarness, mysql_time_zones: str) -> Iterator[Any]:
    """A caller's connection with a user variable set; the portable way is what MySQL (not MariaDB) gets."""
    conn = mysql_db.connect()
    if request.param == "portable way":
        conn.server_version = "8.0.36"  # as MySQL's handshake reads: no SET STATEMENT
    with conn.cursor() as cursor:
        cursor.execute("SET @callers_own = 42")
    try:
        yield conn
    finally:
        conn.close()


def set_zone(conn: Any, zone: str) -> None:
    with conn.cursor() as cursor:
        cursor.execute("SET time_zone = %s", (zone,))


def stored_epochs(db: SqlHarness, column: str = "enqueued_at") -> list[int]:
    rows = db.select(f"SELECT UNIX_TIMESTAMP({column}) FROM {db.job_table} ORDER BY {column}")
    return [int(epoch) for (epoch,) in rows]


@pytest.mark.parametrize("zone", ZONES)
def test_mysql_enqueue_leaves_every_session_variable_and_stores_the_utc_instant(
    mysql_db: SqlHarness, caller: Any, zone: str
) -> None:
    set_zone(caller, zone)
    before = mysql_session(caller)
    enqueue(
        caller, "a", None, job_table=mysql_db.job_table, clock=FakeClock(T), process_in=timedelta(hours=2)
    )
    assert mysql_session(caller) == before
    caller.commit()
    assert stored_epochs(mysql_db) == [int(T.timestamp())]
    assert stored_epochs(mysql_db, "process_at") == [int(T.timestamp()) + 7200]


@pytest.mark.parametrize("zone", sorted(REPEATED_HOURS))
def test_mysql_enqueue_keeps_both_instants_of_a_repeated_daylight_saving_hour_apart(
    mysql_db: SqlHarness, caller: Any, zone: str
) -> None:
    first, gap = REPEATED_HOURS[zone]
    set_zone(caller, zone)
    with caller.cursor() as cursor:  # the two instants really do read the same in the session's zone
        cursor.execute(
            "SELECT FROM_UNIXTIME(%s) = FROM_UNIXTIME(%s)", (first.timestamp(), (first + gap).timestamp())
        )
        assert cursor.fetchone() == (1,)
    enqueue(caller, "a", None, job_table=mysql_db.job_table, clock=FakeClock(first))
    enqueue(caller, "b", None, job_table=mysql_db.job_table, clock=FakeClock(first + gap))
    caller.commit()
    assert stored_epochs(mysql_db) == [int(first.timestamp()), int((first + gap).timestamp())]


def test_mysql_enqueue_that_fails_in_the_insert_restores_the_session_and_keeps_the_transaction(
    mysql_db: SqlHarness, caller: Any
) -> None:
    set_zone(caller, "+05:30")
    strategy = constant_id_strategy(b"\x01" * 16)
    enqueue(caller, "first", None, job_table=mysql_db.job_table, job_id_strategy=strategy, clock=FakeClock(T))
    before = mysql_session(caller)
    with pytest.raises(DatabaseError, match="Duplicate entry"):
        enqueue(caller, "again", None, job_table=mysql_db.job_table, job_id_strategy=strategy)
    assert mysql_session(caller) == before
    caller.commit()  # the failed statement alone was undone: the first job is still the caller's to commit
    assert [row.job_type for row in mysql_db.jobs()] == [":first"]
    assert stored_epochs(mysql_db) == [int(T.timestamp())]


def test_mysql_enqueue_that_fails_before_sql_leaves_the_session(mysql_db: SqlHarness, caller: Any) -> None:
    set_zone(caller, "-08:00")
    before = mysql_session(caller)
    with pytest.raises(SerializationError):
        enqueue(caller, "a", object(), job_table=mysql_db.job_table)
    with pytest.raises(PayloadTooLargeError):  # after reading the columns on the caller's connection
        enqueue(caller, "a", "x" * 70_000, job_table=mysql_db.job_table)
    assert mysql_session(caller) == before


def test_mysql_enqueue_does_not_commit_the_callers_transaction(mysql_db: SqlHarness, caller: Any) -> None:
    set_zone(caller, "Europe/Oslo")
    enqueue(caller, "a", None, job_table=mysql_db.job_table)
    caller.rollback()
    assert mysql_db.jobs() == []


# PyMySQL deprecates ping(reconnect=True), yet applications still reconnect with it: this proves what the
# library does when they do, so the driver's warning is expected here.
@pytest.mark.filterwarnings("ignore:The 'reconnect' argument is deprecated:DeprecationWarning")
def test_mysql_enqueue_after_a_reconnect_to_a_non_utc_session_stores_the_utc_instant(
    mysql_db: SqlHarness, mysql_time_zones: str
) -> None:
    # The session a driver reconnects to has the server's defaults and the init_command, not what an
    # earlier enqueue saw: nothing about the session may be remembered between enqueues.
    conn = connection_factory(mysql_time_zones, init_command="SET time_zone = 'America/New_York'")()
    try:
        enqueue(conn, "before", None, job_table=mysql_db.job_table, clock=FakeClock(T))
        conn.commit()
        mysql_db.select(f"KILL {conn.thread_id()}")
        conn.ping(reconnect=True)
        enqueue(conn, "after", None, job_table=mysql_db.job_table, clock=FakeClock(T + timedelta(seconds=1)))
        conn.commit()
        assert mysql_session(conn)["time_zone"] == "America/New_York"
    finally:
        conn.close()
    assert stored_epochs(mysql_db) == [int(T.timestamp()), int(T.timestamp()) + 1]


# -- PostgreSQL ----------------------------------------------------------------------------------------


def pg_settings(conn: Any) -> dict[str, str]:
    with conn.cursor() as cursor:
        cursor.execute("SELECT name, setting FROM pg_settings")
        return dict(cursor.fetchall())


@pytest.fixture
def pg_caller(pg_db: SqlHarness) -> Iterator[Any]:
    """A caller's connection whose session differs from the server's defaults in what enqueue might touch."""
    conn = pg_db.connect()
    conn.autocommit = True
    with conn.cursor() as cursor:
        cursor.execute("SET TimeZone = 'America/New_York'")
        cursor.execute("SET search_path = pg_catalog, public")
        cursor.execute("SET DateStyle = 'SQL, DMY'")
        cursor.execute("SET IntervalStyle = 'sql_standard'")
    try:
        yield conn
    finally:
        conn.close()


def test_postgresql_enqueue_leaves_every_setting_and_stores_the_exact_instant(
    pg_db: SqlHarness, pg_caller: Any
) -> None:
    pg_caller.autocommit = False
    before = pg_settings(pg_caller)
    assert before["TimeZone"] == "America/New_York"
    enqueue(pg_caller, "a", None, job_table=pg_db.job_table, clock=FakeClock(T))
    assert pg_settings(pg_caller) == before
    pg_caller.commit()
    [row] = pg_db.jobs()
    assert row.enqueued_at == T


@pytest.mark.parametrize("notify", [True, False])
def test_postgresql_enqueue_with_or_without_notify_leaves_every_setting_and_the_transaction(
    pg_db: SqlHarness, pg_caller: Any, notify: bool
) -> None:
    pg_caller.autocommit = False
    before = pg_settings(pg_caller)
    enqueue(pg_caller, "a", None, job_table=pg_db.job_table, notify=notify)
    enqueue_many(pg_caller, [("b", 1), ("c", 2)], job_table=pg_db.job_table, notify=notify)
    assert pg_settings(pg_caller) == before
    assert pg_caller.info.transaction_status.name == "INTRANS"  # nothing committed it
    with pg_caller.cursor() as cursor:  # and nothing listens on the caller's session
        cursor.execute("SELECT count(*) FROM pg_listening_channels()")
        assert cursor.fetchone() == (0,)
    pg_caller.rollback()
    assert pg_db.jobs() == []


def test_postgresql_enqueue_that_fails_leaves_every_setting(pg_db: SqlHarness, pg_caller: Any) -> None:
    constant = uuid.UUID(int=1)
    strategy = constant_id_strategy(constant)
    enqueue(pg_caller, "first", None, job_table=pg_db.job_table, job_id_strategy=strategy)
    before = pg_settings(pg_caller)
    with pytest.raises(DatabaseError, match="duplicate key"):
        enqueue(pg_caller, "again", None, job_table=pg_db.job_table, job_id_strategy=strategy)
    with pytest.raises(SerializationError):
        enqueue(pg_caller, "bad", object(), job_table=pg_db.job_table)
    assert pg_settings(pg_caller) == before
    assert [row.job_id for row in pg_db.jobs()] == [constant]


@pytest.mark.parametrize("zone", ["+05:30", "America/New_York"])
def test_mysql_enqueue_many_leaves_every_session_variable_and_stores_the_utc_instant(
    mysql_db: SqlHarness, caller: Any, zone: str
) -> None:
    set_zone(caller, zone)
    before = mysql_session(caller)
    jobs = [("a", n) for n in range(2_500)]  # three INSERTs, within a savepoint
    enqueue_many(caller, jobs, job_table=mysql_db.job_table, clock=FakeClock(T))
    assert mysql_session(caller) == before
    with pytest.raises(PayloadTooLargeError):  # refused before any SQL: the session is left too
        enqueue_many(caller, [("a", 1), ("a", "x" * 70_000)], job_table=mysql_db.job_table)
    assert mysql_session(caller) == before
    caller.commit()
    assert stored_epochs(mysql_db) == [int(T.timestamp())] * 2_500


def test_mysql_enqueue_many_that_fails_in_the_insert_restores_the_session(
    mysql_db: SqlHarness, caller: Any
) -> None:
    set_zone(caller, "-08:00")
    before = mysql_session(caller)
    strategy = constant_id_strategy(b"\x02" * 16)
    with pytest.raises(DatabaseError, match="Duplicate entry"):
        enqueue_many(caller, [("a", 1), ("b", 2)], job_table=mysql_db.job_table, job_id_strategy=strategy)
    assert mysql_session(caller) == before
    caller.commit()
    assert mysql_db.jobs() == []
