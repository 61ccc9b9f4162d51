"""What the SQL backends share: connections per worker thread, transactions, named statements, errors."""

from __future__ import annotations

import contextlib
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, Final, NoReturn, TypeVar

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.errors import ConfigurationError, DatabaseError
from proletarian_ref.tables import TableName

_T = TypeVar("_T")
_NO_JOB: Any = object()
_new_tuple: Final = tuple.__new__
# A write's row count, read without a Python call of its own (five statements a job pass here).
_rowcount: Final = operator.attrgetter("rowcount")
# The enqueue INSERT's placeholders, in the order SqlBackend.enqueue binds them.
_ENQUEUE_COLUMNS: Final = ("job_id", "queue", "job_type", "payload", "attempts", "enqueued_at", "process_at")


class SessionPrefix(AbstractContextManager[str]):
    """A _caller_session that changes nothing in the session and only puts `prefix` before the statement.

    Stateless, so one serves every call and thread; enqueue uses its prefix without entering a block.
    """

    __slots__ = ("prefix",)

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __enter__(self) -> str:
        return self.prefix

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_PREFIX: Final = SessionPrefix("")


class ConnectionReleasedError(DatabaseError):
    """The transaction's connection was released by QueueWorker.stop(); nothing more is written on it."""


@dataclass(slots=True)
class _Lease:
    """A connection in use by one thread's transaction, as release_connection needs to see it."""

    conn: Any
    # The cursors the thread keeps on its own connection: one per way a statement's result is read
    # (_execute's `read`), and one per queued write (-1, -2, ...); None for a pool's connection.
    cursors: dict[Any, Any] | None
    # True while the owning thread is talking to the server; a connection is never closed under it.
    busy: bool = True
    released: bool = False
    # Writes sent but not yet counted, on a connection whose backend pipelines them (_pipelines): each
    # (cursor, what, job id) is checked for exactly one row before the transaction may commit.
    pending: list[tuple[Any, str, Any]] | None = None
    # A write not yet sent, kept back to go in one query with the COMMIT after it (MySQLBackend's chained
    # plan, _send_deferred): sent before any other statement, and before the transaction's own COMMIT.
    deferred: Any = None


class _ThreadState(threading.local):
    """What a backend keeps per thread; an attribute the thread has not set reads as the class's None."""

    # The connection the thread keeps and its cursors (_Lease.cursors), while it has one.
    conn: Any = None
    cursors: dict[Any, Any] | None = None
    # The thread's open transaction, as in SqlBackend._leases: found here without asking for the ident.
    lease: _Lease | None = None
    # What _prepare_session last set up on the thread's connection, where a backend keeps a note of it.
    prepared: Any = None


class _Rendered(dict[tuple[str, TableName, TableName | None], str]):
    """A backend's statements by (name, job table, archive table), each made once by its _render."""

    __slots__ = ("_render",)

    def __init__(self, render: Callable[[str, TableName, TableName | None], str]) -> None:
        super().__init__()
        self._render = render

    def __missing__(self, key: tuple[str, TableName, TableName | None]) -> str:
        statement = self[key] = self._render(*key)
        return statement


