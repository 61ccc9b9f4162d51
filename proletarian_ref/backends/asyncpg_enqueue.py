"""Async enqueue on a caller's asyncpg connection, with the PostgreSQL dialect's statements and values."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NoReturn

from proletarian_ref import sql
from proletarian_ref.backend import JobRecord
from proletarian_ref.backends._dbapi import _chunks
from proletarian_ref.backends.postgres import _TRANSIENT_CLASSES, _TRANSIENT_CODES, PostgresBackend
from proletarian_ref.errors import DatabaseError, SchemaMissingError, TransientDatabaseError
from proletarian_ref.tables import TableName

_PYFORMAT = re.compile(r"%s")


@lru_cache(maxsize=256)
def numbered(statement: str) -> str:
    """`statement`'s %s placeholders (sql.positional's) as asyncpg's $1, $2, ... in the order they come."""
    counter = iter(range(1, 1 << 30))
    return _PYFORMAT.sub(lambda _match: f"${next(counter)}", statement)


class _AsyncpgCodec(PostgresBackend):
    """PostgresBackend's statements and rows, its values typed as asyncpg's codecs take them."""

    def _db_time(self, value: datetime, *, what: str = "time") -> Any:
        # asyncpg types each parameter by the prepared statement, so no untyped text: an aware UTC
        # datetime, the same instant utc_text names, into the TIMESTAMPTZ columns of schema.sql.
        return value.astimezone(UTC)

    def _enqueue_row(self, job: JobRecord, enqueued_at: Any, process_at: Any) -> tuple[Any, ...]:
        return (job.job_id, job.queue, job.job_type, job.payload, job.attempts, enqueued_at, process_at)


class AsyncpgEnqueueBackend:
    """enqueue and enqueue_many (AsyncBackend's caller-connection part) on an asyncpg Connection.

    Runs in the caller's transaction (or autocommit, asyncpg's default outside one) and never commits.
    The worker's part (transaction, claim, archive) is AsyncpgBackend's (asyncpg_backend.py), which
    enqueues through this one.
    """

    dialect = "postgresql"

    def __init__(self) -> None:
        self.codec = _AsyncpgCodec(None)

    def _raise(self, exc: Exception) -> NoReturn:
        error = translate(exc)
        if error is None:
            raise exc
        raise error from exc

    async def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        text, params, generated = self.codec._enqueue_statement(job_table, job)
        if isinstance(params, dict):
            names = sql.positional(text)[1]
            text, params = sql.positional(text)[0], tuple(params[name] for name in names)
        try:
            if generated:
                return await conn.fetchval(numbered(text), *params)
            await conn.execute(numbered(text), *params)
        except Exception as exc:
            self._raise(exc)
        return job.job_id

    async def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]:
        """Multi-row INSERTs of at most the threaded backend's rows and bytes each (as the psycopg one)."""
        codec = self.codec
        generated = jobs[0].job_id is None
        rows = list(codec._batch_rows(jobs, generated=generated))
        name = "enqueue_many_db_generated" if generated else "enqueue_many"
        ids: list[Any] = []
        chunks = list(_chunks(rows, codec._BATCH_ROWS, codec._BATCH_BYTES))
        try:
            # More than one statement: all or none, in a savepoint of the caller's transaction (asyncpg's
            # nested transaction()), or a transaction of its own on a connection outside one.
            async with conn.transaction() if len(chunks) > 1 else contextlib.nullcontext():
                for chunk in chunks:
                    statement = numbered(sql.render_rows(self.dialect, name, job_table, len(chunk)))
                    params = [value for row in chunk for value in row]
                    if generated:
                        ids.extend(record[0] for record in await conn.fetch(statement, *params))
                    else:
                        await conn.execute(statement, *params)
        except Exception as exc:
            self._raise(exc)
        return ids if generated else [job.job_id for job in jobs]


def translate(exc: BaseException) -> DatabaseError | None:
    """The library's exception for an asyncpg exception (by SQLSTATE, as PostgresBackend), else None."""
    if type(exc).__module__.split(".", 1)[0] != "asyncpg":
        if isinstance(exc, (ConnectionError, OSError)):
            return TransientDatabaseError(f"{type(exc).__name__}: {exc}")
        return None
    message = f"{type(exc).__name__}: {str(exc).strip()}"
    sqlstate = str(getattr(exc, "sqlstate", None) or "")
    if sqlstate == "42P01":
        return SchemaMissingError(f"{message} (install the schema: proletarian_ref.schema.install)")
    if (
        type(exc).__name__ in ("ConnectionDoesNotExistError", "InterfaceError", "InternalClientError")
        or sqlstate[:2] in _TRANSIENT_CLASSES
        or sqlstate in _TRANSIENT_CODES
    ):
        return TransientDatabaseError(message)
    return DatabaseError(message)
