"""The asyncio PostgreSQL backend, on psycopg 3's AsyncConnection (and psycopg_pool's AsyncConnectionPool)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar, NoReturn

import psycopg
from psycopg.rows import tuple_row

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.backends._dbapi import _chunks, _wrong_batch_count, _wrong_count
from proletarian_ref.backends.postgres import (
    PostgresBackend,
    lenient_row,
    notification_channel,
    notification_payload,
)
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.tables import TableName


class AsyncPostgresBackend:
    """Proletarian's statements on PostgreSQL, awaited (proletarian_ref.backend.AsyncBackend).

    `data_source` is a psycopg_pool.AsyncConnectionPool, or a zero-argument callable returning an
    awaitable psycopg.AsyncConnection (e.g. `functools.partial(psycopg.AsyncConnection.connect, dsn)`);
    None serves enqueue on callers' connections only. The statements, their parameters and the rows read
    back are the threaded PostgresBackend's own (its pure methods, through `codec`), so a row does not tell
    which API wrote it. With `compact=True` a finished job's archive and delete are one statement, as there.
    """

    dialect: ClassVar[str] = "postgresql"
    capabilities: ClassVar[Capabilities] = Capabilities(handler_transaction=True)

    def __init__(self, data_source: Any = None, *, compact: bool = False) -> None:
        # The threaded backend with no data source: it never connects, it only makes statements,
        # parameters and records, and checks `compact`.
        self.codec = PostgresBackend(None, compact=compact)
        self.compact_plan = compact
        self._data_source = data_source
        self._pooled = type(data_source).__module__.split(".", 1)[0] == "psycopg_pool"
        # The connections this backend opened from a factory and that no transaction holds now.
        self._idle: list[Any] = []
        self._open: set[Any] = set()
        self._cursors: dict[Any, Any] = {}  # of the connections in _open

    # -- connections and transactions ------------------------------------------------------------------

    def _raise(self, exc: Exception) -> NoReturn:
        error = self.codec._translate(exc)
        if error is None:
            raise exc
        raise error from exc

    async def _checkout(self) -> Any:
        try:
            if self._pooled:
                return await self._data_source.getconn()
            if self._idle:
                return self._idle.pop()
            if not callable(self._data_source):
                raise ConfigurationError(
                    f"{type(self).__name__} has no data source to open a connection with: pass an "
                    f"AsyncConnectionPool or a callable returning an awaitable AsyncConnection"
                )
            conn = await self._data_source()
        except psycopg.Error as exc:
            self._raise(exc)
        if not isinstance(conn, psycopg.AsyncConnection):
            raise ConfigurationError(
                f"the data source returned {type(conn).__name__}, not an AsyncConnection"
            )
        self._open.add(conn)
        return conn

    async def _checkin(self, conn: Any) -> None:
        if self._pooled:
            await self._data_source.putconn(conn)
        elif conn.closed or conn.broken:
            self._open.discard(conn)
            self._cursors.pop(conn, None)
        else:
            self._idle.append(conn)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """A connection in a transaction that commits when the block ends and rolls back on error.

        A task cancelled inside the block (the worker's stop() at its deadline) closes the connection
        rather than waiting on it: the server rolls the transaction back, the job stays as it was. Any
        other error, BaseException or not, rolls back before it goes on.
        """
        conn = await self._checkout()
        try:
            try:
                was_autocommit = conn.autocommit
                if was_autocommit:
                    await conn.set_autocommit(False)
            except psycopg.Error as exc:
                self._raise(exc)
            try:
                yield conn
            except asyncio.CancelledError:
                # Cancelled, perhaps inside a statement: nothing more is awaited on the connection. The
                # server rolls back when it sees the connection go (the row lock lasts until then).
                await _close_quietly(conn)
                raise
            except BaseException:
                # Any other error, a non-Exception one too: rolled back at once, so the job is claimable
                # again as soon as this returns; a connection that cannot roll back is closed.
                try:
                    await conn.rollback()
                except Exception:
                    await _close_quietly(conn)
                raise
            try:
                await conn.commit()
            except psycopg.Error as exc:
                self._raise(exc)
            if was_autocommit and not conn.closed:
                with contextlib.suppress(Exception):
                    await conn.set_autocommit(True)
        finally:
            await self._checkin(conn)

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

    async def close(self) -> None:
        """Close the connections this backend opened (a pool, and the factory, stay the caller's)."""
        self._idle.clear()
        self._cursors.clear()
        for conn in list(self._open):
            await _close_quietly(conn)
        self._open.clear()

    # -- statements ------------------------------------------------------------------------------------

    async def _execute(
        self, conn: Any, statement: str, params: Any, read: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        try:
            # A connection the backend opened keeps one cursor (making one costs more than a statement's
            # own work); a caller's or a pool's gets one per statement: the backend cannot tell when it goes.
            cursor = self._cursors.get(conn)
            if cursor is None:
                if conn not in self._open:
                    async with conn.cursor(row_factory=tuple_row) as cursor:
                        await cursor.execute(statement, params)
                        return await read(cursor)
                cursor = self._cursors[conn] = conn.cursor(row_factory=tuple_row)
            await cursor.execute(statement, params)
            return await read(cursor)
        except psycopg.Error as exc:
            self._raise(exc)

    async def _write_one(self, conn: Any, statement: str, params: dict[str, Any], what: str) -> None:
        count = await self._execute(conn, statement, params, _rowcount)
        if count != 1:
            raise _wrong_count(count, what, params["job_id"])

    async def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        text, params, generated = self.codec._enqueue_statement(job_table, job)
        stored = await self._execute(conn, text, params, _first_value if generated else _nothing)
        return stored if generated else job.job_id

    async def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]:
        """BatchEnqueue: multi-row INSERTs of at most the threaded backend's rows and bytes each."""
        generated = jobs[0].job_id is None
        rows = list(self.codec._batch_rows(jobs, generated=generated))
        name = "enqueue_many_db_generated" if generated else "enqueue_many"
        ids: list[Any] = []
        for chunk in _chunks(rows, self.codec._BATCH_ROWS, self.codec._BATCH_BYTES):
            statement = sql.render_rows(self.dialect, name, job_table, len(chunk))
            params = [value for row in chunk for value in row]
            ids.extend(
                await self._execute(conn, statement, params, _first_column if generated else _nothing_list)
            )
        return ids if generated else [job.job_id for job in jobs]

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        codec = self.codec
        params = {"queue": queue, "now": codec._db_time(now, what="now")}
        row = await self._execute(
            conn, codec._statements["get_next_job", job_table, None], params, _fetch_claimed
        )
        return None if row is None else codec._job_record(row)

    async def archive_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        await self._archive(conn, "archive_job", job_table, archived_job_table, job_id, status, finished_at)

    async def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        """The compact plan (ArchiveAndDelete): the dialect's archive_and_delete_job, one statement."""
        name = "archive_and_delete_job"
        await self._archive(conn, name, job_table, archived_job_table, job_id, status, finished_at)

    async def _archive(
        self,
        conn: Any,
        name: str,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        params = self.codec._archive_params(job_id, status, finished_at)
        await self._write_one(conn, self.codec._statements[name, job_table, archived_job_table], params, name)

    async def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        statement = self.codec._statements["delete_job", job_table, None]
        await self._write_one(conn, statement, {"job_id": job_id}, "delete_job")

    async def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        params = {"job_id": job_id, "retry_at": self.codec._db_time(retry_at, what="retry_at")}
        await self._write_one(conn, self.codec._statements["retry_at", job_table, None], params, "retry_at")

    # -- batch mode (AsyncBatchClaim) ------------------------------------------------------------------

    async def get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        codec = self.codec
        params = {"queue": queue, "now": codec._db_time(now, what="now"), "limit": limit}
        rows = await self._execute(conn, codec._render("get_next_jobs", job_table), params, _fetchall)
        return [codec._job_record(row) for row in rows]

    async def _write_all(
        self,
        conn: Any,
        name: str,
        job_table: TableName,
        archived_job_table: TableName | None,
        job_ids: Sequence[Any],
        params: list[Any],
    ) -> None:
        statement = sql.render_ids(self.dialect, name, job_table, archived_job_table, len(job_ids))
        count = await self._execute(conn, statement, params, _rowcount)
        if count != len(job_ids):
            raise _wrong_batch_count(count, name, len(job_ids))

    async def archive_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        params = [status, self.codec._db_time(finished_at, what="finished_at"), *job_ids]
        await self._write_all(conn, "archive_jobs", job_table, archived_job_table, job_ids, params)

    async def delete_jobs(self, conn: Any, job_table: TableName, job_ids: Sequence[Any]) -> None:
        await self._write_all(conn, "delete_jobs", job_table, None, job_ids, list(job_ids))

    async def archive_and_delete_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        params = [*job_ids, status, self.codec._db_time(finished_at, what="finished_at")]
        await self._write_all(conn, "archive_and_delete_jobs", job_table, archived_job_table, job_ids, params)

    @contextlib.asynccontextmanager
    async def savepoint(self, conn: Any) -> AsyncIterator[None]:
        statements = sql.queries(self.dialect)
        await self._execute(conn, statements["job_savepoint"], None, _rowcount)
        try:
            yield
        except BaseException:
            await self._execute(conn, statements["job_savepoint_rollback"], None, _rowcount)
            await self._execute(conn, statements["job_savepoint_release"], None, _rowcount)
            raise
        await self._execute(conn, statements["job_savepoint_release"], None, _rowcount)

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

    @property
    def session(self) -> int:
        """The listening connection's server process id: what an operator, or the conformance suite's N3,
        terminates to break it."""
        return int(self._conn.info.backend_pid)

    def interrupt(self) -> None:
        self._interrupted = True

    async def wait(self, timeout: float) -> bool:
        if self._interrupted:
            return False
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


async def _rowcount(cursor: Any) -> int:
    return int(cursor.rowcount)


async def _nothing(cursor: Any) -> None:
    return None


async def _nothing_list(cursor: Any) -> list[Any]:
    return []


async def _fetch_claimed(cursor: Any) -> Any:
    try:
        return await cursor.fetchone()
    except psycopg.DataError:
        # A stored time Python cannot hold: read with the lenient loaders, as PostgresBackend does.
        return lenient_row(cursor.pgresult, cursor.connection)


async def _fetchall(cursor: Any) -> list[Any]:
    return list(await cursor.fetchall())


async def _first_value(cursor: Any) -> Any:
    row = await cursor.fetchone()
    return None if row is None else row[0]


async def _first_column(cursor: Any) -> list[Any]:
    return [row[0] for row in await cursor.fetchall()]