class SqlBackend:
    """A Backend over a DB-API driver whose statements live in sql/<dialect>/queries.sql.

    A data source that is a callable is called for one connection per worker thread; the thread keeps
    it across polls (a poll per interval must not cost a connect) and replaces it after it breaks.
    """

    dialect: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    # The most rows and estimated bytes of one multi-row INSERT of enqueue_many. 1,000 rows of 7 values
    # stay far below PostgreSQL's 65,535 bind parameters; 1 MiB is below MySQL's smallest default
    # max_allowed_packet (4 MiB, 5.7; 16 MiB MariaDB; 64 MiB 8.0), as PyMySQL's own executemany keeps.
    _BATCH_ROWS: ClassVar[int] = 1000
    _BATCH_BYTES: ClassVar[int] = 1 << 20

    # Whether the dialect's backend implements ChainedClaim, so that it takes `chain=True`.
    _chains: ClassVar[bool] = False

    def __init__(
        self,
        data_source: Any = None,
        *,
        first_connection: Any = None,
        compact: bool = False,
        chain: bool = False,
    ) -> None:
        if not isinstance(compact, bool):
            raise ConfigurationError(f"compact must be True or False, got {compact!r}")
        if not isinstance(chain, bool):
            raise ConfigurationError(f"chain must be True or False, got {chain!r}")
        if chain and not self._chains:
            raise ConfigurationError(f"{type(self).__name__} has no chained claims: chain=True is refused")
        # ArchiveAndDelete: a finished job's archive and delete in one round trip (archive_and_delete_job).
        self.compact_plan = compact
        self._chain = chain
        self._data_source = data_source
        self._local = _ThreadState()
        self._lock = threading.Lock()
        self._owned: list[Any] = []
        self._spare: list[Any] = [first_connection] if first_connection is not None else []
        if first_connection is not None:
            self._owned.append(first_connection)
        # Open transactions by thread ident, so stop() can release a stuck thread's job.
        self._leases: dict[int, _Lease] = {}
        # The hot statements, subscripted rather than rendered on every call: one dict lookup, no call.
        self._statements = _Rendered(self._render)
        # The statement that opens every transaction of transaction() (the worker's job transaction), never
        # a caller's: PostgresBackend(synchronous_commit_off=True) sets it; None sends nothing.
        self._job_transaction_setting: str | None = None

    @property
    def chained_claims(self) -> bool:
        """ChainedClaim: True when the worker commits a finished job and claims the next in one go."""
        return self._chain

    # -- driver specifics, overridden per dialect ------------------------------------------------------

    def _translate(self, exc: BaseException) -> DatabaseError | None:
        """The library's exception for a driver exception, or None if `exc` is not the driver's."""
        raise NotImplementedError

    def _cursor(self, conn: Any) -> Any:
        raise NotImplementedError

    def _statement_cursor(self, conn: Any) -> Any:
        """A cursor for one statement on a connection the backend does not keep: closed right after it."""
        return self._cursor(conn)

    def _db_time(self, value: datetime, *, what: str = "time") -> Any:
        """A UTC instant as this driver's parameter, the exact instant as Proletarian binds it.

        Raises ConfigurationError, naming `what`, for a time the column cannot hold, before any SQL runs.
        """
        raise NotImplementedError

    def _from_db_time(self, value: Any) -> datetime:
        raise NotImplementedError

    def _prepare_session(self, conn: Any, *, worker: bool = False) -> None:
        """Per-connection settings, applied once; `worker` marks a connection the backend itself took."""

    def _caller_session(self, conn: Any) -> AbstractContextManager[str]:
        """Around enqueue's INSERT on a caller's connection: yields a prefix for the statement.

        Whatever it changes in the session it puts back before the block ends, raised or not.
        """
        return _NO_PREFIX

    def _begin(self, conn: Any) -> Any:
        """Leave autocommit for the transaction; returns what _end needs to restore."""
        raise NotImplementedError

    def _end(self, conn: Any, state: Any) -> None:
        raise NotImplementedError

    def _is_broken(self, conn: Any) -> bool:
        raise NotImplementedError

    def _abandons_connection(self, error: BaseException) -> bool:
        """Whether a connection that raised `error` should be replaced though it still looks open."""
        return False

    def _generated_id(self, cursor: Any) -> Any:
        raise NotImplementedError

    def _fetch_claimed(self, cursor: Any) -> Any:
        """The row the claim returned, or None; a driver may read what it cannot load some other way."""
        return cursor.fetchone()

    def _fetch_claimed_rows(self, cursor: Any) -> list[Any]:
        """The rows a batch claim returned."""
        return list(cursor.fetchall())

    def _pipelines(self, conn: Any, *, pooled: bool) -> bool:
        """Whether this transaction on `conn` queues its single-row writes until _sync (see _Lease.pending).

        Called after _begin; False by default: every statement is its own round trip.
        """
        return False

    def _sync(self, conn: Any) -> None:
        """Send what the connection has queued and read every result (only where _pipelines said so)."""
        raise NotImplementedError

    def _send_deferred(self, conn: Any, lease: _Lease) -> None:
        """Send the write kept back in `lease.deferred` and check it, on a lease already marked busy (only
        where a backend keeps writes back)."""
        raise NotImplementedError

    def _cancel_statement(self, conn: Any) -> None:
        """Ask the server, from another thread, to end the statement `conn` is running; may do nothing."""

    def _other_session(self) -> Any:
        """A new session of the same server and role, the caller's to close; None if none can be opened.

        Never a connection a transaction holds, nor a pool slot the worker threads wait for.
        """
        return self._data_source() if callable(self._data_source) and not self._pooled else None

    def _time_limits_block(self, conn: Any) -> str:
        """The sessions.sql block that reads this server's limits on a transaction's life."""
        return "time_limits"

    def _end_session(self, conn: Any) -> bool:
        """End `conn`'s session from another one, so the server rolls its transaction back; False if the
        backend cannot (then release_connection closes the connection on the client side)."""
        return False

    def _checkout_pooled(self) -> Any:
        raise ConfigurationError(f"{type(self).__name__} cannot take connections from {self._data_source!r}")

    def _checkin_pooled(self, conn: Any) -> None:
        raise NotImplementedError

    # Whether transactions take their connections from a pool (_checkout_pooled) rather than keep one per
    # thread; an attribute, not a property: every transaction reads it.
    _pooled: bool = False

    # -- errors ----------------------------------------------------------------------------------------

    def _raise_library_error(self, exc: Exception) -> NoReturn:
        """Raise the library's exception for a driver's (from it), or `exc` itself if it is not one.

        The hot paths call this from an inline except rather than use _errors(): every statement of every
        job passes there, and an inline try costs nothing until something fails.
        """
        if isinstance(exc, DatabaseError):
            raise exc
        translated = self._translate(exc)
        if translated is None:
            raise exc
        raise translated from exc

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            self._raise_library_error(exc)

    # -- connections and transactions ------------------------------------------------------------------

    def _new_thread_connection(self) -> Any:
        """A connection for a thread that keeps none yet: a spare one, else one from the factory."""
        with self._lock:
            conn = self._spare.pop() if self._spare else None
        if conn is None:
            if not callable(self._data_source):
                raise ConfigurationError(f"{type(self).__name__} has no data source to open connections with")
            factory: Callable[[], Any] = self._data_source
            with self._errors():
                conn = factory()
            with self._lock:
                self._owned.append(conn)
        self._local.conn = conn
        self._local.cursors = {}
        return conn

    def _discard_thread_connection(self, conn: Any) -> None:
        self._local.conn = None
        self._local.cursors = {}
        with self._lock:
            if conn in self._owned:
                self._owned.remove(conn)
        with contextlib.suppress(Exception):  # It is already broken; closing only tidies up.
            conn.close()

    def _mark(self, lease: _Lease, *, busy: bool) -> bool:
        """Set whether the thread is talking to the server; False if the connection was released."""
        with self._lock:
            lease.busy = busy
            return not lease.released

    def _start_round_trip(self, lease: _Lease) -> None:
        """Mark the lease busy before talking to the server, refusing to on a released connection.

        Checked and set under the lock release_connection holds while it marks the lease released and reads
        `busy`: the thread either sees the release, or is seen talking to the server and is not closed
        under. acquire and release rather than `with`, which costs twice as much, four times per job.
        """
        lock = self._lock
        lock.acquire()
        try:
            if lease.released:
                raise ConnectionReleasedError(
                    "the queue worker released this job while it ran; its outcome is not written"
                )
            lease.busy = True
        finally:
            lock.release()

    def _commit(self, conn: Any, lease: _Lease) -> None:
        self._start_round_trip(lease)
        try:
            if lease.deferred is not None:
                self._send_deferred(conn, lease)
            if lease.pending:
                self._settle(conn, lease.pending)
            conn.commit()
        except Exception as exc:
            self._raise_library_error(exc)

    def _finish(self, lease: _Lease, *, pooled: bool, healthy: bool) -> None:
        """Forget the lease and give the connection back, or drop it if it is broken or was released."""
        lock = self._lock
        lock.acquire()
        try:
            self._leases.pop(threading.get_ident(), None)
        finally:
            lock.release()
        self._local.lease = None
        if lease.released:
            # Released mid-statement (so not closed then) or closed already: either way the server must
            # see the connection go, which rolls the transaction back.
            _close_quietly(lease.conn)
            healthy = False
        if pooled:
            self._checkin_pooled(lease.conn)
        elif not healthy:
            self._discard_thread_connection(lease.conn)

    def transaction(self) -> AbstractContextManager[Any]:
        return _Transaction(self)

    def server_time_limits(self) -> dict[str, float] | None:
        """The server's limits on a transaction's life, in seconds, by setting name (only those set).

        Read (sql/<dialect>/sessions.sql) on the calling worker thread's own connection, before it runs a
        transaction on it, or on one borrowed from the pool and given back; never on a caller's. The
        read is rolled back, so the connection is left as it was found.
        """
        pooled = self._pooled
        try:
            conn = self._checkout_pooled() if pooled else self._local.conn or self._new_thread_connection()
        except Exception as exc:
            self._raise_library_error(exc)
        try:
            cursor = self._cursor(conn)
            try:
                cursor.execute(sql.sessions(self.dialect)[self._time_limits_block(conn)])
                rows = cursor.fetchall()
            finally:
                cursor.close()
            conn.rollback()
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.rollback()
            if not pooled and self._is_broken(conn):
                self._discard_thread_connection(conn)
            self._raise_library_error(exc)
        finally:
            if pooled:
                self._checkin_pooled(conn)
        return {str(name): int(ms) / 1000 for name, ms in rows if ms is not None and int(ms) > 0}

    def release_connection(self, thread_id: int) -> bool:
        """Abandon the transaction thread `thread_id` has open: its job becomes claimable again.

        Closes the connection at once if the thread is not talking to the server (the usual case: it is
        running a handler), so the server rolls back and frees the row lock; otherwise the statement is
        cancelled where the driver can (PostgreSQL) and the thread closes the connection after it.
        Whatever the thread does next on it fails with ConnectionReleasedError, so a handler that returns
        later writes nothing. False if the thread had no transaction open.
        """
        return self._release(thread_id, end_session=False)

    def end_transaction(self, thread_id: int) -> bool:
        """release_connection for a job past its time bound: the session is ended from another one where
        the backend can (PostgreSQL, MySQL), so the server rolls back without the connection being touched
        under a handler that may be using it; the thread closes it when it next reaches the backend."""
        return self._release(thread_id, end_session=True)

    def _release(self, thread_id: int, *, end_session: bool) -> bool:
        with self._lock:
            lease = self._leases.get(thread_id)
            if lease is None or lease.released:
                return False
            lease.released = True
            close_now = not lease.busy
        if end_session and self._end_session(lease.conn):
            return True
        if close_now:
            _close_quietly(lease.conn)
        else:
            # A statement blocked on a lock (a claim behind LOCK TABLE or a migration) would hold the
            # thread, and then the row it returns, until the lock goes; a driver that can, cuts it short.
            self._cancel_statement(lease.conn)
        return True

    def close_thread_connection(self) -> None:
        """Close the connection the calling thread kept, if any; a worker thread calls it as it ends.

        So a worker on a backend it was lent gives back what its own threads opened, and nothing of
        another worker's. A pool's connections go back to the pool after every transaction already.
        """
        conn = self._local.conn
        if conn is not None:
            self._discard_thread_connection(conn)

    def close(self) -> None:
        with self._lock:
            owned, self._owned, self._spare = self._owned, [], []
            leases = list(self._leases.values())
            for lease in leases:
                lease.released = True
            # A connection mid-statement is closed by its own thread after the statement (it sees the
            # release); closing it under the thread would break the driver, not just the transaction.
            busy = {id(lease.conn) for lease in leases if lease.busy}
        idle = {id(conn): conn for conn in [*owned, *(lease.conn for lease in leases)]}
        for key, conn in idle.items():
            if key in busy:
                continue
            _close_quietly(conn)

    # -- statements ------------------------------------------------------------------------------------

    def _execute(
        self,
        conn: Any,
        statement: str,
        params: Any,
        read: Callable[[Any], _T],
        *,
        copy: bool = False,
    ) -> _T:
        """Run one statement and return `read` of its cursor, with the driver's errors translated.

        With `copy`, `statement` is a COPY ... FROM STDIN and `params` the rows it streams (_copy). On a
        pipelined transaction it first settles the writes queued before it (_queue_write), so the
        statement sees them done and counted.
        Five statements run per job, so this is written for speed: no context managers, no lookups twice.
        """
        lease = self._local.lease
        if lease is not None and lease.conn is conn:
            # transaction() has prepared this connection's session already.
            self._start_round_trip(lease)
            cursors = lease.cursors
        else:
            lease = cursors = None  # a caller's connection, not the transaction's
        try:
            if lease is None:
                self._prepare_session(conn)
            else:
                if lease.deferred is not None:
                    self._send_deferred(conn, lease)
                if lease.pending:
                    self._settle(conn, lease.pending)
            if cursors is not None:
                # The thread's own connection keeps its cursors: making one costs more than a statement's
                # own Python work. One per kind of result (`read`): a psycopg cursor that switches between
                # the claim's rows and the writes' counts sets up its result handling anew each time, 21k
                # instructions a job more than a cursor that keeps to one shape.
                cursor = cursors.get(read)
                if cursor is None:
                    cursor = cursors[read] = self._cursor(conn)
                kept = True
            else:
                # A caller's or a pool's connection: the backend cannot tell when it goes away.
                cursor = self._statement_cursor(conn)
                kept = False
            try:
                if copy:
                    self._copy(cursor, statement, params)
                else:
                    cursor.execute(statement, params)
                return read(cursor)
            finally:
                if not kept:
                    cursor.close()
        except Exception as exc:
            self._raise_library_error(exc)
        finally:
            if lease is not None:
                # No lock: the statement is over, so release_connection may close the connection whether it
                # reads busy before this store (it cancels, and the thread closes it) or after (it closes).
                lease.busy = False

    def _copy(self, cursor: Any, statement: str, rows: Iterable[tuple[Any, ...]]) -> None:
        """Stream `rows` through the COPY `statement`, reading them as it goes (they may be made as read)."""
        raise NotImplementedError(f"{type(self).__name__} has no COPY")

    def _render(self, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
        """The statement `name` for these tables; the per-job statements keep what it gives (_statements),
        so an override must give the same text for the same arguments."""
        return sql.render(self.dialect, name, job_table, archived_job_table)

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        text, params, generated = self._enqueue_statement(job_table, job)
        # The row count needs no reading: a failed INSERT raises, and one that ran wrote its one row.
        read = self._generated_id if generated else _ignore
        session = self._caller_session(conn)
        if type(session) is SessionPrefix:  # nothing to set up: no block to enter and leave
            stored = self._execute(conn, session.prefix + text, params, read)
        else:
            with session as prefix:
                stored = self._execute(conn, prefix + text, params, read)
        return stored if generated else job.job_id

    def _enqueue_statement(self, job_table: TableName, job: JobRecord) -> tuple[str, Any, bool]:
        """The enqueue INSERT for `job`, its parameters, and whether the database makes the id.

        Shared with the dialect's asyncio backend, which sends the same statement with the same values.
        """
        enqueued_at = self._db_time(job.enqueued_at, what="enqueued_at")
        # A job due now has the very `now` as both times: its parameter is made once.
        process_at = (
            enqueued_at
            if job.process_at is job.enqueued_at
            else self._db_time(job.process_at, what="process_at")
        )
        generated = job.job_id is None
        values = self._enqueue_row(job, enqueued_at, process_at)
        statement = self._render("enqueue_db_generated" if generated else "enqueue", job_table)
        # The placeholders' names decide which value goes where. Bound as a tuple, which both drivers
        # take for less than a dict; a statement with other names (a backend's own _render) by name.
        text, names = sql.positional(statement)
        params: Any = values[generated:]
        if names != _ENQUEUE_COLUMNS[generated:]:
            text, params = statement, dict(zip(_ENQUEUE_COLUMNS, values, strict=True))
            if generated:
                del params["job_id"]
        return text, params, generated

    def _enqueue_row(self, job: JobRecord, enqueued_at: Any, process_at: Any) -> tuple[Any, ...]:
        """The enqueue INSERT's values in _ENQUEUE_COLUMNS order, the times as _db_time made them."""
        return (job.job_id, job.queue, job.job_type, job.payload, job.attempts, enqueued_at, process_at)

    def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]:
        """(E) for a batch: every time is checked before any SQL, then as few statements as limits allow.

        Rows go in chunks of at most _BATCH_ROWS rows and about _BATCH_BYTES bytes, one statement each,
        all on the caller's connection and in its transaction. Each statement writes all its rows or none.
        """
        generated = jobs[0].job_id is None
        rows = list(self._batch_rows(jobs, generated=generated))
        with self._caller_session(conn) as prefix:
            stored = self._insert_rows(conn, prefix, job_table, rows, generated=generated)
        return stored if generated else [job.job_id for job in jobs]

    def _batch_rows(
        self, jobs: Iterable[JobRecord], *, generated: bool, ids: list[Any] | None = None
    ) -> Iterator[tuple[Any, ...]]:
        """The batch INSERT's (or COPY's) row of each job as it is read, its times as _db_time makes them.

        Without the id column if `generated`; each job's id is added to `ids`, if given. A time that
        cannot be stored raises ConfigurationError naming the job's index.
        """
        times: dict[datetime, Any] = {}  # one `now` per batch: its parameter is made once
        # Nothing a job holds is this object, so the first job's times are converted.
        last_enqueued_at = last_process_at = enqueued_param = process_param = _NO_JOB
        for index, job in enumerate(jobs):
            job_id, queue, job_type, payload, attempts, enqueued_at, process_at = job
            # The same datetime as the job before (the batch's `now`, usually): its parameter as well.
            if enqueued_at is not last_enqueued_at or process_at is not last_process_at:
                try:
                    enqueued_param = times.get(enqueued_at)
                    if enqueued_param is None:
                        enqueued_param = times[enqueued_at] = self._db_time(
                            enqueued_at, what=f"jobs[{index}]: enqueued_at"
                        )
                    process_param = times.get(process_at)
                    if process_param is None:
                        process_param = times[process_at] = self._db_time(
                            process_at, what=f"jobs[{index}]: process_at"
                        )
                except ConfigurationError as exc:
                    exc.index = index
                    raise
                last_enqueued_at, last_process_at = enqueued_at, process_at
            if ids is not None:
                ids.append(job_id)
            if generated:
                yield (queue, job_type, payload, attempts, enqueued_param, process_param)
            else:
                yield (job_id, queue, job_type, payload, attempts, enqueued_param, process_param)

    def _insert_rows(
        self, conn: Any, prefix: str, job_table: TableName, rows: list[tuple[Any, ...]], *, generated: bool
    ) -> list[Any]:
        """Insert `rows` with multi-row INSERTs; the generated ids in order if `generated`, else []."""
        name = "enqueue_many_db_generated" if generated else "enqueue_many"
        ids: list[Any] = []
        chunks = list(_chunks(rows, self._BATCH_ROWS, self._BATCH_BYTES))
        with self._all_or_none(conn) if len(chunks) > 1 else contextlib.nullcontext():
            for chunk in chunks:
                statement = prefix + sql.render_rows(self.dialect, name, job_table, len(chunk))
                params = [value for row in chunk for value in row]
                if generated:
                    ids.extend(self._execute(conn, statement, params, _first_column))
                else:
                    self._execute(conn, statement, params, _rowcount)
        return ids

    @contextmanager
    def _enqueue_many_savepoint(self, conn: Any) -> Iterator[None]:
        """The block inside SAVEPOINT proletarian_enqueue_many of the caller's open transaction: rolled back
        to and released if the block raises, released if not, so the transaction is left as it was."""
        statements = sql.queries(self.dialect)
        self._execute(conn, statements["enqueue_many_savepoint"], None, _ignore)
        try:
            yield
        except BaseException:
            # The batch's own error is the one to report; a session that cannot roll back is broken anyway.
            with contextlib.suppress(Exception):
                self._execute(conn, statements["enqueue_many_rollback"], None, _ignore)
                self._execute(conn, statements["enqueue_many_release"], None, _ignore)
            raise
        self._execute(conn, statements["enqueue_many_release"], None, _ignore)

    def _all_or_none(self, conn: Any) -> AbstractContextManager[None]:
        """Around the statements of a batch that needed more than one: undoes them all if one fails.

        Nothing by default: after a failed statement PostgreSQL refuses all but a rollback anyway.
        """
        return contextlib.nullcontext()

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        row = self._execute(
            conn,
            self._claim_statement(conn, "get_next_job", job_table),
            {"queue": queue, "now": self._db_time(now, what="now")},
            self._fetch_claimed,
        )
        return None if row is None else self._job_record(row)

    def _claim_statement(self, conn: Any, name: str, job_table: TableName) -> str:
        """The text of claim `name` (get_next_job or get_next_jobs) for `job_table`, to run on `conn`."""
        return self._statements[name, job_table, None]

    def _job_record(self, row: Sequence[Any]) -> JobRecord:
        job_id, queue_text, job_type, payload, attempts, enqueued_at, process_at = row
        # tuple.__new__, in JobRecord's field order: the generated __new__ with keywords costs six times as
        # much, and _make a Python call more (the unpacking above has checked the length).
        return _new_tuple(
            JobRecord,
            (
                job_id,
                queue_text,
                job_type,
                payload,
                int(attempts),
                self._from_db_time(enqueued_at),
                self._from_db_time(process_at),
            ),
        )

    # -- batch mode (BatchClaim) -----------------------------------------------------------------------

    def get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        rows = self._execute(
            conn,
            self._claim_statement(conn, "get_next_jobs", job_table),
            {"queue": queue, "now": self._db_time(now, what="now"), "limit": limit},
            self._fetch_claimed_rows,
        )
        return [self._job_record(row) for row in rows]

    def _write_all(
        self,
        conn: Any,
        name: str,
        job_table: TableName,
        archived_job_table: TableName | None,
        job_ids: Sequence[Any],
        params: list[Any],
    ) -> None:
        """Run the batch statement `name` over `job_ids` (`params` holds them where the statement binds them)
        and refuse any row count but one per job."""
        statement = sql.render_ids(self.dialect, name, job_table, archived_job_table, len(job_ids))
        count = self._execute(conn, statement, params, self._batch_count)
        if count != len(job_ids):
            raise _wrong_batch_count(count, name, len(job_ids))

    def archive_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        params = [status, self._db_time(finished_at, what="finished_at"), *job_ids]
        self._write_all(conn, "archive_jobs", job_table, archived_job_table, job_ids, params)

    def delete_jobs(self, conn: Any, job_table: TableName, job_ids: Sequence[Any]) -> None:
        self._write_all(conn, "delete_jobs", job_table, None, job_ids, list(job_ids))

    def archive_and_delete_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        """The compact plan in batch mode (BatchArchiveAndDelete): the dialect's archive_and_delete_jobs,
        one statement, its ids before status and finished_at."""
        params = self._archive_and_delete_params(job_ids, status, finished_at)
        self._write_all(conn, "archive_and_delete_jobs", job_table, archived_job_table, job_ids, params)

    def _archive_and_delete_params(
        self, job_ids: Sequence[Any], status: str, finished_at: datetime
    ) -> list[Any]:
        """archive_and_delete_jobs' parameters: the ids, then status and finished_at."""
        return [*job_ids, status, self._db_time(finished_at, what="finished_at")]

    def _batch_count(self, cursor: Any) -> int:
        """The row count of a batch write (a reader for _execute, one cursor for every batch write).

        On a pipelined transaction the count arrives only with the results, so it syncs first: read before,
        it is -1, and a batch that wrote every row would be refused.
        """
        lease = self._local.lease
        if lease is not None and lease.pending is not None:
            self._sync(lease.conn)
        return int(cursor.rowcount)

    @contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        statements = sql.queries(self.dialect)
        self._execute(conn, statements["job_savepoint"], None, _rowcount)
        try:
            yield
        except BaseException:
            # Should the rollback fail, its error leaves instead and the whole transaction rolls back.
            self._execute(conn, statements["job_savepoint_rollback"], None, _rowcount)
            self._execute(conn, statements["job_savepoint_release"], None, _rowcount)
            raise
        self._execute(conn, statements["job_savepoint_release"], None, _rowcount)

    def _write_one(self, conn: Any, statement: str, params: dict[str, Any], what: str) -> None:
        lease = self._local.lease
        if lease is not None and lease.pending is not None and lease.conn is conn:
            self._queue_write(lease, statement, params, what, params["job_id"])
            return
        count = self._execute(conn, statement, params, _rowcount)
        if count != 1:
            raise _wrong_count(count, what, params["job_id"])

    def _queue_write(self, lease: _Lease, statement: str, params: Any, what: str, job_id: Any) -> None:
        """Send a single-row write on a pipelined transaction; _settle counts it before anything else runs.

        Each queued write has its own kept cursor, which holds its row count until then. `job_id` names
        the job (or jobs) a wrong count is reported for.
        """
        assert lease.pending is not None and lease.cursors is not None  # pipelined: the thread's own
        pending = lease.pending
        self._start_round_trip(lease)
        try:
            key = -1 - len(pending)  # apart from the keys of _execute's cursors, its readers
            cursor = lease.cursors.get(key)
            if cursor is None:
                cursor = lease.cursors[key] = self._cursor(lease.conn)
            cursor.execute(statement, params)
        except Exception as exc:
            self._raise_library_error(exc)
        finally:
            lease.busy = False  # as in _execute
        pending.append((cursor, what, job_id))

    def _settle(self, conn: Any, pending: list[tuple[Any, str, Any]]) -> None:
        """Complete the queued writes in one round trip, then check each changed exactly one row.

        Runs before the commit (and before any other statement), so a count that is wrong still rolls the
        whole transaction back, as it does when each write is its own round trip.
        """
        self._sync(conn)
        writes = pending[:]
        pending.clear()
        check_counts(writes)

    def archive_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        self._archive(conn, "archive_job", job_table, archived_job_table, job_id, status, finished_at)

    def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        statement = self._statements["delete_job", job_table, None]
        self._write_one(conn, statement, {"job_id": job_id}, "delete_job")

    def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        """The compact plan (ArchiveAndDelete): the dialect's archive_and_delete_job, one statement."""
        self._archive(
            conn, "archive_and_delete_job", job_table, archived_job_table, job_id, status, finished_at
        )

    def _archive(
        self,
        conn: Any,
        name: str,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        """Run the archiving statement `name` for one job and check that it changed exactly one row."""
        params = self._archive_params(job_id, status, finished_at)
        self._write_one(conn, self._statements[name, job_table, archived_job_table], params, name)

    def _archive_params(self, job_id: Any, status: str, finished_at: datetime) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "status": status,
            "finished_at": self._db_time(finished_at, what="finished_at"),
        }

    def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        params = {"job_id": job_id, "retry_at": self._db_time(retry_at, what="retry_at")}
        self._write_one(conn, self._statements["retry_at", job_table, None], params, "retry_at")


