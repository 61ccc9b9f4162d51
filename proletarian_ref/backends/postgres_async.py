"""The asyncio PostgreSQL backend, on psycopg 3's AsyncConnection (and psycopg_pool's AsyncConnectionPool)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.backends._aio_dbapi import AsyncSqlBackend, _nothing
from proletarian_ref.backends._dbapi import check_counts
from proletarian_ref.backends.pg_exchange import Command, Session, exchange
from proletarian_ref.backends.postgres import (
    _ARCHIVE,
    _CHECKED_ARCHIVE,
    _CHECKED_BATCH_ARCHIVE,
    PostgresBackend,
    lenient_row,
    notification_channel,
    notification_payload,
    stated_begin,
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
    `chain=True` a finished job's COMMIT AND CHAIN goes with the next claim (ChainedClaim), as there.

    With `pipeline=True` the connections the backend opens itself from a factory pipeline the worker's
    statements, as the threaded backend's do: BEGIN goes with the claim, single-row writes are held and
    sent together, their counts checked before anything else runs (the COMMIT included). With
    `compact=True` and `chain=True` as well a job takes one round trip: its archive, whose count the server
    checks (archive_and_delete_job_checked), goes with the COMMIT AND CHAIN and the next claim. Each
    exchange enters libpq's pipeline mode, sends its statements with one flush and leaves pipeline mode
    before it returns (pg_exchange): the handler's own statements on the job's connection run as on any
    other connection. A pool's connections and callers' connections never pipeline.
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
        pipeline: bool = False,
    ) -> None:
        pooled = type(data_source).__module__.split(".", 1)[0] == "psycopg_pool"
        # The codec checks every option (pipeline=True needs libpq 14), as the threaded backend would.
        codec = PostgresBackend(
            None,
            compact=compact,
            synchronous_commit_off=synchronous_commit_off,
            chain=chain,
            pipeline=pipeline,
        )
        super().__init__(codec, data_source, pooled=pooled)
        self.synchronous_commit_off = synchronous_commit_off
        self._pipeline = pipeline
        # The connections whose worker statements go in exchanges (pg_exchange), each with its session.
        self._pipes: dict[Any, Session] = {}

    async def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        """AsyncChainedClaim: COMMIT AND CHAIN (and the job transaction's setting) as one simple query,
        then the claim: PostgresBackend's chain. On a pipelined connection all of them go in one exchange
        (_claim_exchange), the finished job's server-checked archive before them."""
        if conn in self._pipes:
            claim = self._claim(job_table, queue, now)
            return self._claimed(conn, await self._claim_exchange(conn, *claim, True))
        await self._chain_commit(conn)
        return await self.get_next_job(conn, job_table, queue, now)

    async def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        """AsyncChainedBatchClaim: commit_and_get_next_job's COMMIT AND CHAIN, then batch mode's claim."""
        if conn in self._pipes:
            claim = self._batch_claim(job_table, queue, now, limit)
            return self._batch_claimed(conn, await self._claim_exchange(conn, *claim, True))
        await self._chain_commit(conn)
        return await self.get_next_jobs(conn, job_table, queue, now, limit)

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        if conn not in self._pipes:
            return await super().get_next_job(conn, job_table, queue, now)
        claim = self._claim(job_table, queue, now)
        return self._claimed(conn, await self._claim_exchange(conn, *claim, False))

    async def get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        if conn not in self._pipes:
            return await super().get_next_jobs(conn, job_table, queue, now, limit)
        claim = self._batch_claim(job_table, queue, now, limit)
        return self._batch_claimed(conn, await self._claim_exchange(conn, *claim, False))

    # -- the pipelined connections' exchanges (pg_exchange) --------------------------------------------

    async def _claim_exchange(self, conn: Any, statement: str, params: Any, chained: bool) -> Command:
        """The claim in one exchange with what goes before it: on a chain, the finished job's archives
        whose counts the server checks, its COMMIT AND CHAIN (and the job transaction's setting);
        otherwise BEGIN when no transaction is open. Writes whose counts the client checks are settled in
        an exchange of their own first, so a wrong count rolls back before anything else runs."""
        pending = self._pending.get(conn)
        commands: list[Command] = []
        if chained:
            held = [command for command, _what, _ids in pending] if pending else []
            # Empties `pending` when the server checks every held write's count: they go in this exchange.
            statements = self.codec._chain_commit_statements(conn, pending, True)
            if pending:
                await self._settle(conn, pending)
            else:
                commands.extend(held)
            commands.extend(Command(statement) for statement in statements)
        else:
            if pending:
                await self._settle(conn, pending)
            if conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                # As psycopg would begin it: at the level and access mode the connection was given, which
                # the chain's COMMIT AND CHAIN then keeps for every next job.
                commands.append(Command(stated_begin(conn)))
        claim = Command(statement, params)
        commands.append(claim)
        await self._exchange(conn, commands)
        return claim

    def _claimed(self, conn: Any, claim: Command) -> JobRecord | None:
        result = claim.result
        if result is None or result.ntuples == 0:
            return None
        loader = self._pipes[conn].loader
        loader.set_pgresult(result)
        try:
            row = loader.load_row(0, tuple)
        except psycopg.DataError:
            # A stored time Python cannot hold: read with the lenient loaders, as _fetch_claimed does.
            row = lenient_row(result, conn)
        return self.codec._job_record(row)

    def _batch_claimed(self, conn: Any, claim: Command) -> list[JobRecord]:
        result = claim.result
        if result is None or result.ntuples == 0:
            return []
        loader = self._pipes[conn].loader
        loader.set_pgresult(result)
        try:
            rows = loader.load_rows(0, result.ntuples, tuple)
        except psycopg.DataError as exc:
            self._raise(exc)
        return [self.codec._job_record(row) for row in rows]

    async def _exchange(self, conn: Any, commands: list[Command]) -> None:
        try:
            await exchange(conn, self._pipes[conn], commands)
        except psycopg.Error as exc:
            self._raise(exc)

    async def _queue_write(
        self,
        conn: Any,
        pending: list[tuple[Any, str, Any]],
        statement: str,
        params: Any,
        what: str,
        job_id: Any,
    ) -> None:
        # Held as a Command: it goes in the next exchange, with the claim after it on a chain when the
        # server checks its count, or settled (_settle) before anything else.
        pending.append((Command(statement, params), what, job_id))

    async def _settle(self, conn: Any, pending: list[tuple[Any, str, Any]]) -> None:
        # One exchange for all of them, then their counts.
        writes = pending[:]
        pending.clear()
        await self._exchange(conn, [command for command, _what, _ids in writes])
        check_counts(writes)

    async def _chain_commit(self, conn: Any) -> None:
        pending = self._pending.get(conn) if self._pending else None
        for statement in self.codec._chain_commit_statements(conn, pending, pending is not None):
            await self._execute(conn, statement, None, _nothing)

    def _server_checks(self, conn: Any) -> bool:
        """Whether a finished job's archive on `conn` goes with the next claim, its count the server's to
        check: a pipelined transaction of a backend that chains."""
        return self.codec._chain and bool(self._pending) and conn in self._pending

    async def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        name = _CHECKED_ARCHIVE if self._server_checks(conn) else _ARCHIVE
        await self._archive(conn, name, job_table, archived_job_table, job_id, status, finished_at)

    async def archive_and_delete_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        if not self._server_checks(conn):
            await super().archive_and_delete_jobs(
                conn, job_table, archived_job_table, job_ids, status, finished_at
            )
            return
        # Queued, not synced for its count as other batch writes are: the server checks it (_chain_commit).
        statement, params = self.codec._checked_batch_archive(
            job_table, archived_job_table, job_ids, status, finished_at
        )
        pending = self._pending[conn]
        await self._queue_write(conn, pending, statement, params, _CHECKED_BATCH_ARCHIVE, tuple(job_ids))

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
        if self._pipeline and not self._pooled and conn in self._open:
            if conn not in self._pipes:
                # Autocommit off for good: BEGIN goes with the first claim (_claim_exchange).
                if conn.autocommit:
                    await conn.set_autocommit(False)
                # psycopg prepares nothing of its own here: on a rollback it would deallocate every
                # prepared statement of the connection, the exchanges' too (pg_exchange).
                conn.prepare_threshold = None
                self._pipes[conn] = Session(conn)
            return False
        was_autocommit = bool(conn.autocommit)
        if was_autocommit:
            await conn.set_autocommit(False)
        return was_autocommit

    async def _end(self, conn: Any, state: bool) -> None:
        if state:
            await conn.set_autocommit(True)

    async def _close_quietly(self, conn: Any) -> None:
        await _close_quietly(conn)

    def _pipelines(self, conn: Any) -> bool:
        return conn in self._pipes

    def _forget(self, conn: Any) -> None:
        # Every connection with a session is one of the backend's own: close() forgets each, so here too.
        session = self._pipes.pop(conn, None)
        if session is not None:
            session.close()
        super()._forget(conn)

    async def _new_cursor(self, conn: Any) -> Any:
        return conn.cursor(row_factory=tuple_row)

    async def _fetch_claimed(self, cursor: Any) -> Any:
        try:
            return await cursor.fetchone()
        except psycopg.DataError:
            if cursor.pgresult is None:
                # No row came: the statement's own error, not a loader's, as PostgresBackend._fetch_claimed
                # tells them apart.
                raise
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
