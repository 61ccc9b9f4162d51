"""What the operations share: their named SQL, UTC times as each driver binds them, job ids, statements."""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any, Final

from proletarian_ref.backends.mysql_driver import DRIVER_MODULES, driver_of, transaction_open
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.sql import parse_named_blocks, read_sql_file
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName, table_name

# SERVER_STATUS_IN_TRANS in the MySQL protocol's status flags; psycopg's TransactionStatus.IDLE.
_PG_IDLE: Final = 0
# Connections whose open transaction an operation began: the only ones end_read and commits may end.
_begun: weakref.WeakSet[Any] = weakref.WeakSet()


@dataclass(frozen=True, slots=True)
class Tables:
    """The job table and the archive an operation works on, both validated."""

    job: TableName
    archived: TableName

    @classmethod
    def of(
        cls,
        job_table: str | TableName = DEFAULT_JOB_TABLE,
        archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    ) -> Tables:
        return cls(
            table_name(job_table, option="job_table"),
            table_name(archived_job_table, option="archived_job_table"),
        )


@cache
def statements(dialect: str, filename: str) -> dict[str, str]:
    return parse_named_blocks(read_sql_file(dialect, filename))


def render(dialect: str, filename: str, name: str, tables: Tables) -> str:
    # Only TableName values reach the text: they are validated identifiers, never user-quoted strings.
    return statements(dialect, filename)[name].format(
        job_table=tables.job, archived_job_table=tables.archived
    )


def dialect_of(conn: Any, dialect: str | None) -> str:
    if dialect is not None:
        return dialect
    from proletarian_ref.backends import dialect_of_connection

    return dialect_of_connection(conn)


def db_time(dialect: str, value: datetime) -> Any:
    """`value` as the core's backends bind it, so a row written here reads as one the core wrote."""
    if dialect == "mysql":
        from proletarian_ref.backends.mysql import mysql_timestamp

        return mysql_timestamp(value)
    # As PostgresBackend binds it: text with an explicit offset, the exact instant whatever the TimeZone.
    return value.astimezone(UTC).isoformat()


def from_db_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"expected a timestamp from the database, got {value!r}")
    # Naive values are UTC wall-clock time: MySQL on a UTC session, or a legacy PostgreSQL TIMESTAMP column.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_job_id(text: str | uuid.UUID | int) -> uuid.UUID | int:
    """A job id as given by a person: a UUID (with or without dashes), or a whole number (generated ids)."""
    if isinstance(text, uuid.UUID | int) and not isinstance(text, bool):
        return text
    value = str(text).strip()
    if value.isdigit():
        return int(value)
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ConfigurationError(
            f"not a job id: {value!r} (expected a UUID such as 0b6e4c1a-8d1f-4e7a-9c55-2f0d3e9a1b2c)"
        ) from None


def encode_job_id(dialect: str, job_id: uuid.UUID | int) -> Any:
    # MySQL keeps Proletarian's UUIDs as BINARY(16) in RFC 4122 byte order (job_ids.MysqlUuidStrategy).
    if dialect == "mysql" and isinstance(job_id, uuid.UUID):
        return job_id.bytes
    return job_id


def decode_job_id(value: Any) -> uuid.UUID | int | str:
    if isinstance(value, bytes | bytearray | memoryview) and len(bytes(value)) == 16:
        return uuid.UUID(bytes=bytes(value))
    if isinstance(value, uuid.UUID | int):
        return value
    return str(value)


