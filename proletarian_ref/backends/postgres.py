"""The PostgreSQL backend, on psycopg 3 (and psycopg_pool pools as data sources)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import selectors
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, ClassVar, Final
from uuid import UUID

import psycopg
import psycopg.errors
from psycopg import postgres
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import AdaptersMap, Loader, Transformer
from psycopg.pq import Format, TransactionStatus
from psycopg.rows import tuple_row

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.backends._dbapi import SqlBackend, _close_quietly, _ignore, _Lease
from proletarian_ref.clock import EPOCH_NAIVE, EPOCH_UTC
from proletarian_ref.errors import (
    ConfigurationError,
    DatabaseError,
    SchemaMissingError,
    TransientDatabaseError,
)
from proletarian_ref.tables import TableName

try:
    from psycopg_pool import PoolTimeout
except ImportError:  # pragma: no cover - psycopg_pool is optional; without it no pool can time out.
    PoolTimeout = None  # type: ignore[assignment,misc]

# SQLSTATE classes and codes after which the same work may succeed on a retry: connection exceptions,
# transaction rollbacks (deadlock, serialization), insufficient resources, operator intervention (admin
# shutdown, server restart), lock_not_available and idle_in_transaction_session_timeout.
_TRANSIENT_CLASSES: Final = frozenset({"08", "40", "53", "57"})
_TRANSIENT_CODES: Final = frozenset({"55P03", "25P03"})
# read_only_sql_transaction: the server is a standby now, typically a primary just demoted by a failover
# manager (Patroni) that a proxy (HAProxy, between two health checks) still sends connections to. A new
# connection can reach the new primary, so the error is transient and the thread drops the connection.
_READ_ONLY_CODE: Final = "25006"
READ_ONLY_ADVICE: Final = (
    "the server is read-only: a standby, such as a primary just demoted by a failover, that a proxy "
    "still routes to; the worker connects again, which reaches the primary once the proxy has noticed"
)
# invalid_sql_statement_name and duplicate_prepared_statement, on a statement psycopg prepared by itself
# (its names start with _pg3_): the sign of a pooler that moves a client between server connections.
_LOST_PREPARED_CODES: Final = frozenset({"26000", "42P05"})
_PSYCOPG_PREPARED_PREFIX: Final = '"_pg3_'
PGBOUNCER_ADVICE: Final = (
    "psycopg prepares a statement once it has run prepare_threshold (default 5) times on a connection, "
    "and the server connection that ran this transaction does not have it (or has another by that name): "
    "this happens behind PgBouncer in transaction mode (before 1.21, or without max_prepared_statements). "
    "Connect with prepare_threshold=None: psycopg.connect(..., prepare_threshold=None), "
    "ConnectionPool(kwargs={'prepare_threshold': None}), or ?prepare_threshold=none in a proletarian-ref "
    "DSN (docs/scaling.md)"
)


# The compact plan's archive, and its variant whose row count the server checks (sql/postgresql/queries.sql):
# a count it refuses comes back as an integer's invalid text, which carries the count.
_ARCHIVE: Final = "archive_and_delete_job"
_CHECKED_ARCHIVE: Final = "archive_and_delete_job_checked"
_CHECKED_BATCH_ARCHIVE: Final = "archive_and_delete_jobs_checked"
_SERVER_CHECKED: Final = frozenset({_CHECKED_ARCHIVE, _CHECKED_BATCH_ARCHIVE})
_CHECKED_COUNT: Final = re.compile(r'"(archive_and_delete_jobs?) changed (\d+) rows(?: of (\d+) jobs)?"')
_INVALID_TEXT_CODE: Final = "22P02"
# The key of the cursor a pipelined transaction's BEGIN goes by, among the thread's kept cursors.
_BEGIN: Final = "begin"


# NOTIFY channels are identifiers (NAMEDATALEN - 1 bytes); payloads must stay under 8,000 bytes.
_MAX_CHANNEL_BYTES: Final = 63
_MAX_PAYLOAD_BYTES: Final = 1000
# How long a new listener waits for its own test notification before it says it may be deaf. Delivery
# takes milliseconds; a probe payload is never a queue's keyword text (those start with a colon), so
# other workers' listeners ignore it.
PROBE_TIMEOUT_S: Final = 5.0
_PROBE_PREFIX: Final = "probe:"


def notification_channel(job_table: TableName) -> str:
    """The NOTIFY channel of a job table: its name as PostgreSQL folds it, hashed if over 63 bytes.

    A dot cannot occur in either part of a TableName, so two tables never share a channel by accident.
    """
    channel = f"proletarian.{str(job_table).lower()}"
    if len(channel) > _MAX_CHANNEL_BYTES:
        channel = "proletarian." + hashlib.sha1(channel.encode("ascii")).hexdigest()
    return channel


def notification_payload(queue: str) -> str:
    """A queue's keyword text as a NOTIFY payload; a very long one by its hash, within the server's limit."""
    data = queue.encode("utf-8")
    if len(data) <= _MAX_PAYLOAD_BYTES:
        return queue
    return "sha256:" + hashlib.sha256(data).hexdigest()


# tzdata's names of zones whose offset is zero at every instant, as psycopg gives a session TimeZone.
_UTC_ZONE_NAMES: Final = frozenset(
    {"UTC", "Etc/UTC", "UCT", "Etc/UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu", "GMT", "Etc/GMT"}
)
# Per such zone object, 1970-01-01 in it: a time minus it is the time since the epoch, with no offset asked.
_UTC_ZONE_EPOCHS: dict[tzinfo, datetime] = {}
_TWO_DIGITS: Final = tuple(f"{n:02d}" for n in range(100))
_THREE_DIGITS: Final = tuple(f"{n:03d}" for n in range(1000))


# The last whole second utc_text wrote: (days, seconds) since the epoch and its text up to the seconds.
# Both of a job's times, and the next jobs', nearly always fall in one second. Its one entry is a tuple
# replaced whole, so threads sharing it each read a consistent one.
_last_second: list[tuple[int, int, str]] = [(0, -1, "")]


def utc_text(value: datetime) -> str:
    """`value.astimezone(UTC).isoformat()`, character for character, in a third of the instructions.

    isoformat formats through the C API's printf-like formatting and asks the tzinfo for its offset, and
    every job binds two times: this was a twentieth of a job's client instructions. The date and time of
    day are formatted once a second (_last_second); each call adds only its microseconds.
    """
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    since = value - EPOCH_UTC
    days, seconds, text = _last_second[0]
    if seconds != since.seconds or days != since.days:
        text = _second_text(value, since)
    micro = since.microseconds
    if micro:
        return f"{text}.{_THREE_DIGITS[micro // 1000]}{_THREE_DIGITS[micro % 1000]}+00:00"
    return text + "+00:00"


def _second_text(value: datetime, since: timedelta) -> str:
    """`value` as isoformat writes it up to the seconds, kept in _last_second for the calls after it."""
    year = value.year
    two = _TWO_DIGITS
    text = (
        f"{year if year >= 1000 else format(year, '04d')}-{two[value.month]}-{two[value.day]}"
        f"T{two[value.hour]}:{two[value.minute]}:{two[value.second]}"
    )
    _last_second[0] = (since.days, since.seconds, text)
    return text


class _LenientLoader(Loader):
    """Reads a timestamp Python cannot hold, which SQL can write, as the nearest datetime.

    Without it such a row could never be claimed: the claim itself would fail on every poll, the row
    would stay the oldest due one, and no other job of the queue would run (docs/failure-modes.md).
    The stored value is left as it is; the archive copies it unchanged. Every other value goes to the
    loader psycopg has for the type. Used only for a claimed row that psycopg's own loaders refused
    (_fetch_claimed): a Python loader on every claim cost 1.5% of a job's client instructions.
    """

    tz: ClassVar[tzinfo | None]

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        loader_class = postgres.adapters.get_loader(oid, Format.TEXT)
        if loader_class is None:  # pragma: no cover - psycopg always registers both time types
            raise LookupError(f"psycopg has no text loader for type oid {oid}")
        self._load = loader_class(oid, context).load

    def load(self, data: Buffer) -> datetime:
        try:
            loaded: datetime = self._load(data)
        except psycopg.DataError:
            # psycopg refuses what Python cannot hold: 'infinity', '-infinity', BC years and years after
            # 9999.
            low = bytes(data).startswith(b"-") or bytes(data).endswith(b"BC")
            return (datetime.min if low else datetime.max).replace(tzinfo=self.tz)
        return loaded


class _LenientTimestamptzLoader(_LenientLoader):
    tz = UTC


class _LenientTimestampLoader(_LenientLoader):
    """The same for a legacy TIMESTAMP column (UTC wall-clock time, naive until _from_db_time)."""

    tz = None


# The fields psycopg's BaseCursor.__init__ sets, as of psycopg 3.1 to 3.3; another psycopg gets the
# usual conn.cursor() instead of _OneStatementCursor.
_CURSOR_SLOTS: Final = frozenset(
    {
        *("_conn", "format", "_adapters", "arraysize", "_closed", "_results", "pgresult", "_pos"),
        *("_iresult", "_rowcount", "_query", "_tx", "_last_query", "_row_factory", "_make_row"),
        *("_pgconn", "_execmany_returning", "_statusmessage", "__weakref__"),
    }
)
_CONNECTION_OK: Final = psycopg.pq.ConnStatus.OK
_LEAN_CURSOR: Final = frozenset(getattr(psycopg.Cursor.__mro__[1], "__slots__", ())) == _CURSOR_SLOTS


class _OneStatementCursor(psycopg.Cursor[Any]):
    """A tuple-row cursor for one statement on a caller's connection, at a fraction of the set-up.

    psycopg's own cursor copies the connection's adapters, so that adapters registered on the cursor
    stay on it, and hooks a callback into the copy for loaders registered after a result: with the
    calls around it, about a tenth of a single enqueue's client instructions, for a cursor that lives
    one statement. This one registers nothing and reads the connection's adapters as they are, which is
    what the copy would hold; it serves only connections whose cursor_factory is psycopg's Cursor.
    """

    __slots__ = ()

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._conn = connection
        self.format = Format.TEXT
        self._pgconn = connection.pgconn
        self._adapters = connection.adapters
        self.arraysize = 1
        self._closed = False
        self._last_query = None
        self._row_factory = tuple_row
        # BaseCursor._reset(), inline: each Python call is a noticeable part of a cursor this cheap.
        self._results = []
        self.pgresult = None
        self._pos = self._iresult = 0
        self._rowcount = -1
        self._statusmessage = None
        self._query = None
        self._execmany_returning = None

    def close(self) -> None:
        # The cursor goes with its one statement, and its result with it: marking it closed is enough.
        self._closed = True


class PostgresBackend(SqlBackend):
    """Proletarian's statements on PostgreSQL 9.5+ (SKIP LOCKED).

    With `pipeline=True` the connections the backend opens itself stay in psycopg's pipeline mode, so a
    job's transaction takes three round trips instead of five: BEGIN with the claim (the backend queues
    BEGIN itself: psycopg syncs after each BEGIN it sends in pipeline mode), the archive INSERT and the
    DELETE together with their row counts checked, then COMMIT. The statements, their order, the
    transaction and the rows are the same (docs/worker.md, "Statement plans"). A pool's connections, and
    callers' connections, are never put in pipeline mode.

    With `compact=True` a finished job's archive and delete are one statement (archive_and_delete_job:
    a DELETE ... RETURNING inside the archive INSERT), so a job's transaction takes four statements
    instead of five, on every connection, the same rows written (docs/worker.md, "Statement plans").

    With `chain=True` (backend.ChainedClaim) a queue worker at one job a transaction commits a finished
    job's transaction and claims the next job without leaving its transaction() block: COMMIT AND CHAIN
    (COMMIT and BEGIN on a server before PostgreSQL 12), then the claim, so a job takes three round trips
    on the compact plan instead of four; with `pipeline=True` as well, one: the finished job's archive,
    whose row count the server checks (archive_and_delete_job_checked), goes with the COMMIT AND CHAIN
    and the claim. AND CHAIN keeps the isolation level and access mode the connection was given for
    every job of the chain. Each job keeps a transaction of its own, its handler's writes and its archive
    row in it (docs/worker.md, "Statement plans").

    With `synchronous_commit_off=True` every transaction the backend opens itself (the worker's job
    transaction: claim, handler, archive, delete) begins with `SET LOCAL synchronous_commit = off`, so its
    COMMIT does not wait for the WAL flush. A server crash can lose the last such commits: their jobs are
    back in the queue and run again (at least once, as Proletarian), a job's effects and its archive row
    lost together. Enqueue on a caller's connection is never touched (docs/worker.md, "Asynchronous
    commit"). MySQL has no per-transaction equivalent: MySQLBackend does not take the option.
    """

    dialect: ClassVar[str] = "postgresql"
    _chains: ClassVar[bool] = True
    capabilities: ClassVar[Capabilities] = Capabilities(handler_transaction=True)

    def __init__(
        self,
        data_source: Any = None,
        *,
        first_connection: Any = None,
        pipeline: bool = False,
        compact: bool = False,
        synchronous_commit_off: bool = False,
        chain: bool = False,
    ) -> None:
        if not isinstance(pipeline, bool):
            raise ConfigurationError(f"pipeline must be True or False, got {pipeline!r}")
        if not isinstance(synchronous_commit_off, bool):
            raise ConfigurationError(
                f"synchronous_commit_off must be True or False, got {synchronous_commit_off!r}"
            )
        if pipeline and not psycopg.Pipeline.is_supported():
            raise ConfigurationError(
                "pipeline=True needs libpq 14 or later, which this psycopg does not have"
            )
        super().__init__(data_source, first_connection=first_connection, compact=compact, chain=chain)
        self._pooled = type(data_source).__module__.split(".", 1)[0] == "psycopg_pool"
        self._pipeline = pipeline
        self.synchronous_commit_off = synchronous_commit_off
        if synchronous_commit_off:
            self._job_transaction_setting = sql.queries(self.dialect)["synchronous_commit_off"]
        self._chain_statements = chain_statements(self._job_transaction_setting)

    def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        """ChainedClaim: COMMIT AND CHAIN (and the job transaction's setting) as one simple query, then the
        claim; on a pipelined connection each is queued and the claim's result brings all of them back.

        On a pipelined connection a finished job's archive goes in that same exchange when the server
        checks its row count (archive_and_delete_job_checked): a job takes one round trip. Any other
        queued write is settled first, as before every COMMIT.
        """
        self._chain_commit(conn)
        return self.get_next_job(conn, job_table, queue, now)

    def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        # On a chained pipeline the count is the server's to check (_chain_commit).
        name = _ARCHIVE if self._checking_lease(conn) is None else _CHECKED_ARCHIVE
        self._archive(conn, name, job_table, archived_job_table, job_id, status, finished_at)

    def archive_and_delete_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        lease = self._checking_lease(conn)
        if lease is None:
            super().archive_and_delete_jobs(conn, job_table, archived_job_table, job_ids, status, finished_at)
            return
        # Queued, not synced for its count as other batch writes are: the server checks it (_chain_commit).
        statement, params = self._checked_batch_archive(
            job_table, archived_job_table, job_ids, status, finished_at
        )
        self._queue_write(lease, statement, params, _CHECKED_BATCH_ARCHIVE, tuple(job_ids))

    def _checked_batch_archive(
        self,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> tuple[str, list[Any]]:
        """archive_and_delete_jobs_checked and its parameters: archive_and_delete_jobs', then the number of
        jobs twice (the count the server expects, and the words of its error)."""
        jobs = str(len(job_ids))
        params = [*self._archive_and_delete_params(job_ids, status, finished_at), jobs, jobs]
        statement = sql.render_ids(
            self.dialect, _CHECKED_BATCH_ARCHIVE, job_table, archived_job_table, len(job_ids)
        )
        return statement, params

    def _checking_lease(self, conn: Any) -> _Lease | None:
        """The calling thread's pipelined transaction on `conn` where the backend chains, else None: there a
        finished job's archive goes with the next claim and the server checks its count."""
        lease = self._local.lease
        if self._chain and lease is not None and lease.pending is not None and lease.conn is conn:
            return lease
        return None

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        """ChainedBatchClaim: commit_and_get_next_job's COMMIT AND CHAIN, then batch mode's claim."""
        self._chain_commit(conn)
        return self.get_next_jobs(conn, job_table, queue, now, limit)

    def _chain_commit(self, conn: Any) -> None:
        lease = self._checking_lease(conn)
        pipelined = self._pipelines(conn, pooled=self._pooled)
        pending = None if lease is None else lease.pending
        for statement in self._chain_commit_statements(conn, pending, pipelined):
            self._execute(conn, statement, None, _ignore)

    def _chain_commit_statements(
        self, conn: Any, pending: list[tuple[Any, str, Any]] | None, pipelined: bool
    ) -> tuple[str, ...]:
        """The chain's COMMIT AND CHAIN (COMMIT and BEGIN on a server before PostgreSQL 12), and the job
        transaction's setting: one simple query, or one statement each on a pipelined connection. The
        writes still queued (`pending`) are left queued to go with them when every one's count is the
        server's to check (the asyncio backend's chain too)."""
        if pending is not None and all(what in _SERVER_CHECKED for _cursor, what, _ids in pending):
            # A count the server refuses fails the statement, the COMMIT after it does nothing and the error
            # comes back with the claim's result, so the transaction rolls back as after a count the client
            # refused. Left queued, they go with it.
            pending.clear()
        if has_and_chain(conn):
            return self._chain_statements[pipelined]
        # No AND CHAIN before PostgreSQL 12: COMMIT, then a BEGIN stating what the connection was given.
        commit = sql.queries("postgresql")["chain_commit_plain"]
        return chain_statements(self._job_transaction_setting, commit, stated_begin(conn))[pipelined]

    def _checkout_pooled(self) -> Any:
        return self._data_source.getconn()

    def _checkin_pooled(self, conn: Any) -> None:
        self._data_source.putconn(conn)

    def _cancel_statement(self, conn: Any) -> None:
        # psycopg documents cancel from another thread as safe; cancel_safe (3.2+) also waits for it.
        cancel = getattr(conn, "cancel_safe", None)
        with contextlib.suppress(Exception):  # a statement that ends by itself is as good
            if cancel is not None:
                cancel(timeout=5.0)
            else:
                conn.cancel()

    def _other_session(self) -> Any:
        # Made as the pool makes its connections but outside it: a pool drained by running jobs (the
        # very case a job timeout is for) would make the worker wait for a slot.
        if self._pooled:
            return _connect_like(self._data_source)
        return super()._other_session()

    def _end_session(self, conn: Any) -> bool:
        try:
            session = conn.info.backend_pid
            other = self._other_session()
        except Exception:
            return False
        if other is None:
            return False
        try:
            with other.cursor() as cursor:
                cursor.execute(sql.sessions(self.dialect)["end_session"], {"session": session})
                row = cursor.fetchone()
            return bool(row and row[0])
        except Exception:
            return False
        finally:
            _close_quietly(other)

    def _translate(self, exc: BaseException) -> DatabaseError | None:
        if PoolTimeout is not None and isinstance(exc, PoolTimeout):
            return TransientDatabaseError(f"no connection from the pool in time: {exc}")
        if not isinstance(exc, psycopg.Error):
            return None
        message = f"{type(exc).__name__}: {str(exc).strip()}"
        if isinstance(exc, psycopg.errors.UndefinedTable):
            return SchemaMissingError(f"{message} (install the schema: proletarian_ref.schema.install)")
        sqlstate = exc.sqlstate or ""
        if sqlstate in _LOST_PREPARED_CODES and _PSYCOPG_PREPARED_PREFIX in message:
            return DatabaseError(f"{message}: {PGBOUNCER_ADVICE}")
        if sqlstate == _INVALID_TEXT_CODE and (counted := _CHECKED_COUNT.search(message)):
            # As the client's own checks word it (_dbapi._wrong_count, _wrong_batch_count), ids aside.
            what, count, jobs = counted.groups()
            tail = f" of {jobs} jobs; expected {jobs}" if jobs else "; expected exactly 1"
            return DatabaseError(f"{what} changed {count} rows{tail} ({message})")
        if sqlstate == _READ_ONLY_CODE:
            return TransientDatabaseError(f"{message}: {READ_ONLY_ADVICE}")
        if (
            isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
            or sqlstate[:2] in _TRANSIENT_CLASSES
            or sqlstate in _TRANSIENT_CODES
        ):
            return TransientDatabaseError(message)
        return DatabaseError(message)

    def _abandons_connection(self, error: BaseException) -> bool:
        cause = error.__cause__ if isinstance(error, DatabaseError) else error
        return isinstance(cause, psycopg.Error) and cause.sqlstate == _READ_ONLY_CODE

    def _cursor(self, conn: Any) -> Any:
        # The caller's connection may have a dict row factory; the backend reads rows by position.
        return conn.cursor(row_factory=tuple_row)

    def _statement_cursor(self, conn: Any) -> Any:
        if _LEAN_CURSOR and conn.cursor_factory is psycopg.Cursor and conn.pgconn.status == _CONNECTION_OK:
            return _OneStatementCursor(conn)
        # A cursor class of the caller's own (ClientCursor, say) is theirs to choose; a connection that
        # is closed or not ready gets psycopg's own error from conn.cursor().
        return self._cursor(conn)

    def _enqueue_row(self, job: JobRecord, enqueued_at: Any, process_at: Any) -> tuple[Any, ...]:
        # A UUID id and the attempts as text, like the times (sent untyped, the server reads them as the
        # column's type, the same values): psycopg looks up the adapter of each type anew for every
        # cursor, and a caller's connection gets a new cursor each enqueue, so one type is cheaper.
        job_id: Any = job.job_id
        attempts: Any = job.attempts
        if type(job_id) is UUID:
            job_id = str(job_id)
        if type(attempts) is int:
            attempts = str(attempts)
        return (job_id, job.queue, job.job_type, job.payload, attempts, enqueued_at, process_at)

    def _fetch_claimed(self, cursor: Any) -> Any:
        self._sync_claim(cursor)
        try:
            return cursor.fetchone()
        except psycopg.DataError:
            if cursor.pgresult is None:
                # No row came: the error is a statement's, such as a chained pipeline's archive whose count
                # the server refused (commit_and_get_next_job), not a loader's.
                raise
            # A stored time Python cannot hold: the claim's row, read again from the same result with the
            # lenient loaders. Only then: psycopg's own loaders, in C, read every other claim.
            return _lenient_row(cursor)

    def _fetch_claimed_rows(self, cursor: Any) -> list[Any]:
        self._sync_claim(cursor)
        return list(cursor.fetchall())

    def _sync_claim(self, cursor: Any) -> None:
        """On a pipelined transaction, a claim's rows come back with a Sync rather than psycopg's flush
        request: the same round trip, and the server's transaction status with it.

        psycopg knows whether a transaction is open only from the last Sync's answer. The BEGIN that _begin
        queues goes in the claim's exchange; read with a flush request, the transaction would look idle,
        and psycopg's commit would send no COMMIT.
        """
        lease = self._local.lease
        if lease is not None and lease.pending is not None and lease.conn is cursor.connection:
            self._sync(lease.conn)

    def _commit(self, conn: Any, lease: _Lease) -> None:
        idle = conn.info.transaction_status == TransactionStatus.IDLE
        if idle and lease.pending is not None and conn.autocommit:
            # The BEGIN _begin queued has had no Sync's answer yet (a transaction whose first read was
            # not a claim's, _sync_claim): psycopg's status is stale, and its commit would send no COMMIT.
            self._sync(conn)
        super()._commit(conn, lease)

    def _db_time(self, value: datetime, *, what: str = "time") -> Any:
        # Text with an explicit offset and no declared type (psycopg sends str as "unknown"): PostgreSQL
        # takes the exact instant into TIMESTAMPTZ and the UTC wall clock into a legacy TIMESTAMP column,
        # whatever the session TimeZone, just as pgjdbc's setTimestamp with a UTC Calendar does.
        return utc_text(value)

    def _from_db_time(self, value: Any) -> datetime:
        stored: datetime = value
        zone = stored.tzinfo
        if zone is None:
            return EPOCH_UTC + (stored - EPOCH_NAIVE)  # stored.replace(tzinfo=UTC), for a fifth
        if zone is UTC:
            return stored
        # The session's zone, a ZoneInfo: for UTC itself the same fields, a fifth cheaper than astimezone,
        # which asks the zone for its offset (twice a job).
        epoch = _UTC_ZONE_EPOCHS.get(zone)
        if epoch is None and getattr(zone, "key", None) in _UTC_ZONE_NAMES:
            epoch = _UTC_ZONE_EPOCHS[zone] = datetime(1970, 1, 1, tzinfo=zone)
        if epoch is not None:
            return EPOCH_UTC + (stored - epoch)
        return stored.astimezone(UTC)

    def _begin(self, conn: Any) -> Any:
        if self._pipeline and not self._pooled and conn is self._local.conn:
            self._enter_pipeline(conn)
            if conn.info.transaction_status == TransactionStatus.IDLE:
                # BEGIN queued, so it goes with the claim: psycopg syncs after each BEGIN it sends itself
                # in pipeline mode, a round trip of its own. It states what the connection was given, as
                # psycopg's would.
                cursors = self._local.cursors
                assert cursors is not None  # kept for the thread's own connection
                cursor = cursors.get(_BEGIN)
                if cursor is None:
                    cursor = cursors[_BEGIN] = self._cursor(conn)
                cursor.execute(stated_begin(conn), prepare=False)
            return False
        was_autocommit = conn.autocommit
        if was_autocommit:
            conn.autocommit = False
        return was_autocommit

    def _end(self, conn: Any, state: Any) -> None:
        if state and not conn.closed:
            conn.autocommit = True

    def _enter_pipeline(self, conn: Any) -> None:
        local = self._local
        if getattr(local, "pipelined", None) is conn:
            return
        # Entered once per connection and left open across transactions: leaving pipeline mode costs a
        # round trip of its own. Autocommit is set once, for good (changing it in pipeline mode costs one
        # too): the connection is the backend's own, and used only in transaction(), which sends its own
        # BEGIN (_begin).
        self._leave_pipeline()
        if not conn.autocommit:
            conn.autocommit = True
        manager = conn.pipeline()
        local.pipeline = manager.__enter__()
        local.pipeline_manager, local.pipelined = manager, conn

    def _pipelines(self, conn: Any, *, pooled: bool) -> bool:
        return self._pipeline and not pooled and getattr(self._local, "pipelined", None) is conn

    def _leave_pipeline(self) -> None:
        """Leave the pipeline the calling thread's connection is in, if any; quietly, it may be broken."""
        local = self._local
        manager = getattr(local, "pipeline_manager", None)
        local.pipelined = local.pipeline = local.pipeline_manager = None
        if manager is not None:
            with contextlib.suppress(Exception):
                manager.__exit__(None, None, None)

    def _discard_thread_connection(self, conn: Any) -> None:
        if getattr(self._local, "pipelined", None) is conn:
            self._leave_pipeline()
        super()._discard_thread_connection(conn)

    def close(self) -> None:
        self._leave_pipeline()  # the calling thread's; worker threads leave theirs as they end
        super().close()

    def _sync(self, conn: Any) -> None:
        self._local.pipeline.sync()

    def _is_broken(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    def _insert_rows(
        self, conn: Any, prefix: str, job_table: TableName, rows: list[tuple[Any, ...]], *, generated: bool
    ) -> list[Any]:
        if generated:  # COPY returns nothing: the generated ids need INSERT ... RETURNING
            return super()._insert_rows(conn, prefix, job_table, rows, generated=generated)
        # One COPY for the whole batch, whatever its size: 2.5 times the jobs a second of a 1,000-row
        # INSERT ... VALUES on the benchmark machine, and no bind-parameter limit to cut it by.
        self._execute(conn, self._render("enqueue_copy", job_table), rows, _ignore, copy=True)
        return []

    def enqueue_stream(self, conn: Any, job_table: TableName, jobs: Iterator[JobRecord]) -> list[Any]:
        """StreamEnqueue: one COPY that takes the rows chunk by chunk as the jobs are made.

        The first chunk is made before any SQL runs, so a batch of one chunk is checked whole first, as
        by enqueue_many. A longer batch's COPY starts with its first chunk and the server takes each
        chunk in while the client makes the next: made first and then sent, the client waited for the
        server and the server for the client. A bad job found after the COPY started raises out of it,
        which fails it; _undone_on_error leaves the caller's connection as it was. Database-generated
        ids (COPY returns none) and a subclass's own way of writing batches get enqueue_many.
        """
        first = next(jobs, None)
        if first is None:
            return []
        cls = type(self)
        if (
            first.job_id is None
            or cls.enqueue_many is not SqlBackend.enqueue_many
            or cls._insert_rows is not PostgresBackend._insert_rows
        ):
            return self.enqueue_many(conn, job_table, [first, *jobs])
        ids: list[Any] = []
        rows = self._batch_rows(itertools.chain((first,), jobs), generated=False, ids=ids)
        head = list(itertools.islice(rows, _COPY_ROWS_PER_WRITE))
        after = next(rows, _NO_ROW)
        statement = self._render("enqueue_copy", job_table)
        if after is _NO_ROW:
            # Every job is made: nothing of the client's can fail once the COPY has started.
            with self._caller_session(conn) as prefix:
                self._execute(conn, prefix + statement, head, _ignore, copy=True)
            return ids
        with self._undone_on_error(conn), self._caller_session(conn) as prefix:
            streamed = itertools.chain(head, (after,), rows)
            self._execute(conn, prefix + statement, streamed, _ignore, copy=True)
        return ids

    @contextlib.contextmanager
    def _undone_on_error(self, conn: Any) -> Iterator[None]:
        """Around a COPY that starts before its last row is made: if it fails, the caller's connection is
        left as it was before it.

        A failed statement leaves a transaction refusing all but a rollback. In the caller's open
        transaction the COPY runs in a savepoint, rolled back to and released on error. Out of
        autocommit with no transaction open, psycopg opens one for the COPY: the rollback ends it, and
        the connection has no transaction open, as before. In autocommit the COPY is a transaction of
        its own, and a failed one writes nothing.
        """
        status = conn.info.transaction_status
        if status == TransactionStatus.INTRANS:
            with self._enqueue_many_savepoint(conn):
                yield
        elif status == TransactionStatus.IDLE and not conn.autocommit:
            try:
                yield
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.rollback()
                raise
        else:
            yield

    def _copy(self, cursor: Any, statement: str, rows: Iterable[tuple[Any, ...]]) -> None:
        rows = iter(rows)
        with cursor.copy(statement) as copy:
            # The COPY text psycopg's write_row sends for these rows, written here: write_row looks up and
            # calls a dumper per value, which cost as much as the rest of a job's work in enqueue_many.
            # On a UTF-8 connection only, where escaping the text is escaping its bytes as psycopg does.
            fast = cursor.connection.info.encoding == "utf-8"
            # A chunk at a time as the rows are read (enqueue_stream's are made as they are read).
            while chunk := list(itertools.islice(rows, _COPY_ROWS_PER_WRITE)):
                text = _copy_text(chunk) if fast else None
                if text is not None:
                    copy.write(text)
                    continue
                # psycopg's own rows for this chunk and every later one: write_row keeps rows in a buffer
                # of its own, which a later write() would overtake.
                fast = False
                for row in chunk:
                    copy.write_row(row)

    def _generated_id(self, cursor: Any) -> Any:
        row = cursor.fetchone()
        return None if row is None else row[0]

    # -- Notifications ---------------------------------------------------------------------------------

    def notify_enqueued(self, conn: Any, job_table: TableName, queues: Sequence[str]) -> None:
        params = {
            "channel": notification_channel(job_table),
            "queues": [notification_payload(queue) for queue in queues],
        }
        self._execute(conn, self._render("notify_enqueued", job_table), params, _ignore)

    def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> PostgresListener:
        source = data_source if data_source is not None else self._data_source
        pool = type(source).__module__.split(".", 1)[0] == "psycopg_pool"
        if not pool and not callable(source):
            raise ConfigurationError(
                "this PostgresBackend has no data source to open a listening connection with; pass "
                "listen_data_source= (a connection factory or a psycopg_pool pool)"
            )
        channel = notification_channel(job_table)
        with self._errors():
            conn = _connect_like(source) if pool else source()
        try:
            with self._errors():
                conn.autocommit = True
                conn.execute(sql.render_channel(self.dialect, "listen", channel))
        except BaseException:
            _close_quietly(conn)
            raise
        listener = PostgresListener(self, conn, channel, notification_payload(queue))
        try:
            listener.confirmed = listener.receives(self._probe(job_table), PROBE_TIMEOUT_S)
        except BaseException:
            listener.close()
            raise
        return listener

    def _probe(self, job_table: TableName) -> str:
        """Send a test notification as enqueuers do, on the backend's own connection; returns its payload.

        The connection the calling thread opens for it is closed again: the listener thread keeps none.
        """
        token = _PROBE_PREFIX + os.urandom(8).hex()
        try:
            with self.transaction() as conn:
                self.notify_enqueued(conn, job_table, [token])
        finally:
            self.close_thread_connection()
        return token


def chain_statements(setting: str | None, *head: str) -> tuple[tuple[str], tuple[str, ...]]:
    """What commit_and_get_next_job sends before the claim: `head` (by default COMMIT AND CHAIN) and the
    job transaction's setting, as one simple query (a connection outside pipeline mode), and one by one
    (in pipeline mode, where a statement is one command)."""
    statements = [*(head or (sql.queries("postgresql")["chain_commit"],))]
    if setting is not None:
        statements.append(setting)  # the new transaction is a job's transaction too
    return ("; ".join(statements),), tuple(statements)


def stated_begin(conn: Any) -> str:
    """The BEGIN that states the transaction characteristics `conn` was given (isolation level, access
    mode, deferrable), as psycopg's own BEGIN does; a plain BEGIN where it was given none."""
    parts = [sql.queries("postgresql")["chain_begin"]]
    # getattr: an AsyncpgSession (asyncpg's chain) is given none of them.
    isolation_level, read_only, deferrable = (
        getattr(conn, name, None) for name in ("isolation_level", "read_only", "deferrable")
    )
    if isolation_level is not None:
        parts.append("ISOLATION LEVEL " + isolation_level.name.replace("_", " "))
    if read_only is not None:
        parts.append("READ ONLY" if read_only else "READ WRITE")
    if deferrable is not None:
        parts.append("DEFERRABLE" if deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


def has_and_chain(conn: Any) -> bool:
    """Whether `conn`'s server takes COMMIT AND CHAIN (PostgreSQL 12 and later): what the driver read at
    connect (psycopg's conn.info, or an AsyncpgSession's), no round trip."""
    return bool(conn.info.server_version >= _AND_CHAIN_SINCE)


# The first server_version (libpq's number) with COMMIT AND CHAIN.
_AND_CHAIN_SINCE: Final = 120000


def _connect_like(pool: Any) -> Any:
    """A connection made as `pool` makes its own, but outside it: a listener never takes a pool slot.

    Held for the worker's life, a pool's connection would leave its worker threads one short (a pool
    sized to worker_threads would have a thread waiting for a connection on every poll).
    """
    conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
    kwargs = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
    return pool.connection_class.connect(conninfo, **(kwargs or {}))


class PostgresListener:
    """One autocommit connection LISTENing on a job table's channel, for one queue; used by one thread.

    It waits on the connection's socket itself, beside a pipe that interrupt() writes to, so stop() ends
    a wait at once and an idle listener wakes for nothing else. The connection is the listener's own:
    close() closes it.
    """

    def __init__(self, backend: PostgresBackend, conn: Any, channel: str, payload: str) -> None:
        self._backend = backend
        self.conn = conn
        self._channel = channel.encode("ascii")
        self._payload = payload.encode("utf-8")
        self._interrupt_r, self._interrupt_w = os.pipe()
        os.set_blocking(self._interrupt_w, False)
        # A selector, not select(): select() refuses descriptors past 1023, which a busy process has.
        self._selector = selectors.DefaultSelector()
        self._selector.register(conn.pgconn.socket, selectors.EVENT_READ)
        self._selector.register(self._interrupt_r, selectors.EVENT_READ)
        # interrupt() and close() run on different threads: a closed descriptor's number may be reused.
        self._pipe_lock = threading.Lock()
        self._closed = False
        self.confirmed = True
        # An announcement for this queue read while waiting for something else (the probe).
        self._pending = False

    def interrupt(self) -> None:
        with self._pipe_lock, contextlib.suppress(BlockingIOError):  # full: interrupted already
            if not self._closed:
                os.write(self._interrupt_w, b"x")

    def wait(self, timeout: float) -> bool:
        return self._wait_for(self._payload, timeout)

    def receives(self, payload: str, timeout: float) -> bool:
        """Whether a notification with `payload` arrives within `timeout` seconds (the probe)."""
        return self._wait_for(payload.encode("utf-8"), timeout)

    def _wait_for(self, payload: bytes, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        pgconn = self.conn.pgconn
        with self._backend._errors():
            while True:
                if self._read(pgconn, payload):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                ready = {key.fd for key, _ in self._selector.select(remaining)}
                if self._interrupt_r in ready:
                    return False
                if ready:
                    # Raises OperationalError when the server has closed the connection.
                    pgconn.consume_input()

    def _read(self, pgconn: Any, payload: bytes) -> bool:
        """Read every notification received; whether one carried `payload` (or one did earlier)."""
        if payload == self._payload and self._pending:
            self._pending = False
            return True
        found = False
        while (note := pgconn.notifies()) is not None:
            if note.relname != self._channel:
                continue
            if note.extra == payload:
                found = True
            elif note.extra == self._payload:
                self._pending = True  # read while waiting for the probe: the next wait() returns it
        return found

    def close(self) -> None:
        _close_quietly(self.conn)
        with self._pipe_lock:
            if not self._closed:
                self._closed = True
                self._selector.close()
                os.close(self._interrupt_r)
                os.close(self._interrupt_w)


def _lenient_row(cursor: Any) -> Any:
    """Row 0 of `cursor`'s result, its timestamps read by the lenient loaders (a cursor of either kind)."""
    return lenient_row(cursor.pgresult, cursor.connection)


@dataclass(frozen=True, slots=True)
class _LenientContext:
    """An AdaptContext of its own, so callers' connections keep their own adapters."""

    adapters: AdaptersMap
    connection: Any


def lenient_row(pgresult: Any, connection: Any) -> Any:
    """Row 0 of `pgresult`, its timestamps read by the lenient loaders, the rest as `connection` reads it.

    Shared by the threaded and the asyncio backend: it reads a result already received, no I/O.
    """
    adapters = AdaptersMap(connection.adapters)
    adapters.register_loader("timestamptz", _LenientTimestamptzLoader)
    adapters.register_loader("timestamp", _LenientTimestampLoader)
    transformer = Transformer(_LenientContext(adapters, connection))
    transformer.set_pgresult(pgresult)
    return transformer.load_row(0, tuple)


# COPY's text format: these characters in a value are written as backslash escapes (psycopg's _dump_re).
_COPY_ESCAPED: Final = re.compile("[\b\t\n\v\f\r\\\\]")
_COPY_ESCAPES: Final = {
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
    "\\": "\\\\",
}
# Rows sent per write: about psycopg's own 32 KiB buffer for small payloads, so the server parses
# the first rows while the rest are written.
_COPY_ROWS_PER_WRITE: Final = 256
_BIT_128: Final = 1 << 128
_NO_ROW: Final[Any] = object()


def _copy_escape(match: re.Match[str]) -> str:
    return _COPY_ESCAPES[match.group()]


def _copy_value(value: str) -> str:
    if _COPY_ESCAPED.search(value) is None:
        return value
    return _COPY_ESCAPED.sub(_copy_escape, value)


def _copy_text(rows: Sequence[tuple[Any, ...]]) -> str | None:
    """Enqueue rows as COPY text, exactly psycopg's; None if a value is not of a plain type.

    Plain: the id a UUID (psycopg writes its 32 hex digits), attempts an int, every other value a str.
    A batch repeats its queue, job type, attempts and times: their text is made again only when one
    changes from the row before.
    """
    lines: list[str] = []
    payloads: list[str] = []
    # Nothing a row holds is this object, so the first row makes both texts.
    queue = job_type = attempts = enqueued_at = process_at = middle = tail = _NO_ROW
    for row in rows:
        if len(row) != 7:
            return None
        job_id, row_queue, row_job_type, payload, row_attempts, row_enqueued_at, row_process_at = row
        if type(job_id) is not UUID or type(payload) is not str:
            return None
        if row_queue is not queue or row_job_type is not job_type:
            queue, job_type = row_queue, row_job_type
            if type(queue) is not str or type(job_type) is not str:
                return None
            middle = f"\t{_copy_value(queue)}\t{_copy_value(job_type)}\t"
        if (
            row_attempts is not attempts
            or row_enqueued_at is not enqueued_at
            or row_process_at is not process_at
        ):
            attempts, enqueued_at, process_at = row_attempts, row_enqueued_at, row_process_at
            if type(attempts) is not int or type(enqueued_at) is not str or type(process_at) is not str:
                return None
            tail = f"\t{attempts}\t{_copy_value(enqueued_at)}\t{_copy_value(process_at)}\n"
        payloads.append(payload)
        # The id's 32 hex digits, leading zeros kept, from hex() of it with a 129th bit set.
        lines.append(f"{hex(job_id.int | _BIT_128)[3:]}{middle}{payload}{tail}")
    # Payloads rarely need an escape, so they are searched together, not one by one (each search of a
    # str for one character is a memchr).
    together = "".join(payloads)
    if not any(char in together for char in _COPY_ESCAPES):
        return "".join(lines)
    return "".join(
        [
            f"{row[0].int:032x}\t{_copy_value(row[1])}\t{_copy_value(row[2])}\t{_copy_value(row[3])}"
            f"\t{row[4]}\t{_copy_value(row[5])}\t{_copy_value(row[6])}\n"
            for row in rows
        ]
    )
