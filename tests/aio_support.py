"""What the asyncio API's tests on each database share: ids both APIs make alike, rows as stored, a runner,
and each database's asyncio connections (tests/test_aio_each_database.py runs its tests on both)."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from conformance.harness import SqlHarness


class SequentialIds:
    """A job_id_strategy that hands out the same ids to each API, so whole rows can be compared; stored as
    a UUID (PostgreSQL) or as its 16 bytes (`binary`, MySQL's BINARY(16))."""

    def __init__(self, *, binary: bool = False) -> None:
        self._n = 0
        self._binary = binary

    def generate_id(self) -> uuid.UUID:
        self._n += 1
        return uuid.UUID(int=self._n)

    def encode_id(self, job_id: uuid.UUID) -> Any:
        return job_id.bytes if self._binary else job_id

    def decode_id(self, stored: Any) -> uuid.UUID:
        if isinstance(stored, uuid.UUID):
            return stored
        return uuid.UUID(bytes=bytes(stored)) if self._binary else uuid.UUID(str(stored))


def run(coroutine: Awaitable[Any]) -> Any:
    async def awaited() -> Any:
        return await coroutine

    return asyncio.run(awaited())


def pg_raw_rows(db: SqlHarness, table: str) -> list[tuple[Any, ...]]:
    """Every column as stored, as text: what 'a row does not tell which API wrote it' compares."""
    conn = db.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT t::text FROM {table} t ORDER BY job_id")
            return list(cursor.fetchall())
    finally:
        conn.rollback()
        conn.close()


def mysql_raw_rows(db: SqlHarness, table: str) -> list[tuple[Any, ...]]:
    """Every column's stored bytes (times as the server's text in UTC): what 'a row does not tell which
    API wrote it' compares."""
    columns = ", ".join(
        f"HEX(CAST({column} AS BINARY))"
        for column in ("job_id", "queue", "job_type", "payload", "attempts", "enqueued_at", "process_at")
    )
    return db.select(f"SELECT {columns} FROM {table} ORDER BY job_id")


@dataclass(frozen=True)
class AsyncDatabase:
    """One database as the asyncio API's tests use it: its harness, and its driver's asyncio connections."""

    db: SqlHarness
    dsn: str
    dialect: str

    def factory(self) -> Callable[[], Awaitable[Any]]:
        """A data source for aio's worker: a zero-argument callable returning an awaitable connection."""
        if self.dialect == "mysql":
            from proletarian_ref.backends.mysql_async import aiomysql_connection_factory

            return aiomysql_connection_factory(self.dsn)
        import psycopg

        return functools.partial(psycopg.AsyncConnection.connect, self.dsn)

    async def connect(self) -> Any:
        return await self.factory()()

    async def close(self, conn: Any) -> None:
        closed = conn.close()  # aiomysql's close() is plain, psycopg's awaited
        if asyncio.iscoroutine(closed):
            await closed

    def ids(self) -> SequentialIds:
        return SequentialIds(binary=self.dialect == "mysql")

    def raw_rows(self) -> list[tuple[Any, ...]]:
        read = mysql_raw_rows if self.dialect == "mysql" else pg_raw_rows
        return read(self.db, self.db.job_table)
