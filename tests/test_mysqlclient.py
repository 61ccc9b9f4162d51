"""mysqlclient (MySQLdb) beside PyMySQL: the same rows, byte for byte, and the caller's session left alone.

The conformance suite runs on mysqlclient too (tests/test_conformance_mysql.py, TestMySQLClient*); this file
holds what the suite does not compare: a row written through one driver against the row the other writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import MySQLdb
import pymysql
import pytest

from conformance.builtin import mysqlclient_dsn
from conformance.clocks import ManualClock
from conformance.harness import SqlHarness
from proletarian_ref import JobSpec, enqueue, enqueue_many
from proletarian_ref.backends import dialect_of_connection
from proletarian_ref.backends.dsn import connection_factory
from proletarian_ref.backends.mysql_async import aiomysql_connect_kwargs
from proletarian_ref.backends.mysql_driver import quote, transaction_open
from proletarian_ref.errors import ConfigurationError, SchemaMissingError
from proletarian_ref.job_ids import MysqlUuidStrategy
from proletarian_ref.ops.db import Tables, require_no_transaction
from proletarian_ref.ops.jobs import show_job

pytestmark = pytest.mark.mysql

NOW = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
# Every character a driver escapes in a string literal, a quote of each kind, and text outside ASCII.
AWKWARD = 'it\'s \\ "q" \n\r \x00 \x1a ünïcødé 🎉 %s %(x)s'


class NumberedIds(MysqlUuidStrategy):
    """UUIDs 1, 2, 3... so that both drivers write the same ids."""

    def __init__(self) -> None:
        self._next = 0

    def generate_id(self) -> uuid.UUID:
        self._next += 1
        return uuid.UUID(int=self._next)


@pytest.fixture
def connections(mysql_db: SqlHarness, mysql_dsn: str) -> Iterator[dict[str, Any]]:
    opened = {
        "pymysql": connection_factory(mysql_dsn)(),
        "mysqlclient": connection_factory(mysqlclient_dsn(mysql_dsn))(),
    }
    try:
        yield opened
    finally:
        for conn in opened.values():
            conn.close()


def _rows(conn: Any, harness: SqlHarness) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT HEX(job_id), queue, job_type, HEX(payload), attempts, enqueued_at, process_at "
            f"FROM {harness.table_options['job_table']} ORDER BY job_id"
        )
        return [tuple(row) for row in cursor.fetchall()]


def _write(conn: Any, harness: SqlHarness) -> None:
    # One strategy for both calls: its ids go on from enqueue's to enqueue_many's.
    options: dict[str, Any] = {
        "job_id_strategy": NumberedIds(),
        "clock": ManualClock(NOW),
        **harness.table_options,
    }
    enqueue(conn, ":app/one", {"text": AWKWARD, "n": 1}, queue=":app/q", **options)
    jobs: list[JobSpec | tuple[str, Any]] = [
        JobSpec(":app/many", {"text": AWKWARD, "i": i}, process_at=NOW) for i in range(3)
    ]
    enqueue_many(conn, [*jobs, (":app/plain", {"i": 9})], queue=":app/q", **options)
    conn.commit()


def test_a_job_enqueued_through_mysqlclient_is_the_row_pymysql_writes(
    connections: dict[str, Any], mysql_db: SqlHarness
) -> None:
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for driver, conn in connections.items():
        assert dialect_of_connection(conn) == "mysql"
        _write(conn, mysql_db)
        rows[driver] = _rows(conn, mysql_db)
        with conn.cursor() as cursor:
            cursor.execute(f"DELETE FROM {mysql_db.table_options['job_table']}")
        conn.commit()
    assert len(rows["pymysql"]) == 5
    assert rows["mysqlclient"] == rows["pymysql"]
    payloads = {bytes.fromhex(row[3]).decode() for row in rows["pymysql"]}
    # The characters a string literal escapes reached the server (Transit keeps the quote, doubles the
    # backslash and writes the others as \\u escapes): enqueue_many wrote them through mysql_driver.quote.
    assert any("it's \\\\" in text and "ünïcødé" in text for text in payloads), payloads


def test_mysqlclient_quotes_a_value_as_its_cursor_binds_it(connections: dict[str, Any]) -> None:
    conn = connections["mysqlclient"]
    values = [AWKWARD, b"\x00\xff'\\", 7, None, datetime(2026, 1, 2, 3, 4, 5, 6)]
    with conn.cursor() as cursor:
        # As the server reads them, in hex: the id's bytes are not text in the connection's encoding.
        cursor.execute("SELECT " + ", ".join(f"HEX({quote(conn)(value)})" for value in values))
        written = cursor.fetchone()
        cursor.execute("SELECT " + ", ".join(["HEX(%s)"] * len(values)), values)
        bound = cursor.fetchone()
    assert written == bound
    assert bytes.fromhex(written[0]).decode() == AWKWARD and written[1] == "00FF275C"


def test_enqueue_on_mysqlclient_leaves_the_callers_session_and_transaction_as_they_were(
    connections: dict[str, Any], mysql_db: SqlHarness
) -> None:
    conn = connections["mysqlclient"]
    with conn.cursor() as cursor:
        cursor.execute("SET time_zone = '+05:00'")
    conn.autocommit(False)
    enqueue(conn, ":app/one", {"n": 1}, clock=ManualClock(NOW), **mysql_db.table_options)
    with conn.cursor() as cursor:
        cursor.execute("SELECT @@session.time_zone")
        assert cursor.fetchone() == ("+05:00",)
    assert conn.get_autocommit() is False
    conn.rollback()  # the job was in the caller's transaction: it goes with it
    assert _rows(conn, mysql_db) == []
    assert _rows(connections["pymysql"], mysql_db) == []


def test_a_mysqlclient_error_is_translated_as_pymysqls_is(connections: dict[str, Any]) -> None:
    expected = {"pymysql": pymysql.err.ProgrammingError, "mysqlclient": MySQLdb.ProgrammingError}
    for driver, conn in connections.items():
        with pytest.raises(SchemaMissingError, match="1146") as caught:
            enqueue(conn, ":app/x", {}, job_table="proletarian.no_such_table_myc")
        conn.rollback()
        assert isinstance(caught.value.__cause__, expected[driver]), driver


def test_an_operation_on_mysqlclient_ends_its_own_read_and_never_the_callers_transaction(
    connections: dict[str, Any], mysql_db: SqlHarness
) -> None:
    # mysqlclient does not show the server's in-transaction status: MariaDB's @@in_transaction tells.
    conn = connections["mysqlclient"]
    tables = Tables.of(**mysql_db.table_options)
    job_id = enqueue(conn, ":app/one", {"n": 1}, clock=ManualClock(NOW), **mysql_db.table_options)
    assert transaction_open(conn) is True
    view = show_job(conn, job_id, tables=tables)
    assert view is not None and view.job_type == ":app/one"
    assert transaction_open(conn) is True  # the caller's, with the job in it, still open
    with pytest.raises(ConfigurationError, match="has one open"):
        require_no_transaction(conn, "mysql", "retrying")
    conn.rollback()
    assert transaction_open(conn) is False
    assert show_job(conn, job_id, tables=tables) is None
    assert transaction_open(conn) is False  # the read it began, it ended


def test_the_asyncio_worker_reads_a_mysqlclient_dsn_as_the_same_server_on_aiomysql() -> None:
    # A DSN names the threaded driver; the asyncio worker has aiomysql only (docs/mysql.md, "Drivers").
    dsn = "mysql://app:s3cret@db.example:3307/app?charset=utf8mb4&connect_timeout=5"
    assert aiomysql_connect_kwargs(mysqlclient_dsn(dsn)) == aiomysql_connect_kwargs(dsn)