class _Transaction:
    """SqlBackend.transaction(): commits when the block ends, rolls back on error, keeps the lease.

    A class rather than a generator context manager, which costs as much again as all the rest of it, and
    every job runs in one.
    """

    __slots__ = ("_backend", "_lease", "_pooled", "_state")

    def __init__(self, backend: SqlBackend) -> None:
        self._backend = backend

    def __enter__(self) -> Any:
        backend = self._backend
        local = backend._local
        pooled = self._pooled = backend._pooled
        conn = None if pooled else local.conn
        if conn is None:
            try:
                conn = backend._checkout_pooled() if pooled else backend._new_thread_connection()
            except Exception as exc:
                backend._raise_library_error(exc)
        lease = self._lease = _Lease(conn, None if pooled else local.cursors)
        lock = backend._lock
        lock.acquire()
        try:
            backend._leases[threading.get_ident()] = lease
        finally:
            lock.release()
        local.lease = lease
        try:
            try:
                backend._prepare_session(conn, worker=True)
                self._state = backend._begin(conn)
                if backend._pipelines(conn, pooled=pooled):
                    lease.pending = []
            except Exception as exc:
                backend._raise_library_error(exc)
        except BaseException:
            backend._finish(lease, pooled=pooled, healthy=not backend._is_broken(conn))
            raise
        # As after a statement (_execute): the set-up is over, and a release reading busy either way is right.
        lease.busy = False
        setting = backend._job_transaction_setting
        if setting is not None:
            try:
                backend._execute(conn, setting, None, _ignore)
            except BaseException as exc:
                # Rolled back and handed back as after any error in the block; then raised as it is.
                self.__exit__(type(exc), exc, exc.__traceback__)
                raise
        return conn

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        backend, lease = self._backend, self._lease
        conn = lease.conn
        healthy = True
        error = exc
        try:
            if error is None:
                try:
                    backend._commit(conn, lease)
                except BaseException as commit_error:
                    error = commit_error
            # From here on only this thread touches the connection: a release closes nothing.
            if error is not None and backend._mark(lease, busy=True):
                try:
                    conn.rollback()
                except Exception:
                    healthy = False  # The original error matters more; the connection is dropped below.
            # The lease is busy on every path here, so a release cannot close the connection under _end; a
            # released connection is closed and dropped by _finish instead.
            if not lease.released:
                try:
                    backend._end(conn, self._state)
                except Exception:
                    healthy = False
            if error is not None:
                healthy = healthy and not backend._is_broken(conn) and not backend._abandons_connection(error)
        finally:
            backend._finish(lease, pooled=self._pooled, healthy=healthy)
        if error is not None and error is not exc:
            raise error  # the commit failed


