"""Optional side tables beside the job table (periodic ticks, unique keys, error history): names, SQL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import cache
from typing import Any, Final, TypeVar, cast

from proletarian_ref.backend import AsyncBackend, Backend
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.sql import parse_named_blocks, read_sql_file
from proletarian_ref.tables import DEFAULT_JOB_TABLE, TableName, table_name

# Feature -> (its SQL file, the suffix of its table's name, the placeholder naming it in the SQL).
FEATURES: Final = {
    "periodic": ("periodic.sql", "_periodic_tick", "tick_table"),
    "unique": ("unique.sql", "_unique_key", "unique_table"),
    "errors": ("errors.sql", "_error", "error_table"),
}
_T = TypeVar("_T")


def side_table(job_table: str | TableName, feature: str) -> TableName:
    """`<job_table>_periodic_tick`, `_unique_key` or `_error`, in the job table's schema."""
    job = table_name(job_table, option="job_table")
    suffix = _feature(feature)[1]
    if len(job.name) + len(suffix) > 63:
        raise ConfigurationError(
            f"the {feature} side table of {job} would be named {job.name}{suffix}, longer than 63 "
            "characters; use a shorter job table name"
        )
    return TableName(job.schema, job.name + suffix)


def _feature(feature: str) -> tuple[str, str, str]:
    try:
        return FEATURES[feature]
    except KeyError:
        raise ConfigurationError(
            f"unknown side table {feature!r}; expected one of {', '.join(FEATURES)}"
        ) from None


def parse_features(text: str | None) -> list[str]:
    """`schema install --with periodic,unique`: the named features, each known, in FEATURES order."""
    if not text:
        return []
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        _feature(name)
    return [name for name in FEATURES if name in names]


@cache
def _blocks(dialect: str, feature: str) -> dict[str, str]:
    return parse_named_blocks(read_sql_file(dialect, _feature(feature)[0]))


def statement(dialect: str, feature: str, name: str, job_table: TableName) -> str:
    """The named statement of `feature` for `job_table`, its side table's name filled in."""
    placeholder = _feature(feature)[2]
    return _blocks(dialect, feature)[name].format(
        job_table=job_table, **{placeholder: side_table(job_table, feature)}
    )


def install_statements(
    dialect: str, features: list[str], job_table: str | TableName = DEFAULT_JOB_TABLE
) -> list[str]:
    """The DDL of the side tables of `features` for `job_table` (CREATE TABLE IF NOT EXISTS: safe again)."""
    job = table_name(job_table, option="job_table")
    return [statement(dialect, feature, "create_table", job) for feature in features]


# -- running the side tables' statements on a caller's or a backend's connection ----------------------


def run(backend: Backend, conn: Any, sql_text: str, params: dict[str, Any], read: Callable[[Any], _T]) -> _T:
    """Run one statement on `conn` and return `read` of its cursor, the driver's errors as the library's.

    Through the SQL backend's own statement runner where there is one, so a statement on a transaction of
    the backend's sees its queued writes settled first, and a row count on a pipelined one is read after
    a sync (the backend's batch-count reader), never as -1.
    """
    execute: Callable[..., _T] | None = getattr(backend, "_execute", None)
    if execute is not None:
        reader: Callable[[Any], Any] = getattr(backend, "_batch_count", count) if read is count else read
        return execute(conn, sql_text, params, reader)
    cursor = conn.cursor()
    try:
        cursor.execute(sql_text, params)
        return read(cursor)
    finally:
        cursor.close()


def rows(cursor: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in cursor.fetchall()]


def count(cursor: Any) -> int:
    return int(cursor.rowcount)


def db_time(dialect: str, value: datetime) -> datetime:
    """A UTC instant as the side tables bind it: aware for TIMESTAMPTZ, naive UTC for MySQL's DATETIME(6)."""
    utc = value.astimezone(UTC)
    return utc.replace(tzinfo=None) if dialect == "mysql" else utc


def from_db_time(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def exists(backend: Backend, conn: Any, feature: str, job_table: TableName) -> bool:
    """Whether the side table of `feature` is there for `job_table`; looked up once by whoever uses it."""
    if backend.dialect == "memory":
        return True
    found = run(backend, conn, *exists_query(backend.dialect, feature, job_table), rows)
    return bool(found and found[0][0])


def exists_query(dialect: str, feature: str, job_table: TableName) -> tuple[str, dict[str, Any]]:
    """The statement telling whether the side table of `feature` is there for `job_table`, and its
    parameters: one row, true or false."""
    table = side_table(job_table, feature)
    params: dict[str, Any] = (
        {"table": str(table)} if dialect == "postgresql" else {"schema": table.schema, "name": table.name}
    )
    return statement(dialect, feature, "table_exists", job_table), params


# -- the same on an asyncio backend's connection (the source of the generated threaded stores) ----------


async def arun(
    backend: Any, conn: Any, sql_text: str, params: dict[str, Any], read: Callable[[Any], Awaitable[_T]]
) -> _T:
    """run, awaited: one statement on the caller's async connection through the backend's statement
    runner, `_execute(conn, sql, params, read)` with `read` awaited on its cursor (AsyncPostgresBackend's)."""
    execute: Callable[..., Awaitable[_T]] | None = getattr(backend, "_execute", None)
    if execute is None:
        raise ConfigurationError(
            f"the side tables (unique keys) on the asyncio API need a backend that runs statements on the "
            f"caller's connection, _execute(conn, sql, params, read), as AsyncPostgresBackend (psycopg) "
            f"does; {type(backend).__name__} has none"
        )
    return await execute(conn, sql_text, params, read)


async def arows(cursor: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in await cursor.fetchall()]


async def acount(cursor: Any) -> int:
    return int(cursor.rowcount)


class SqlStore:
    """What the SQL stores of the side tables share: the backend, the job table and the statements."""

    feature: str

    def __init__(self, backend: Backend | AsyncBackend, job_table: TableName) -> None:
        # Typed as the threaded stores use it; an asyncio store's only goes to arun, which takes either.
        self.backend = cast(Backend, backend)
        self.dialect = backend.dialect
        self.job_table = job_table

    def _run(self, conn: Any, name: str, params: dict[str, Any], read: Callable[[Any], _T]) -> _T:
        """Run the statement `name` of the store's feature on `conn`; `read` of its cursor."""
        return run(
            self.backend, conn, statement(self.dialect, self.feature, name, self.job_table), params, read
        )

    async def _arun(
        self, conn: Any, name: str, params: dict[str, Any], read: Callable[[Any], Awaitable[_T]]
    ) -> _T:
        """_run on an asyncio connection (an asyncio store's; its generated threaded twin calls _run)."""
        return await arun(
            self.backend, conn, statement(self.dialect, self.feature, name, self.job_table), params, read
        )

    def _time(self, value: datetime) -> datetime:
        return db_time(self.dialect, value)


def store_class(backend: Any, attribute: str, memory: type, sql: type) -> Callable[[Any, TableName], Any]:
    """The store class of a side table for `backend`: its own `attribute` where it brings one (a fork; the
    conformance suite's mutants), else `memory` for the in-memory backend, else `sql`."""
    own: Callable[[Any, TableName], Any] | None = getattr(backend, attribute, None)
    if own is not None:
        return own
    return memory if backend.dialect == "memory" else sql


def missing_table_error(feature: str, job_table: TableName) -> ConfigurationError:
    return ConfigurationError(
        f"the {feature} side table {side_table(job_table, feature)} is missing: create it with "
        f"`proletarian-ref schema install --with {feature}` (or proletarian_ref.schema.install(conn, "
        f"with_features=[{feature!r}]))"
    )
