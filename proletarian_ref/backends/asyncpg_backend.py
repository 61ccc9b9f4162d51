"""The asyncio PostgreSQL backend on asyncpg: AsyncPostgresBackend's verbs, over asyncpg sessions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, NoReturn

import asyncpg

from proletarian_ref.backend import JobRecord
from proletarian_ref.backends._aio_dbapi import _nothing, _nothing_list, _rowcount
from proletarian_ref.backends._dbapi import _wrong_count
from proletarian_ref.backends.asyncpg_enqueue import AsyncpgEnqueueBackend, _AsyncpgCodec, translate
from proletarian_ref.backends.asyncpg_session import AsyncpgSession, dollar, status_count, translated
from proletarian_ref.backends.postgres import notification_channel, notification_payload
from proletarian_ref.backends.postgres_async import AsyncPostgresBackend, AsyncPostgresListener
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.tables import TableName

# The readers that want a statement's status, not its rows: asyncpg's execute() returns just that.
_STATUS_READERS = frozenset({_rowcount, _nothing, _nothing_list})


class AsyncpgBackend(AsyncPostgresBackend):
    """Proletarian's statements on PostgreSQL through asyncpg (proletarian_ref.backend.AsyncBackend).

    `data_source` is an asyncpg.Pool, or a zero-argument callable returning an awaitable asyncpg
    Connection (e.g. `functools.partial(asyncpg.connect, dsn)`); None serves enqueue on callers'
    connections only. Every verb is AsyncPostgresBackend's own, with sql/postgresql's statements as $n
    and its parameters typed as asyncpg binds them (asyncpg_enqueue._AsyncpgCodec): only connections,
    statements' execution and LISTEN are asyncpg's here. enqueue and enqueue_many are
    AsyncpgEnqueueBackend's. The listener of a pool takes one of its connections while it listens.
    """

    def __init__(
        self,
        data_source: Any = None,
        *,
        compact: bool = False,
        synchronous_commit_off: bool = False,
        chain: bool = False,
    ) -> None:
        super().__init__(
            data_source, compact=compact, synchronous_commit_off=synchronous_commit_off, chain=chain
        )
        self.codec = _AsyncpgCodec(
            None, compact=compact, synchronous_commit_off=synchronous_commit_off, chain=chain
        )
        self._pooled = isinstance(data_source, asyncpg.Pool)
        self._enqueuer = AsyncpgEnqueueBackend()

    def _raise(self, exc: Exception) -> NoReturn:
        error = translate(exc)
        if error is None:
            raise exc
        raise error from exc

    def _is_broken(self, conn: Any) -> bool:
        # A session's broken is its closed: asked once, not twice, on every job's transaction.
        return bool(conn.raw.is_closed())

    async def _session(self, source: Any, *, autocommit: bool = False) -> AsyncpgSession:
        """A new session on a connection from `source` (a pool, or a factory of connections)."""
        if isinstance(source, asyncpg.Pool):
            with translated():
                return AsyncpgSession(await source.acquire(), autocommit=autocommit, pool=source)
        if not callable(source):
            raise ConfigurationError(
                f"{type(self).__name__} has no data source to open a connection with: pass an asyncpg.Pool "
                "or a callable returning an awaitable asyncpg Connection"
            )
        with translated():
            conn = await source()
        if isinstance(conn, AsyncpgSession):
            conn.autocommit = autocommit
            return conn
        if not isinstance(conn, asyncpg.Connection):
            raise ConfigurationError(
                f"the data source returned {type(conn).__name__}, not an asyncpg Connection"
            )
        return AsyncpgSession(conn, autocommit=autocommit)

    async def _checkout(self) -> Any:
        if self._pooled:
            return await self._session(self._data_source)
        if self._idle:
            return self._idle.pop()
        session = await self._session(self._data_source)
        self._open.add(session)
        return session

    async def _checkin(self, conn: Any) -> None:
        if self._pooled:
            await conn.release()
        else:
            await super()._checkin(conn)

    async def _execute(
        self, conn: Any, statement: str, params: Any, read: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        raw = await _session(conn).ready()
        query, args = dollar(statement, params)
        try:
            if read in _STATUS_READERS:
                result = _Result([], status_count(await raw.execute(query, *args)))
            else:
                result = _Result(await raw.fetch(query, *args), -1)
        except Exception as exc:
            self._raise(exc)
        return await read(result)

    # The claim and the one-row writes run for every job: straight to asyncpg, not through _execute's
    # reader and result objects, each a level of coroutine that every round trip's resumption passes through.

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        codec = self.codec
        params = {"queue": queue, "now": codec._db_time(now, what="now")}
        query, args = dollar(codec._statements["get_next_job", job_table, None], params)
        raw = await _session(conn).ready()
        try:
            row = await raw.fetchrow(query, *args)
        except Exception as exc:
            self._raise(exc)
        return None if row is None else codec._job_record(row)

    async def _write_one(self, conn: Any, statement: str, params: dict[str, Any], what: str) -> None:
        query, args = dollar(statement, params)
        raw = await _session(conn).ready()
        try:
            count = status_count(await raw.execute(query, *args))
        except Exception as exc:
            self._raise(exc)
        if count != 1:
            raise _wrong_count(count, what, params["job_id"])

    async def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        return await self._enqueuer.enqueue(await _raw(conn), job_table, job)

    async def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]:
        return await self._enqueuer.enqueue_many(await _raw(conn), job_table, jobs)

    async def listen(
        self, job_table: TableName, queue: str, data_source: Any = None
    ) -> AsyncPostgresListener:
        source = data_source if data_source is not None else self._data_source
        session = await self._session(source, autocommit=True)
        try:
            await session.listen(notification_channel(job_table))
        except BaseException:
            await session.close()
            raise
        return AsyncPostgresListener(session, notification_payload(queue))


class _Result:
    """A statement's rows and row count, read as AsyncPostgresBackend's readers read a cursor."""

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    async def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    async def fetchall(self) -> list[Any]:
        return self._rows


def _session(conn: Any) -> AsyncpgSession:
    # A caller's own asyncpg connection runs as it is, in its transaction if it is in one.
    return conn if isinstance(conn, AsyncpgSession) else AsyncpgSession(conn, autocommit=True)


async def _raw(conn: Any) -> Any:
    """The asyncpg connection under `conn`, in its session's transaction."""
    return await conn.ready() if isinstance(conn, AsyncpgSession) else conn
