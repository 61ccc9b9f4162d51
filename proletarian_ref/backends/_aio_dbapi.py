"""What the asyncio SQL backends share: connections, transactions and Proletarian's verbs, awaited."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, ClassVar, Final, NoReturn

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.backends._dbapi import SqlBackend, _chunks, _wrong_batch_count, _wrong_count
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.tables import TableName

Reader = Callable[[Any], Awaitable[Any]]


class AsyncSqlBackend:
    """Proletarian's statements on an async driver (proletarian_ref.backend.AsyncBackend), as _dbapi's
    SqlBackend is for the threaded ones.

    The statements, their parameters and the rows read back are the dialect's threaded backend's own (its
    pure methods, through `codec`), so a row does not tell which API wrote it. A subclass says how its
    driver checks a connection out and in, begins and ends a transaction, makes and reads cursors.
    """

    dialect: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    # The driver's exception base class: what _raise translates through the codec.
    _driver_error: ClassVar[type[Exception]] = Exception

    def __init__(self, codec: SqlBackend, data_source: Any, *, pooled: bool) -> None:
        # The threaded backend with no data source: it never connects, it only makes statements,
        # parameters and records, and checks `compact`.
        self.codec = codec
        self.compact_plan = codec.compact_plan
        # The codec's first statement of every transaction of transaction(), never of a caller's (None: none).
        self._job_transaction_setting = codec._job_transaction_setting
        self._data_source = data_source
        self._pooled = pooled
        # The connections this backend opened from a factory and that no transaction holds now.
        self._idle: list[Any] = []
        self._open: set[Any] = set()
        # The kept cursors of the connections in _open, one a connection (_execute).
        self._cursors: dict[Any, Any] = {}
        # The writes held but not yet counted on each connection in a pipelined transaction (_pipelines),
        # each (what the driver's _queue_write keeps, what, job id): _settle sends them and checks each
        # changed exactly one row before anything else runs on it, the COMMIT included. No entry for any
        # other connection.
        self._pending: dict[Any, list[tuple[Any, str, Any]]] = {}

    @property
    def chained_claims(self) -> bool:
        """ChainedClaim, as the codec's: the threaded backend's `chain` option."""
        return self.codec.chained_claims

    # -- driver specifics, overridden per driver -------------------------------------------------------

    async def _acquire_pooled(self) -> Any:
        raise NotImplementedError

    async def _release_pooled(self, conn: Any) -> None:
        raise NotImplementedError

    def _check_connection(self, conn: Any) -> None:
        """Raise ConfigurationError if the factory's `conn` is not this driver's async connection."""

    def _is_broken(self, conn: Any) -> bool:
        raise NotImplementedError

    async def _begin(self, conn: Any) -> Any:
        """Leave autocommit for the worker's transaction; returns what _end needs to restore."""
        raise NotImplementedError

    async def _end(self, conn: Any, state: Any) -> None:
        raise NotImplementedError

    async def _close_quietly(self, conn: Any) -> None:
        raise NotImplementedError

    async def _new_cursor(self, conn: Any) -> Any:
        """A cursor that returns rows as tuples, whatever the connection's default."""
        raise NotImplementedError

    async def _fetch_claimed(self, cursor: Any) -> Any:
        """The row the claim returned, or None; a driver may read what it cannot load some other way."""
        return await cursor.fetchone()

    def _pipelines(self, conn: Any) -> bool:
        """Whether the transaction just begun on `conn` holds its single-row writes until _settle (a driver
        that says so implements _queue_write and _settle)."""
        return False

    async def _queue_write(
        self,
        conn: Any,
        pending: list[tuple[Any, str, Any]],
        statement: str,
        params: Any,
        what: str,
        job_id: Any,
    ) -> None:
        """Hold a single-row write of a pipelined transaction in `pending`, as (anything with a `rowcount`
        once settled, what, job id); _settle counts it before anything else runs. `job_id` names the job
        (or jobs) a wrong count is reported for."""
        raise NotImplementedError

    async def _settle(self, conn: Any, pending: list[tuple[Any, str, Any]]) -> None:
        """Send the held writes and check each changed exactly one row (_dbapi.check_counts), emptying
        `pending`: before the COMMIT and before any other statement, so a wrong count still rolls the
        whole transaction back, as it does when each write is its own round trip."""
        raise NotImplementedError

    def _forget(self, conn: Any) -> None:
        """Drop what the backend keeps for `conn`, a connection it opened that is broken or closed."""
        self._cursors.pop(conn, None)
        self._pending.pop(conn, None)

    def _caller_session(self, conn: Any) -> AbstractAsyncContextManager[str]:
        """Around enqueue's INSERT on a caller's connection: yields a prefix for the statement, and puts
        back whatever it changes in the session before the block ends, raised or not."""
        return NO_PREFIX

    def _all_or_none(self, conn: Any) -> AbstractAsyncContextManager[None]:
        """Around the statements of a batch that needed more than one: undoes them all if one fails.

        Nothing by default: after a failed statement PostgreSQL refuses all but a rollback anyway.
        """
        return _nothing_around()

    # -- connections and transactions ------------------------------------------------------------------

    def _raise(self, exc: Exception) -> NoReturn:
        error = self.codec._translate(exc)
        if error is None:
            raise exc
        raise error from exc

    async def _checkout(self) -> Any:
        try:
            if self._pooled:
                return await self._acquire_pooled()
            if self._idle:
                return self._idle.pop()
            if not callable(self._data_source):
                raise ConfigurationError(
                    f"{type(self).__name__} has no data source to open a connection with: pass a pool "
                    f"or a callable returning an awaitable connection"
                )
            conn = await self._data_source()
        except self._driver_error as exc:
            self._raise(exc)
        self._check_connection(conn)
        self._open.add(conn)
        return conn

    async def _checkin(self, conn: Any) -> None:
        if self._pooled:
            await self._release_pooled(conn)
        elif self._is_broken(conn):
            self._open.discard(conn)
            self._forget(conn)
        else:
            self._idle.append(conn)

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """A connection in a transaction that commits when the block ends and rolls back on error.

        A task cancelled inside the block (the worker's stop() at its deadline) closes the connection
        rather than waiting on it: the server rolls the transaction back, the job stays as it was. Any
        other error, BaseException or not, rolls back before it goes on.
        """
        return _Transaction(self)

    async def close(self) -> None:
        """Close the connections this backend opened (a pool, and the factory, stay the caller's)."""
        self._idle.clear()
        for conn in list(self._open):
            self._forget(conn)
            await self._close_quietly(conn)
        self._open.clear()

    # -- statements ------------------------------------------------------------------------------------

    async def _execute(self, conn: Any, statement: str, params: Any, read: Reader) -> Any:
        """Run one statement and return `read` of its cursor, with the driver's errors translated.

        On a pipelined transaction it first settles the writes held before it (_queue_write), so the
        statement sees them done and counted.
        """
        pending = self._pending.get(conn) if self._pending else None
        if pending:
            await self._settle(conn, pending)
        try:
            # A connection the backend opened keeps one cursor (making one costs more than a statement's
            # own work); a caller's or a pool's gets one per statement: the backend cannot tell when it goes.
            cursor = self._cursors.get(conn)
            if cursor is None:
                cursor = await self._new_cursor(conn)
                if conn not in self._open:
                    try:
                        await cursor.execute(statement, params)
                        return await read(cursor)
                    finally:
                        await cursor.close()
                self._cursors[conn] = cursor
            await cursor.execute(statement, params)
            return await read(cursor)
        except self._driver_error as exc:
            self._raise(exc)

    async def _write_one(self, conn: Any, statement: str, params: dict[str, Any], what: str) -> None:
        pending = self._pending.get(conn) if self._pending else None
        if pending is not None:
            await self._queue_write(conn, pending, statement, params, what, params["job_id"])
            return
        count = await self._execute(conn, statement, params, _rowcount)
        if count != 1:
            raise _wrong_count(count, what, params["job_id"])

    async def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        text, params, generated = self.codec._enqueue_statement(job_table, job)
        read = self._generated_id if generated else _nothing
        session = self._caller_session(conn)
        if type(session) is AsyncSessionPrefix:  # nothing to set up: no block to enter and leave
            stored = await self._execute(conn, session.prefix + text, params, read)
        else:
            async with session as prefix:
                stored = await self._execute(conn, prefix + text, params, read)
        return stored if generated else job.job_id

    async def _generated_id(self, cursor: Any) -> Any:
        """The id the database made for the enqueue_db_generated INSERT."""
        return await _first_value(cursor)

    async def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]:
        """BatchEnqueue: multi-row INSERTs of at most the threaded backend's rows and bytes each."""
        generated = jobs[0].job_id is None
        rows = list(self.codec._batch_rows(jobs, generated=generated))
        name = "enqueue_many_db_generated" if generated else "enqueue_many"
        ids: list[Any] = []
        chunks = list(_chunks(rows, self.codec._BATCH_ROWS, self.codec._BATCH_BYTES))
        all_or_none = self._all_or_none(conn) if len(chunks) > 1 else _nothing_around()
        async with self._caller_session(conn) as prefix, all_or_none:
            for chunk in chunks:
                statement = prefix + sql.render_rows(self.dialect, name, job_table, len(chunk))
                params = [value for row in chunk for value in row]
                read = _first_column if generated else _nothing_list
                ids.extend(await self._execute(conn, statement, params, read))
        return ids if generated else [job.job_id for job in jobs]

    @contextlib.asynccontextmanager
    async def _enqueue_many_savepoint(self, conn: Any) -> AsyncIterator[None]:
        """The block inside SAVEPOINT proletarian_enqueue_many of the caller's open transaction, as the
        threaded backend's: rolled back to and released if the block raises, released if not."""
        statements = sql.queries(self.dialect)
        await self._execute(conn, statements["enqueue_many_savepoint"], None, _rowcount)
        try:
            yield
        except BaseException:
            # The batch's own error is the one to report; a session that cannot roll back is broken anyway.
            with contextlib.suppress(Exception):
                await self._execute(conn, statements["enqueue_many_rollback"], None, _rowcount)
                await self._execute(conn, statements["enqueue_many_release"], None, _rowcount)
            raise
        await self._execute(conn, statements["enqueue_many_release"], None, _rowcount)

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        row = await self._execute(conn, *self._claim(job_table, queue, now), self._fetch_claimed)
        return None if row is None else self.codec._job_record(row)

    def _claim(self, job_table: TableName, queue: str, now: datetime) -> tuple[str, dict[str, Any]]:
        """get_next_job's statement and parameters."""
        codec = self.codec
        params = {"queue": queue, "now": codec._db_time(now, what="now")}
        return codec._statements["get_next_job", job_table, None], params

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
        rows = await self._execute(conn, *self._batch_claim(job_table, queue, now, limit), _fetchall)
        return [self.codec._job_record(row) for row in rows]

    def _batch_claim(
        self, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> tuple[str, dict[str, Any]]:
        """get_next_jobs' statement and parameters."""
        codec = self.codec
        params = {"queue": queue, "now": codec._db_time(now, what="now"), "limit": limit}
        return codec._render("get_next_jobs", job_table), params

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
        params = self.codec._archive_and_delete_params(job_ids, status, finished_at)
        await self._write_all(conn, "archive_and_delete_jobs", job_table, archived_job_table, job_ids, params)

    @contextlib.asynccontextmanager
    async def savepoint(self, conn: Any) -> AsyncIterator[None]:
        statements = sql.queries(self.dialect)
        await self._execute(conn, statements["job_savepoint"], None, _rowcount)
        # Its end runs at once, on a pipelined transaction too (only held writes wait): a savepoint the
        # handler's own COMMIT or ROLLBACK took away must fail here, where the job's transaction guard tells
        # it apart, not at the COMMIT (proletarian_ref._async.job_tx).
        try:
            yield
        except BaseException:
            await self._execute(conn, statements["job_savepoint_rollback"], None, _rowcount)
            await self._execute(conn, statements["job_savepoint_release"], None, _rowcount)
            raise
        await self._execute(conn, statements["job_savepoint_release"], None, _rowcount)


class AsyncSessionPrefix(AbstractAsyncContextManager[str]):
    """A _caller_session that changes nothing in the session and only puts `prefix` before the statement
    (_dbapi.SessionPrefix, awaited). Stateless, so one serves every call and task."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    async def __aenter__(self) -> str:
        return self.prefix

    async def __aexit__(self, *exc_info: object) -> None:
        return None


NO_PREFIX: Final = AsyncSessionPrefix("")


@contextlib.asynccontextmanager
async def _nothing_around() -> AsyncIterator[None]:
    yield


async def _rowcount(cursor: Any) -> int:
    return int(cursor.rowcount)


async def _nothing(cursor: Any) -> None:
    return None


async def _nothing_list(cursor: Any) -> list[Any]:
    return []


async def _fetchall(cursor: Any) -> list[Any]:
    return list(await cursor.fetchall())


async def _first_value(cursor: Any) -> Any:
    row = await cursor.fetchone()
    return None if row is None else row[0]


async def _first_column(cursor: Any) -> list[Any]:
    return [row[0] for row in await cursor.fetchall()]


class _Transaction:
    """AsyncSqlBackend.transaction()'s block, a class rather than a generator-based context manager: it is
    entered and left for every job, and the generator's machinery costs more than the block's own work
    (as _dbapi's threaded _Transaction)."""

    __slots__ = ("_backend", "_conn", "_state")

    def __init__(self, backend: AsyncSqlBackend) -> None:
        self._backend = backend

    async def __aenter__(self) -> Any:
        backend = self._backend
        conn = self._conn = await backend._checkout()
        try:
            try:
                self._state = await backend._begin(conn)
            except backend._driver_error as exc:
                backend._raise(exc)
        except BaseException:
            await backend._checkin(conn)
            raise
        if backend._pipelines(conn):
            backend._pending[conn] = []
        setting = backend._job_transaction_setting
        if setting is not None:
            try:
                await backend._execute(conn, setting, None, _nothing)
            except BaseException as exc:
                # Rolled back (or closed) and handed back as after any error in the block.
                await self.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        return conn

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        backend, conn = self._backend, self._conn
        # Writes still queued on a pipelined transaction: counted before the COMMIT, dropped on an error.
        pending = backend._pending.pop(conn, None) if backend._pending else None
        try:
            if exc is not None:
                await self._undo(exc)
                return  # the block's error goes on as it is
            if pending:
                try:
                    await backend._settle(conn, pending)
                except BaseException as count_error:
                    await self._undo(count_error)
                    raise
            try:
                await conn.commit()
            except backend._driver_error as commit_error:
                backend._raise(commit_error)
            if not backend._is_broken(conn):
                with contextlib.suppress(Exception):
                    await backend._end(conn, self._state)
        finally:
            await backend._checkin(conn)

    async def _undo(self, exc: BaseException) -> None:
        backend, conn = self._backend, self._conn
        if isinstance(exc, asyncio.CancelledError):
            # Cancelled, perhaps inside a statement: nothing more is awaited on the connection.
            # The server rolls back when it sees the connection go (the row lock lasts until then).
            await backend._close_quietly(conn)
        else:
            # Any other error, a non-Exception one too: rolled back at once, so the job is claimable
            # again as soon as this returns; a connection that cannot roll back is closed.
            try:
                await conn.rollback()
            except Exception:
                await backend._close_quietly(conn)