def _chunks(rows: list[tuple[Any, ...]], max_rows: int, max_bytes: int) -> Iterator[list[tuple[Any, ...]]]:
    """`rows` in order, cut into lists of at most `max_rows` rows and about `max_bytes` bytes.

    A row's size counts its text twice (a driver that escapes on the client may double it) plus room
    for each value's quotes and separators; a row bigger than `max_bytes` goes alone.
    """
    chunk: list[tuple[Any, ...]] = []
    size = 0
    for row in rows:
        row_size = 0
        for value in row:
            if isinstance(value, str):
                row_size += 2 * (len(value) if value.isascii() else len(value.encode("utf-8"))) + 8
            else:
                row_size += 48  # an id, a number or a time, as SQL text with quotes and an introducer
        if chunk and (len(chunk) >= max_rows or size + row_size > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += row_size
    if chunk:
        yield chunk


def _first_column(cursor: Any) -> list[Any]:
    return [row[0] for row in cursor.fetchall()]


def _fetchall(cursor: Any) -> list[Any]:
    return list(cursor.fetchall())


def check_counts(writes: list[tuple[Any, str, Any]]) -> None:
    """Refuse the first settled single-row write, (cursor, what, job id), whose cursor counts other than one
    row (the threaded and the asyncio backends' _settle)."""
    for cursor, what, job_id in writes:
        if cursor.rowcount != 1:
            raise _wrong_count(cursor.rowcount, what, job_id)


def _wrong_count(count: int, what: str, job_id: Any) -> DatabaseError:
    # The row is locked by this transaction, so anything but one row means the table is not what the
    # worker thinks it is; failing keeps the job rather than losing it.
    return DatabaseError(f"{what} changed {count} rows of job {job_id!r}; expected exactly 1")


def _wrong_batch_count(count: int, what: str, jobs: int) -> DatabaseError:
    # As _wrong_count: every row is locked by this transaction, so any other count means the table is not
    # what the worker thinks it is; the batch's transaction rolls back and keeps every job.
    return DatabaseError(f"{what} changed {count} rows of {jobs} jobs; expected {jobs}")


def _ignore(cursor: Any) -> None:
    return None


def _fetchone(cursor: Any) -> Any:
    return cursor.fetchone()


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):  # Closing is all that is left to do; a failure changes nothing.
        conn.close()
