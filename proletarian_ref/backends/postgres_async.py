"""The asyncio PostgreSQL backend, on psycopg 3's AsyncConnection (and psycopg_pool's AsyncConnectionPool)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

import psycopg
from psycopg.rows import tuple_row

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.backends._aio_dbapi import AsyncSqlBackend, _nothing
from proletarian_ref.backends.postgres import (
    PostgresBackend,
    lenient_row,
    notification_channel,
    notification_payload,
)
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.tables import TableName


class AsyncPostgresBackend(AsyncSqlBackend):
    """Proletarian's statements on PostgreSQL, awaited (proletarian_ref.backend.AsyncBackend).

    `data_source` is a psycopg_pool.AsyncConnectionPool, or a zero-argument callable returning an
    awaitable psycopg.AsyncConnection (e.g. `functools.partial(psycopg.AsyncConnection.connect, dsn)`);
    None serves enqueue on callers' connections only. The statements, their parameters and the rows read
    back are the threaded PostgresBackend's own (its pure methods, through `codec`), so a row does not tell
    which API wrote it. With `compact=True` a finished job's archive and delete are one statement, as there;
    with `synchronous_commit_off=True` the worker's job transaction commits asynchronously, and with
    `chain=True` a finished job's commit goes with the next BEGIN (ChainedClaim), as there.
    """

    dialect: ClassVar[str] = "postgresql"
    capabilities: ClassVar[Capabilities] = Capabilities(handler_transaction=True)
    _driver_error: ClassVar[type[Exception]] = psycopg.Error
    codec: PostgresBackend

    def __init__(
        self,
        data_source: Any = None,
        *,
        compact: bool = False,
        synchronous_commit_off: bool = False,
        chain: bool = False,
    ) -> None:
        pooled = type(data_source).__module__.split(".", 1)[0] == "psycopg_pool"
        codec = PostgresBackend(
            None, compact=compact, synchronous_commit_off=synchronous_commit_off, chain=chain
        )
        super().__init__(codec, data_source, pooled=pooled)
        self.synchronous_commit_off = synchronous_commit_off

    @property
    def chained_claims(self) -> bool:
        return self.codec.chained_claims

    async def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        """AsyncChainedClaim: COMMIT and BEGIN (and the job transaction's setting) as one simple query,
        then the claim: PostgresBackend's chain, outside pipeline mode."""
        await self._execute(conn, self.codec._chain_statements[0][0], None, _nothing)
        return await self.get_next_job(conn, job_table, queue, now)

    async def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        """AsyncChainedBatchClaim: commit_and_get_next_job's COMMIT and BEGIN, then batch mode's claim."""
        await self._execute(conn, self.codec._chain_statements[0][0], None, _nothing)
        return await self.get_next_jobs(conn, job_table, queue, now, limit)

    # -- psycopg's connections, transactions and cursors -----------------------------------------------

    async def _acquire_pooled(self) -> Any:
        return await self._data_source.getconn()

    async def _release_pooled(self, conn: Any) -> None:
        await self._data_source.putconn(conn)

    def _check_connection(self, conn: Any) -> None:
        if not isinstance(conn, psycopg.AsyncConnection):
            raise ConfigurationError(
                f"the data source returned {type(conn).__module__}.{type(conn).__name__}, not a psycopg "
                "AsyncConnection (for an aiomysql connection pass backend=AsyncMySQLBackend(data_source), "
                "proletarian_ref.backends.mysql_async)"
            )

    def _is_broken(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    async def _begin(self, conn: Any) -> bool:
        was_autocommit = bool(conn.autocommit)
        if was_autocommit:
            await conn.set_autocommit(False)
        return was_autocommit

    async def _end(self, conn: Any, state: bool) -> None:
        if state:
            await conn.set_autocommit(True)

    async def _close_quietly(self, conn: Any) -> None:
        await _close_quietly(conn)

    async def _new_cursor(self, conn: Any) -> Any:
        return conn.cursor(row_factory=tuple_row)

    async def _fetch_claimed(self, cursor: Any) -> Any:
        try:
            return await cursor.fetchone()
        except psycopg.DataError:
            # A stored time Python cannot hold: read with the lenient loaders, as PostgresBackend does.
            return lenient_row(cursor.pgresult, cursor.connection)

    async def server_time_limits(self) -> dict[str, float] | None:
        """The server's limits on a transaction's life, in seconds, by setting name (only those set).

        Read (sql/postgresql/sessions.sql) on a connection of the worker's own, as a transaction takes it
        (from the pool, or the factory's, kept for the next transaction), then rolled back; never on a
        caller's.
        """
        conn = await self._checkout()
        try:
            try:
                async with conn.cursor(row_factory=tuple_row) as cursor:
                    await cursor.execute(sql.sessions("postgresql")["time_limits"])
                    rows = await cursor.fetchall()
            finally:
                with contextlib.suppress(Exception):
                    await conn.rollback()
        except psycopg.Error as exc:
            self._raise(exc)
        finally:
            await self._checkin(conn)
        return {str(name): int(ms) / 1000 for name, ms in rows if ms is not None and int(ms) > 0}

    # -- notifications (AsyncNotifications) ------------------------------------------------------------

    async def notify_enqueued(self, conn: Any, job_table: TableName, queues: Sequence[str]) -> None:
        params = {
            "channel": notification_channel(job_table),
            "queues": [notification_payload(queue) for queue in queues],
        }
        await self._execute(conn, self.codec._render("notify_enqueued", job_table), params, _nothing)

    async def listen(
        self, job_table: TableName, queue: str, data_source: Any = None
    ) -> AsyncPostgresListener:
        source = data_source if data_source is not None else self._data_source
        try:
            if type(source).__module__.split(".", 1)[0] == "psycopg_pool":
                conn = await psycopg.AsyncConnection.connect(source.conninfo, **source.kwargs)
            elif callable(source):
                conn = await source()
            else:
                raise ConfigurationError(
                    f"{type(self).__name__} has no data source to open a listening connection with; pass "
                    "listen_data_source= (an async connection factory or an AsyncConnectionPool)"
                )
            await conn.set_autocommit(True)
            channel = notification_channel(job_table)
            await conn.execute(sql.render_channel(self.dialect, "listen", channel))
        except psycopg.Error as exc:
            self._raise(exc)
        return AsyncPostgresListener(conn, notification_payload(queue))


class AsyncPostgresListener:
    """A connection LISTENing for one queue's enqueue notifications (backend.AsyncListener)."""

    # Not probed as the threaded listener is (PgBouncer in transaction mode): docs/worker.md, "asyncio".
    confirmed = True

    def __init__(self, conn: Any, payload: str) -> None:
        self._conn = conn
        self._payload = payload
        self._interrupted = False
        self._stop: asyncio.Event | None = None

    @property
    def session(self) -> int:
        """The listening connection's server process id: what an operator, or the conformance suite's N3,
        terminates to break it."""
        return int(self._conn.info.backend_pid)

    def interrupt(self) -> None:
        """End the wait under way at once (called on the listener's loop): stop() must not sit out the
        rest of a listen tick, which cost the threaded worker over the bridge up to 5 s a stop."""
        self._interrupted = True
        if self._stop is not None:
            self._stop.set()

    async def wait(self, timeout: float) -> bool:
        if self._interrupted:
            return False
        if self._stop is None:
            # Made here, on the loop that waits, not in __init__ (which may run elsewhere).
            self._stop = asyncio.Event()
        notified = asyncio.ensure_future(self._notified(timeout))
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({notified, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not notified.done():
                # Interrupted (or cancelled): the connection is being closed, its read need not finish.
                notified.cancel()
                # asyncio.wait, not `await notified`: the read's own CancelledError is not ours to raise,
                # and a cancellation of this task meanwhile still propagates.
                await asyncio.wait({notified})
        return notified.result() if not notified.cancelled() else False

    async def _notified(self, timeout: float) -> bool:
        try:
            async for notify in self._conn.notifies(timeout=timeout):
                if notify.payload == self._payload:
                    return True
        except psycopg.Error as exc:
            error = PostgresBackend(None)._translate(exc)
            raise (error if error is not None else exc) from exc
        return False

    async def close(self) -> None:
        await _close_quietly(self._conn)


async def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
