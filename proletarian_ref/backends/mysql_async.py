"""The asyncio MySQL backend (MariaDB too), on aiomysql's Connection and Pool."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, ClassVar, Final

import aiomysql
import pymysql
from pymysql.converters import encoders, escape_item

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.backends import mysql_chain, mysql_claim
from proletarian_ref.backends._aio_dbapi import (
    AsyncSessionPrefix,
    AsyncSqlBackend,
    _fetchall,
    _nothing,
    _nothing_around,
    _rowcount,
)
from proletarian_ref.backends._dbapi import _wrong_batch_count, _wrong_count
from proletarian_ref.backends.dsn import mysql_connect_kwargs
from proletarian_ref.backends.mysql import (
    _ISOLATION_SQL,
    _MARIADB_UTC_PREFIX,
    _TIME_ZONE_SQL,
    _UTC,
    MySQLBackend,
)
from proletarian_ref.backends.mysql_payload import PayloadColumn, check_payload_fits, statements
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.tables import TableName

# MariaDB runs one statement with a session variable changed and restores it itself (MySQLBackend's way).
_MARIADB_UTC_SESSION: Final = AsyncSessionPrefix(_MARIADB_UTC_PREFIX)


class AsyncMySQLBackend(AsyncSqlBackend):
    """Proletarian's statements on MySQL 8.0.1+ / MariaDB 10.6+, awaited (backend.AsyncBackend).

    `data_source` is an aiomysql.Pool, or a zero-argument callable returning an awaitable aiomysql
    Connection (e.g. `functools.partial(aiomysql.connect, host=..., db=...)`); None serves enqueue on
    callers' connections only. The statements, their parameters and the rows read back are the threaded
    MySQLBackend's own (through `codec`), and aiomysql escapes parameters with PyMySQL's own converters,
    so a row does not tell which API wrote it. With `compact=True` a finished job's archive and delete go
    as one multi-statement query, each row count checked, as MySQLBackend's compact plan does (aiomysql
    opens every connection with CLIENT.MULTI_STATEMENTS).

    With `chain=True` (backend.ChainedClaim and ChainedBatchClaim) it chains as MySQLBackend(chain=True)
    does: in the worker's transaction a finished job's archive and delete (compact=True) are kept back and
    sent, each count checked by the server, with the COMMIT and the next claim as one query, one round trip
    a job (backends/mysql_chain.py); a kept-back write goes alone before any other statement and before the
    block's own COMMIT. Without compact=True the COMMIT and the claim go as one query.

    `bounded_claim` is MySQLBackend's: the same claims are bounded, on the index looked up the same way.
    """

    dialect: ClassVar[str] = "mysql"
    capabilities: ClassVar[Capabilities] = MySQLBackend.capabilities
    _driver_error: ClassVar[type[Exception]] = pymysql.err.MySQLError
    codec: MySQLBackend

    def __init__(
        self,
        data_source: Any = None,
        *,
        compact: bool = False,
        chain: bool = False,
        bounded_claim: bool = True,
    ) -> None:
        super().__init__(
            MySQLBackend(None, compact=compact, chain=chain, bounded_claim=bounded_claim),
            data_source,
            pooled=isinstance(data_source, aiomysql.Pool),
        )
        # The server session each worker connection was prepared in (time zone, isolation): a connection
        # that reconnects gets a new session with the server's defaults.
        self._prepared: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        # The payload columns of (server, job table, archive table), as MySQLBackend keeps them.
        self._payload_columns: dict[tuple[Any, ...], list[PayloadColumn]] = {}

    # -- aiomysql's connections, transactions and cursors ----------------------------------------------

    async def _acquire_pooled(self) -> Any:
        return await self._data_source.acquire()

    async def _release_pooled(self, conn: Any) -> None:
        await self._data_source.release(conn)

    def _check_connection(self, conn: Any) -> None:
        if not isinstance(conn, aiomysql.Connection):
            raise ConfigurationError(
                f"the data source returned {type(conn).__name__}, not an aiomysql Connection"
            )

    def _is_broken(self, conn: Any) -> bool:
        return bool(conn.closed)

    async def _begin(self, conn: Any) -> bool:
        # Only the worker's own connections are prepared: a caller's session is never changed (see
        # _caller_session). UTC for TIMESTAMP literals and READ COMMITTED, for MySQLBackend's reasons
        # (its _prepare_session); session state survives commits, so once per server session will do.
        session = conn.thread_id()
        if self._prepared.get(conn) != session:
            async with conn.cursor(_Cursor) as cursor:
                await cursor.execute(_TIME_ZONE_SQL, (_UTC,))
                await cursor.execute(_ISOLATION_SQL)
            self._prepared[conn] = session
        was_autocommit = bool(conn.get_autocommit())
        if was_autocommit:
            await conn.autocommit(False)
        return was_autocommit

    async def _end(self, conn: Any, state: bool) -> None:
        if state:
            await conn.autocommit(True)

    async def _close_quietly(self, conn: Any) -> None:
        # aiomysql's close() drops the socket at once, sending nothing: the server rolls back as it sees
        # the connection go.
        with contextlib.suppress(Exception):
            conn.close()

    async def _new_cursor(self, conn: Any) -> Any:
        # A plain tuple cursor whatever cursorclass the caller's connection was made with.
        return await conn.cursor(_Cursor)

    async def _generated_id(self, cursor: Any) -> Any:
        return cursor.lastrowid

    def _caller_session(self, conn: Any) -> AbstractAsyncContextManager[str]:
        # As MySQLBackend's: MariaDB changes the time zone for the INSERT alone; MySQL's session is read,
        # set to UTC only if it is not, and put back before enqueue returns or raises.
        if "MariaDB" in str(getattr(conn, "server_version", "")):
            return _MARIADB_UTC_SESSION
        return self._utc_session(conn)

    @contextlib.asynccontextmanager
    async def _utc_session(self, conn: Any) -> AsyncIterator[str]:
        try:
            async with conn.cursor(_Cursor) as cursor:
                await cursor.execute("SELECT @@session.time_zone")
                (zone,) = await cursor.fetchone()
                if zone == _UTC:
                    zone = None
                else:
                    await cursor.execute(_TIME_ZONE_SQL, (_UTC,))
        except pymysql.err.MySQLError as exc:
            self._raise(exc)
        if zone is None:
            yield ""
            return
        try:
            yield ""
        except BaseException:
            # The statement's error is the one to report; a session that cannot run SET is broken anyway.
            with contextlib.suppress(Exception):
                await self._set_time_zone(conn, zone)
            raise
        try:
            await self._set_time_zone(conn, zone)
        except pymysql.err.MySQLError as exc:
            self._raise(exc)

    @staticmethod
    async def _set_time_zone(conn: Any, zone: str) -> None:
        async with conn.cursor(_Cursor) as cursor:
            await cursor.execute(_TIME_ZONE_SQL, (zone,))

    def _all_or_none(self, conn: Any) -> AbstractAsyncContextManager[None]:
        # As MySQLBackend's: a failed statement undoes only itself on MySQL, so a batch of several
        # statements runs in a savepoint of the caller's transaction; in autocommit mode there is none.
        if conn.get_autocommit():
            return _nothing_around()
        return self._enqueue_many_savepoint(conn)

    async def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]:
        if jobs and jobs[0].job_id is None:
            # MySQLBackend's reason: a multi-row INSERT reports only its first AUTO_INCREMENT id.
            raise ConfigurationError(
                "enqueue_many cannot use the database-generated id strategy on MySQL: a multi-row INSERT "
                "does not say which ids it made; use a UUID strategy, or enqueue one job at a time"
            )
        return await super().enqueue_many(conn, job_table, jobs)

    # -- payload limits (awaited: proletarian_ref.aio calls it before each INSERT) ---------------------

    async def check_payload(
        self, conn: Any, job_table: TableName, archived_job_table: TableName | None, payload: str
    ) -> None:
        """MySQLBackend.check_payload, awaited: PayloadTooLargeError if `payload` does not fit the payload
        column of either table, the columns read once per server and tables, and again before refusing."""
        server = (getattr(conn, "host", None), getattr(conn, "port", None), getattr(conn, "db", None))
        key = (*server, job_table, archived_job_table)
        columns = self._payload_columns.get(key)
        if columns is not None and check_payload_fits(payload, columns, raise_error=False):
            return
        archive = archived_job_table if archived_job_table is not None else job_table
        params = {
            "job_schema": job_table.schema,
            "job_name": job_table.name,
            "archive_schema": archive.schema,
            "archive_name": archive.name,
        }
        rows = await self._execute(conn, statements()["payload_columns"], params, _fetchall)
        columns = self._payload_columns[key] = [PayloadColumn(*row) for row in rows]
        check_payload_fits(payload, columns, raise_error=True)

    # -- chained claims (ChainedClaim, ChainedBatchClaim): the worker's transaction keeps a finished -----
    # job's archive and delete in _pending (a Deferred alone) until the COMMIT and the next claim take it.

    def _pipelines(self, conn: Any) -> bool:
        # Marks the transaction as chained (its _pending entry); only the compact archive is ever held.
        return self.codec.chained_claims

    async def _queue_write(
        self,
        conn: Any,
        pending: list[tuple[Any, str, Any]],
        statement: str,
        params: Any,
        what: str,
        job_id: Any,
    ) -> None:
        # Not held: a single-row write other than the compact archive (the exact plan's archive_job and
        # delete_job, retry_at) goes at once, after any kept-back write, its count checked as unchained.
        count = await self._execute(conn, statement, params, _rowcount)
        if count != 1:
            raise _wrong_count(count, what, job_id)

    async def _settle(self, conn: Any, pending: list[tuple[Any, str, Any]]) -> None:
        # The kept-back write alone, before another statement or the block's own COMMIT: checked by the
        # server as in a chain, so a wrong count raises before anything after it runs.
        deferred = pending.pop()[0]
        await self._execute(conn, deferred.text, None, deferred.acheck)

    def _chained_pending(self, conn: Any) -> list[tuple[Any, str, Any]] | None:
        """What `conn`'s chained transaction holds back (its _pending entry), or None: not one of this
        backend's chained transactions (a caller's connection, or no chain)."""
        return self._pending.get(conn) if self._pending else None

    async def _keep_back(
        self, conn: Any, pending: list[tuple[Any, str, Any]], deferred: mysql_chain.Deferred
    ) -> None:
        """Hold `deferred` for the chain in `pending`; one held already (two finished without a statement
        between, which the worker never does) goes first."""
        if pending:
            await self._settle(conn, pending)
        pending.append((deferred, "chain", deferred.job_id))

    async def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        """ChainedClaim: the kept-back archive and delete (checked by the server), COMMIT and the next claim
        as one query, as MySQLBackend's. On a connection outside transaction() (a caller's), COMMIT and the
        claim apart."""
        _, params = self._claim(job_table, queue, now)
        statement = await self._claim_statement(conn, "get_next_job", job_table)
        row = await self._chained(conn, statement, params, self._fetch_claimed)
        return None if row is None else self.codec._job_record(row)

    async def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        """ChainedBatchClaim: commit_and_get_next_job's query with batch mode's claim."""
        _, params = self._batch_claim(job_table, queue, now, limit)
        statement = await self._claim_statement(conn, "get_next_jobs", job_table)
        rows = await self._chained(conn, statement, params, _fetchall)
        return [self.codec._job_record(row) for row in rows]

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        _, params = self._claim(job_table, queue, now)
        statement = await self._claim_statement(conn, "get_next_job", job_table)
        row = await self._execute(conn, statement, params, self._fetch_claimed)
        return None if row is None else self.codec._job_record(row)

    async def get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        _, params = self._batch_claim(job_table, queue, now, limit)
        statement = await self._claim_statement(conn, "get_next_jobs", job_table)
        rows = await self._execute(conn, statement, params, _fetchall)
        return [self.codec._job_record(row) for row in rows]

    async def _claim_statement(self, conn: Any, name: str, job_table: TableName) -> str:
        """MySQLBackend._claim_statement, awaited: the same claim, its index looked up on `conn` once."""
        codec = self.codec
        text = codec._known_claim(name, job_table)
        if text is None:
            statement, params = mysql_claim.lookup(job_table)
            text = codec._claim_indexes.record(
                name, job_table, await self._execute(conn, statement, params, _fetchall)
            )
        return text

    async def _chained(self, conn: Any, claim: str, params: dict[str, Any], read: Any) -> Any:
        pending = self._chained_pending(conn)
        if pending is None:
            await self._execute(conn, mysql_chain.commit_statement(), None, _nothing)
            return await self._execute(conn, claim, params, read)
        deferred = pending.pop()[0] if pending else None
        parts = (mysql_chain.commit_statement(), mysql_chain.literal(_quote(conn), claim, params))
        text = ";\n".join(parts if deferred is None else (deferred.text, *parts))

        async def chained(cursor: Any) -> Any:
            if deferred is not None:
                await deferred.acheck(cursor)
                await cursor.nextset()  # to the COMMIT's result
            await cursor.nextset()  # to the claim's: a failed COMMIT raised, and the claim did not run
            return await read(cursor)

        # No parameters: the text is sent as it is (its values are already written in).
        return await self._execute(conn, text, None, chained)

    # -- the compact plan: two statements in one query -------------------------------------------------

    async def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        """MySQLBackend's compact plan: archive_job and delete_job in one query, each count checked; in a
        chained transaction kept back to go with its COMMIT."""
        rendered = self.codec._statements
        params = self.codec._archive_params(job_id, status, finished_at)
        pending = self._chained_pending(conn)
        if pending is not None:
            deferred = mysql_chain.deferred_job(_quote(conn), rendered, job_table, archived_job_table, params)
            await self._keep_back(conn, pending, deferred)
            return
        archive, delete = (
            rendered["archive_job", job_table, archived_job_table],
            rendered["delete_job", job_table, None],
        )
        statement = f"{archive};\n{delete}"
        archived, deleted = await self._execute(conn, statement, params, _both_counts)
        if archived != 1:
            raise _wrong_count(archived, "archive_job", job_id)
        if deleted != 1:
            raise _wrong_count(deleted, "delete_job", job_id)

    async def archive_and_delete_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        """The compact plan in batch mode: archive_jobs and delete_jobs in one query, each count checked,
        or kept back as archive_and_delete_job keeps them."""
        finished = self.codec._db_time(finished_at, what="finished_at")
        pending = self._chained_pending(conn)
        if pending is not None:
            deferred = mysql_chain.deferred_batch(
                _quote(conn), job_table, archived_job_table, job_ids, status, finished
            )
            await self._keep_back(conn, pending, deferred)
            return
        count = len(job_ids)
        statement = (
            f"{sql.render_ids(self.dialect, 'archive_jobs', job_table, archived_job_table, count)};\n"
            f"{sql.render_ids(self.dialect, 'delete_jobs', job_table, None, count)}"
        )
        params = [status, finished, *job_ids, *job_ids]
        archived, deleted = await self._execute(conn, statement, params, _both_counts)
        if archived != count:
            raise _wrong_batch_count(archived, "archive_jobs", count)
        if deleted != count:
            raise _wrong_batch_count(deleted, "delete_jobs", count)


class _Cursor(aiomysql.Cursor):  # type: ignore[misc]  # aiomysql has no type information
    """aiomysql's tuple cursor, its parameters written into the SQL as PyMySQL's own Connection.escape
    writes them, so a statement is the threaded backend's text byte for byte.

    aiomysql's escape writes bytes with PyMySQL's escape_bytes_prefixed, which PyMySQL 1.2 replaced by a
    string (kept for aiomysql's import only), so an id would fail to bind; PyMySQL writes bytes as X'hex'.
    """

    def _escape_args(self, args: Any, conn: Any) -> Any:
        if isinstance(args, (tuple, list)):
            return tuple(_literal(conn, arg) for arg in args)
        if isinstance(args, dict):
            return {key: _literal(conn, value) for key, value in args.items()}
        return _literal(conn, args)


def _literal(conn: Any, value: Any) -> str:
    """PyMySQL 1.2's Connection.escape on an aiomysql connection (its escape_string minds the server's
    NO_BACKSLASH_ESCAPES mode, as PyMySQL's does)."""
    if isinstance(value, str):
        return f"'{conn.escape_string(value)}'"
    if isinstance(value, (bytes, bytearray)):
        return f"X'{value.hex()}'"
    return str(escape_item(value, conn.charset, mapping=encoders))


def _quote(conn: Any) -> mysql_chain.Quote:
    """_literal on `conn`: a parameter as _Cursor writes it in, for the chain's statements."""
    return functools.partial(_literal, conn)


def aiomysql_connect_kwargs(dsn: str) -> dict[str, Any]:
    """aiomysql.connect's keyword arguments for the mysql:// DSN that MySQLBackend's connection_factory
    takes (docs/mysql.md): the same host, port, user, password, database, charset and connect_timeout.
    read_timeout and write_timeout, which aiomysql has no option for, and TLS are refused (not yet)."""
    kwargs = mysql_connect_kwargs(dsn)
    unsupported = sorted(key for key in kwargs if key.startswith("ssl") or key.endswith("_timeout"))
    unsupported = [key for key in unsupported if key != "connect_timeout"]
    if unsupported:
        raise ConfigurationError(
            f"the asyncio MySQL backend does not take {', '.join(unsupported)} from a DSN yet: pass "
            "aiomysql.connect's own arguments (ssl=an SSLContext) through a factory of your own"
        )
    if "database" in kwargs:
        kwargs["db"] = kwargs.pop("database")
    return kwargs


def aiomysql_connection_factory(dsn: str, **options: Any) -> Callable[[], Awaitable[Any]]:
    """A zero-argument callable opening an aiomysql Connection to `dsn` (options passed to aiomysql.connect):
    a data source of AsyncMySQLBackend and of proletarian_ref.aio.create_queue_worker."""
    return functools.partial(aiomysql.connect, **{**aiomysql_connect_kwargs(dsn), **options})


async def _both_counts(cursor: Any) -> tuple[int, int]:
    """The row counts of a two-statement query; the second -1 if the server sent one result only."""
    first = int(cursor.rowcount)
    if not await cursor.nextset():
        return first, -1
    return first, int(cursor.rowcount)