def execute(conn: Any, dialect: str, statement: str, params: dict[str, Any]) -> Any:
    """Run one statement on a plain cursor; returns the cursor (rows fetched, rowcount) after closing it.

    The connection's session is left as it was: on MySQL the statement runs in UTC as enqueue's INSERT
    does (MySQLBackend._caller_session). A transaction this statement begins is marked, so that
    end_read ends it and never one the caller had open.
    """
    if not in_transaction(conn, dialect):
        _begun.add(conn)
    cursor = conn.cursor()
    try:
        if dialect == "mysql":
            from proletarian_ref.backends.mysql import MySQLBackend

            with MySQLBackend()._caller_session(conn) as prefix:
                cursor.execute(prefix + statement, params)
        else:
            cursor.execute(statement, params)
        rows = [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []
        return rows, cursor.rowcount
    finally:
        cursor.close()


# PostgreSQL's classes of integrity violations and of transaction rollbacks (deadlock, serialization), and
# lock_not_available; MySQL's duplicate key, lock wait timeout and deadlock.
_PG_CONFLICT_CLASSES: Final = frozenset({"23", "40"})
_PG_CONFLICT_CODES: Final = frozenset({"55P03"})
_MYSQL_CONFLICT_CODES: Final = frozenset({1062, 1205, 1213, 1451, 1452})


def conflict_reason(exc: BaseException) -> str | None:
    """The database's reason when it refused one job's transaction over its rows; None for other errors."""
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str):
        if sqlstate[:2] in _PG_CONFLICT_CLASSES or sqlstate in _PG_CONFLICT_CODES:
            return f"{type(exc).__name__} ({sqlstate}): {' '.join(str(exc).split())}"
        return None
    args = getattr(exc, "args", ())
    if driver_of(exc) in DRIVER_MODULES and args and args[0] in _MYSQL_CONFLICT_CODES:
        return f"{type(exc).__name__} ({args[0]}): {' '.join(str(args[1:] and args[1]).split())}"
    return None


def in_transaction(conn: Any, dialect: str) -> bool:
    """Whether `conn` has a transaction open (psycopg's transaction status; on MySQL the driver's word,
    mysql_driver.transaction_open). Where the driver cannot tell (mysqlclient on MySQL), open: an operation
    then never ends or commits a transaction it cannot tell it began."""
    if dialect == "mysql":
        known = transaction_open(conn)
        return True if known is None else known
    status = getattr(getattr(conn, "info", None), "transaction_status", None)
    return status is not None and int(status) != _PG_IDLE


def require_no_transaction(conn: Any, dialect: str, what: str) -> None:
    """Refuse to commit on a connection whose caller has a transaction open: it would commit theirs."""
    if in_transaction(conn, dialect) and conn not in _begun:
        if dialect == "mysql" and transaction_open(conn) is None:
            raise ConfigurationError(
                f"{what} commits its own short transactions, and this connection cannot tell whether it has "
                "one open (mysqlclient on MySQL does not say): pass a connection of its own, or a PyMySQL one"
            )
        raise ConfigurationError(
            f"{what} commits its own short transactions, and this connection has one open: commit or roll "
            "it back first, or pass a connection of its own"
        )


def query(conn: Any, dialect: str, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = execute(conn, dialect, statement, params)[0]
    return rows


def ended(conn: Any) -> None:
    """The operation committed or rolled back the transaction its statements began."""
    _begun.discard(conn)


def can_tell_held(conn: Any, dialect: str) -> bool:
    """Whether this connection can tell the rows a worker holds from the others.

    PostgreSQL reads it without a lock. MySQL shows it only to a locking read (SKIP LOCKED), whose locks
    must not outlive the read: never inside a transaction the caller has open.
    """
    return dialect != "mysql" or not in_transaction(conn, dialect)


@contextmanager
def held_rows_read(conn: Any, dialect: str) -> Iterator[None]:
    """A read that tells held rows, ended with the block; on MySQL a READ COMMITTED transaction of its own
    (no gap locks), whose locks the rollback at the end releases at once."""
    read_committed_next(conn, dialect)
    try:
        yield
    finally:
        end_read(conn)


def read_committed_next(conn: Any, dialect: str) -> None:
    """On MySQL, run the next transaction at READ COMMITTED: its locking statements take record locks on
    the rows they change or return and no gap locks, so workers' INSERTs never wait for them. The session's
    own level is unchanged. Call it with no transaction open."""
    if dialect == "mysql":
        cursor = conn.cursor()
        try:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        finally:
            cursor.close()


def end_read(conn: Any) -> None:
    # End the read-only transaction the operation's statements began, so no snapshot or lock outlives the
    # call; a transaction the caller had open stays theirs.
    if conn in _begun:
        _begun.discard(conn)
        conn.rollback()
