"""The MySQL 8.0.1+ backend (MariaDB 10.6+ too), on PyMySQL or mysqlclient."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from proletarian_ref import sql
from proletarian_ref.backend import Capabilities, JobRecord
from proletarian_ref.backends import mysql_chain, mysql_claim, mysql_driver
from proletarian_ref.backends._dbapi import (
    SessionPrefix,
    SqlBackend,
    _close_quietly,
    _fetchall,
    _ignore,
    _Lease,
    _wrong_batch_count,
    _wrong_count,
)
from proletarian_ref.backends.mysql_payload import PayloadColumn, check_payload_fits, statements
from proletarian_ref.clock import EPOCH_NAIVE, EPOCH_UTC
from proletarian_ref.errors import (
    ConfigurationError,
    DatabaseError,
    SchemaMissingError,
    TransientDatabaseError,
)
from proletarian_ref.tables import TableName

# Server and client error codes after which the same work may succeed on a retry.
_TRANSIENT_CODES: Final = frozenset(
    {
        1040,  # too many connections
        1047,  # Galera: "WSREP has not yet prepared node for application use" (joining, or lost quorum)
        1053,  # server shutdown in progress
        1080,  # forcing close of thread (server shutting down)
        1152,  # aborted connection
        1158,  # got an error reading communication packets
        1159,  # got timeout reading communication packets
        1160,  # got an error writing communication packets
        1161,  # got timeout writing communication packets
        1203,  # user already has more than max_user_connections active connections (a full "pool")
        1205,  # lock wait timeout
        1213,  # deadlock
        1226,  # user has exceeded a resource limit (max_connections_per_hour and the like)
        1317,  # query execution was interrupted (KILL QUERY, shutdown)
        1927,  # connection was killed (MariaDB)
        1969,  # query execution was interrupted, max_statement_time (MariaDB)
        3024,  # query execution was interrupted, max_execution_time (MySQL)
        4031,  # disconnected by the server because of inactivity (MySQL 8.0.24+)
    }
)
_NO_SUCH_TABLE: Final = 1146
# "Key '...' doesn't exist in table": a bounded claim's FORCE INDEX names an index dropped since its lookup.
_NO_SUCH_INDEX: Final = 1176
# Errors after which the worker thread drops its connection rather than keep it: a Galera node that is
# not in the primary component answers every statement with 1047 until it rejoins, so the thread must
# connect again, which a failover_connection_factory sends to a node that is.
_RECONNECT_CODES: Final = frozenset({1047})
_CLIENT_ERRORS: Final = range(2000, 3000)  # CR_* codes: connection lost, server gone away, cannot connect
# The range of MySQL's TIMESTAMP type, as UTC wall-clock time (MariaDB before 11.5 too).
TIMESTAMP_MIN: Final = datetime(1970, 1, 1, 0, 0, 1)
TIMESTAMP_MAX: Final = datetime(2038, 1, 19, 3, 14, 7)
_UTC: Final = "+00:00"
_TIME_ZONE_SQL: Final = "SET time_zone = %s"
# MariaDB runs one statement with a session variable changed and restores it itself: no extra round trip.
_MARIADB_UTC_PREFIX: Final = f"SET STATEMENT time_zone = '{_UTC}' FOR "
_MARIADB_UTC_SESSION: Final = SessionPrefix(_MARIADB_UTC_PREFIX)
_UNPREPARED: Final = object()
# The key of the chain's kept cursor among a lease's cursors (whose others are keyed by reader or by -n).
_CHAIN_CURSOR: Final = "chain"
_ISOLATION_SQL: Final = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"


class MySQLBackend(SqlBackend):
    """Proletarian's statements on MySQL 8.0.1+ / MariaDB 10.6+ (SKIP LOCKED), ids as BINARY(16).

    With `compact=True` a finished job's archive INSERT and DELETE, Proletarian's very statements, go to
    the server as one multi-statement query, and each row count is checked before COMMIT: four round trips
    a job instead of five, the same rows (docs/worker.md, "Statement plans"). It needs every connection
    the backend runs transactions on to be opened with the CLIENT.MULTI_STATEMENTS flag: on PyMySQL e.g.
    connection_factory(dsn, client_flag=CLIENT.MULTI_STATEMENTS); mysqlclient sets it unless given
    multi_statements=False. On one without it the transaction raises ConfigurationError before it claims
    a job.

    The connections are PyMySQL's or mysqlclient's (MySQLdb), lent or from the data source; the
    statements and the rows they write are the same on both (backends/mysql_driver.py: what differs).

    With `chain=True` (backend.ChainedClaim and ChainedBatchClaim) a queue worker chains each finished job's
    COMMIT to the next claim, which it sends in the same query; on the compact plan the job's archive and
    delete go in it too, each row count checked by the server (backends/mysql_chain.py): one round trip a
    job. It needs the same connections as the compact plan.

    With `bounded_claim=True` (the default) every claim but the exact plan's starts its index scan at the
    oldest due job (queries.sql, claim_bounded), so it does not lock-read the rows of the index
    entries InnoDB has not yet purged: batch mode's claims on every plan, and one job's claims on the
    compact and chained plans. The job table's (queue, process_at) index is looked up once; a table without
    one is claimed from with Proletarian's statement. `bounded_claim=False` keeps Proletarian's claim in
    every plan (docs/mysql.md, "The bounded claim").
    """

    dialect: ClassVar[str] = "mysql"
    _chains: ClassVar[bool] = True
    capabilities: ClassVar[Capabilities] = Capabilities(
        time_precision=timedelta(seconds=1),
        claim_locks_only_the_claimed_row=False,
        handler_transaction=True,
    )

    def __init__(
        self,
        data_source: Any = None,
        *,
        first_connection: Any = None,
        compact: bool = False,
        chain: bool = False,
        bounded_claim: bool = True,
    ) -> None:
        super().__init__(data_source, first_connection=first_connection, compact=compact, chain=chain)
        # The claims this backend bounds: Proletarian's exact plan keeps its own single-job claim.
        bounded = ("get_next_jobs", "get_next_job") if compact or chain else ("get_next_jobs",)
        self._bounded_claims = frozenset(bounded if bounded_claim else ())
        self._claim_indexes = mysql_claim.ClaimIndexes()
        # The payload columns of (server, job table, archive table); read once, re-read before refusing.
        self._payload_columns: dict[tuple[Any, ...], list[PayloadColumn]] = {}

    def _cancel_statement(self, conn: Any) -> None:
        # Neither driver has an out-of-band cancel, so a second session of the same server sends KILL QUERY,
        # which ends the statement (error 1317) and keeps the session. Only a factory can open that
        # session; with a lent connection the claim ends when its lock does.
        if not callable(self._data_source):
            return
        session = _server_session(conn)
        if session is None:
            return
        with contextlib.suppress(Exception):  # a statement that ends by itself is as good
            other = self._data_source()
            try:
                with mysql_driver.plain_cursor(other) as cursor:
                    cursor.execute("KILL QUERY %s", (int(session),))
            finally:
                other.close()

    def _time_limits_block(self, conn: Any) -> str:
        # MariaDB has idle-transaction timeouts of its own, which MySQL would refuse to read.
        return "time_limits_mariadb" if mysql_driver.is_mariadb(conn) else "time_limits"

    def _end_session(self, conn: Any) -> bool:
        # KILL (CONNECTION), not KILL QUERY: the session goes, so the server rolls its transaction back.
        session = _server_session(conn)
        if session is None:
            return False
        try:
            other = self._other_session()
        except Exception:
            return False
        if other is None:
            return False
        try:
            with mysql_driver.plain_cursor(other) as cursor:
                cursor.execute(sql.sessions(self.dialect)["end_session"], {"session": int(session)})
            return True
        except Exception:
            return False
        finally:
            _close_quietly(other)

    def _translate(self, exc: BaseException) -> DatabaseError | None:
        if not mysql_driver.is_driver_error(exc):
            return None
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        message = f"{type(exc).__name__}: {exc}"
        if code == _NO_SUCH_TABLE:
            return SchemaMissingError(f"{message} (install the schema: proletarian_ref.schema.install)")
        if code == _NO_SUCH_INDEX and self._bounded_claims:
            # The next claim looks the index up again, and falls back on Proletarian's claim if none is left.
            self._claim_indexes.forget()
            return TransientDatabaseError(f"{message} (the bounded claim's index is gone; looked up again)")
        if (
            isinstance(exc, mysql_driver.interface_error_classes())
            or code in _TRANSIENT_CODES
            or code in _CLIENT_ERRORS
        ):
            return TransientDatabaseError(message)
        return DatabaseError(message)

    def _abandons_connection(self, error: BaseException) -> bool:
        cause = error.__cause__ if isinstance(error, DatabaseError) else error
        return (
            isinstance(cause, mysql_driver.error_classes())
            and bool(cause.args)
            and cause.args[0] in _RECONNECT_CODES
        )

    def _prepare_session(self, conn: Any, *, worker: bool = False) -> None:
        # Only the worker's own connections: a caller's session is never changed (see _caller_session).
        # TIMESTAMP literals are read in the session time zone, so UTC values need a UTC session. READ
        # COMMITTED also keeps the claim's locking read from taking InnoDB gap locks, which under the
        # default REPEATABLE READ make enqueues wait for running handlers. Session state survives
        # commits, so once per server session will do.
        if not worker:
            return
        # Noted per thread, which keeps its connection, with the server's id for the session: a driver that
        # reconnects (ping(reconnect=True)) gets a new session with the server's defaults.
        prepared = (conn, _server_session(conn))
        if self._local.prepared == prepared:
            return
        if (self.compact_plan or self._chain) and not mysql_driver.multi_statements(conn):
            # Refused rather than run as two statements: the option would silently do nothing. Raised
            # before the claim, so no handler runs a job whose outcome could not be written.
            option, sends = (
                ("compact=True", "a job's archive and delete")
                if self.compact_plan
                else ("chain=True", "a job's COMMIT and the next claim")
            )
            raise ConfigurationError(
                f"MySQLBackend({option}) sends {sends} as one multi-statement "
                "query, which this connection was not opened for: open the backend's connections with "
                "client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS (connection_factory(dsn, "
                "client_flag=CLIENT.MULTI_STATEMENTS)) on PyMySQL, without multi_statements=False on "
                f"mysqlclient, or leave {option.split('=')[0]} off"
            )
        with conn.cursor() as cursor:
            cursor.execute(_TIME_ZONE_SQL, (_UTC,))
            cursor.execute(_ISOLATION_SQL)
        self._local.prepared = prepared

    def _caller_session(self, conn: Any) -> AbstractContextManager[str]:
        # The caller's session keeps its time zone: MariaDB changes it for the INSERT alone; elsewhere
        # (MySQL) it is read, set to UTC only if it is not, and put back before enqueue returns or raises.
        # The SETs neither commit nor touch the caller's transaction.
        if mysql_driver.is_mariadb(conn):
            return _MARIADB_UTC_SESSION
        return self._utc_session(conn)

    @contextlib.contextmanager
    def _utc_session(self, conn: Any) -> Iterator[str]:
        with self._errors(), mysql_driver.plain_cursor(conn) as cursor:
            cursor.execute("SELECT @@session.time_zone")
            (zone,) = cursor.fetchone()
            if zone == _UTC:
                zone = None
            else:
                cursor.execute(_TIME_ZONE_SQL, (_UTC,))
        if zone is None:
            yield ""
            return
        try:
            yield ""
        except BaseException:
            # The statement's error is the one to report; a session that cannot run SET is broken anyway.
            with contextlib.suppress(Exception):
                self._set_time_zone(conn, zone)
            raise
        with self._errors():
            self._set_time_zone(conn, zone)

    def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]:
        if jobs and jobs[0].job_id is None:
            # A multi-row INSERT reports only its first AUTO_INCREMENT id; the rest are consecutive only
            # under some innodb_autoinc_lock_mode settings, so the ids could not be returned safely.
            raise ConfigurationError(
                "enqueue_many cannot use the database-generated id strategy on MySQL: a multi-row INSERT "
                "does not say which ids it made; use a UUID strategy, or enqueue one job at a time"
            )
        return super().enqueue_many(conn, job_table, jobs)

    def _insert_rows(
        self, conn: Any, prefix: str, job_table: TableName, rows: list[tuple[Any, ...]], *, generated: bool
    ) -> list[Any]:
        """The multi-row INSERTs with the values written into the SQL here rather than by the driver.

        PyMySQL's execute escapes every parameter through its converters, which cost more than the
        rest of a job's work in enqueue_many. A batch repeats its queue, job type, attempts and times:
        their SQL text is made once; an id is its hex literal, and a payload without a character that
        needs escaping is quoted as it is. Anything else goes through the driver's own (mysql_driver.quote).
        """
        if generated or not rows:  # refused in enqueue_many; the shared way, should it get here
            return super()._insert_rows(conn, prefix, job_table, rows, generated=generated)
        row_template = sql.queries(self.dialect)["enqueue_many_row"]
        head = prefix + sql.render_rows(self.dialect, "enqueue_many", job_table, 1)[: -len(row_template)]
        values = _values_text(conn, rows)
        chunks: list[list[str]] = []
        chunk: list[str] = []
        size = 0
        for value in values:
            # Counted twice, as SqlBackend's _chunks counts a row: the statement's size estimate has
            # the same margin below max_allowed_packet whichever way the values were written.
            value_size = 2 * (len(value) if value.isascii() else len(value.encode("utf-8")))
            if chunk and (len(chunk) >= self._BATCH_ROWS or size + value_size > self._BATCH_BYTES):
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(value)
            size += value_size
        chunks.append(chunk)
        with self._all_or_none(conn) if len(chunks) > 1 else contextlib.nullcontext():
            for chunk in chunks:
                # No parameters: the driver sends the text as it is, a % in a payload included.
                self._execute(conn, head + ", ".join(chunk), None, _ignore)
        return []

    def _all_or_none(self, conn: Any) -> AbstractContextManager[None]:
        # A failed statement undoes only itself on MySQL: without the savepoint the batch's earlier
        # statements would stay in the caller's transaction. Released, it leaves the transaction as it was.
        # In autocommit mode each statement commits anyway and there is no transaction to hold a savepoint.
        if conn.get_autocommit():
            return contextlib.nullcontext()
        return self._enqueue_many_savepoint(conn)

    @staticmethod
    def _set_time_zone(conn: Any, zone: str) -> None:
        with mysql_driver.plain_cursor(conn) as cursor:
            cursor.execute(_TIME_ZONE_SQL, (zone,))

    def check_payload(
        self, conn: Any, job_table: TableName, archived_job_table: TableName | None, payload: str
    ) -> None:
        """Raise PayloadTooLargeError if `payload` does not fit the payload column of either table.

        The archive copies the text with INSERT ... SELECT, so the smaller column decides. Columns are
        read from information_schema once per server and tables, and read again before refusing, so a
        column widened since (ALTER TABLE ... MEDIUMTEXT) is seen without a restart.
        """
        server = (getattr(conn, "host", None), getattr(conn, "port", None), getattr(conn, "db", None))
        key = (*server, job_table, archived_job_table)
        columns = self._payload_columns.get(key)
        if columns is not None and check_payload_fits(payload, columns, raise_error=False):
            return
        columns = self._payload_columns[key] = self._read_payload_columns(conn, job_table, archived_job_table)
        check_payload_fits(payload, columns, raise_error=True)

    def _read_payload_columns(
        self, conn: Any, job_table: TableName, archived_job_table: TableName | None
    ) -> list[PayloadColumn]:
        archive = archived_job_table if archived_job_table is not None else job_table
        params = {
            "job_schema": job_table.schema,
            "job_name": job_table.name,
            "archive_schema": archive.schema,
            "archive_name": archive.name,
        }
        statement = statements()["payload_columns"]
        with self._errors(), mysql_driver.plain_cursor(conn) as cursor:
            cursor.execute(statement, params)
            rows = cursor.fetchall()
        return [PayloadColumn(*row) for row in rows]

    def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        """The compact plan: archive_job and delete_job in one multi-statement query, each count checked.

        Both counts are read before either is checked, so the connection is left with no result unread.
        In a chained transaction they are kept back to go with its COMMIT (mysql_chain).
        """
        statements = self._statements
        lease = self._chaining(conn)
        if lease is not None:
            params = self._archive_params(job_id, status, finished_at)
            self._keep_back(conn, lease)
            lease.deferred = mysql_chain.deferred_job(
                mysql_driver.quote(conn), statements, job_table, archived_job_table, params
            )
            return
        statement = (
            f"{statements['archive_job', job_table, archived_job_table]};\n"
            f"{statements['delete_job', job_table, None]}"
        )
        params = self._archive_params(job_id, status, finished_at)
        archived, deleted = self._execute(conn, statement, params, _both_counts)
        if archived != 1:
            raise _wrong_count(archived, "archive_job", job_id)
        if deleted != 1:
            raise _wrong_count(deleted, "delete_job", job_id)

    def archive_and_delete_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        """The compact plan in batch mode: archive_jobs and delete_jobs in one multi-statement query, each
        count checked as archive_and_delete_job checks its two, or kept back as it keeps them."""
        lease = self._chaining(conn)
        if lease is not None:
            finished = self._db_time(finished_at, what="finished_at")
            self._keep_back(conn, lease)
            lease.deferred = mysql_chain.deferred_batch(
                mysql_driver.quote(conn), job_table, archived_job_table, job_ids, status, finished
            )
            return
        count = len(job_ids)
        statement = (
            f"{sql.render_ids(self.dialect, 'archive_jobs', job_table, archived_job_table, count)};\n"
            f"{sql.render_ids(self.dialect, 'delete_jobs', job_table, None, count)}"
        )
        params = [status, self._db_time(finished_at, what="finished_at"), *job_ids, *job_ids]
        archived, deleted = self._execute(conn, statement, params, _both_counts)
        if archived != count:
            raise _wrong_batch_count(archived, "archive_jobs", count)
        if deleted != count:
            raise _wrong_batch_count(deleted, "delete_jobs", count)

    # -- chained claims (ChainedClaim, ChainedBatchClaim) ------------------------------------------------

    def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        """ChainedClaim: the kept-back archive and delete (checked by the server), COMMIT and the next claim
        as one query. On a connection outside transaction() (a caller's), COMMIT and the claim apart."""
        params = {"queue": queue, "now": self._db_time(now, what="now")}
        row = self._chained(
            conn, self._claim_statement(conn, "get_next_job", job_table), params, self._fetch_claimed
        )
        return None if row is None else self._job_record(row)

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        """ChainedBatchClaim: commit_and_get_next_job's query with batch mode's claim."""
        params = {"queue": queue, "now": self._db_time(now, what="now"), "limit": limit}
        rows = self._chained(conn, self._claim_statement(conn, "get_next_jobs", job_table), params, _fetchall)
        return [self._job_record(row) for row in rows]

    def _claim_statement(self, conn: Any, name: str, job_table: TableName) -> str:
        text = self._known_claim(name, job_table)
        if text is None:
            statement, params = mysql_claim.lookup(job_table)
            text = self._claim_indexes.record(
                name, job_table, self._execute(conn, statement, params, _fetchall)
            )
        return text

    def _known_claim(self, name: str, job_table: TableName) -> str | None:
        """Claim `name`'s text for `job_table`; None while the index its bounded form needs is unknown."""
        if name not in self._bounded_claims:
            return self._statements[name, job_table, None]
        return self._claim_indexes.statement(name, job_table)

    def _chained(self, conn: Any, claim: str, params: dict[str, Any], read: Any) -> Any:
        lease = self._local.lease
        if lease is None or lease.conn is not conn:
            self._execute(conn, mysql_chain.commit_statement(), None, _ignore)
            return self._execute(conn, claim, params, read)
        deferred, lease.deferred = lease.deferred, None
        parts = (mysql_chain.commit_statement(), mysql_chain.literal(mysql_driver.quote(conn), claim, params))
        text = ";\n".join(parts if deferred is None else (deferred.text, *parts))
        self._start_round_trip(lease)  # as in _execute: refused on a released connection, before the try
        try:
            cursor = self._kept_cursor(lease)
            cursor.execute(text)
            if deferred is not None:
                deferred.check(cursor)
                cursor.nextset()  # to the COMMIT's result
            cursor.nextset()  # to the claim's: a failed COMMIT raised, and the claim did not run
            return read(cursor)
        except Exception as exc:
            self._raise_library_error(exc)
        finally:
            lease.busy = False  # as in _execute

    def _chaining(self, conn: Any) -> _Lease | None:
        """The calling thread's transaction on `conn` where the backend chains, else None: there a finished
        job's archive and delete are kept back to go with the COMMIT."""
        lease = self._local.lease
        if self._chain and lease is not None and lease.conn is conn:
            return lease
        return None

    def _keep_back(self, conn: Any, lease: _Lease) -> None:
        """Make room for a write to keep back: one kept back already (two finished without a statement
        between, which the worker never does) goes first, so neither is dropped."""
        if lease.deferred is None:
            return
        self._start_round_trip(lease)  # as in _execute
        try:
            self._send_deferred(conn, lease)
        except Exception as exc:
            self._raise_library_error(exc)
        finally:
            lease.busy = False

    def _send_deferred(self, conn: Any, lease: _Lease) -> None:
        # The kept-back writes alone, before another statement or the transaction's own COMMIT: checked by
        # the server as in a chain, so a wrong count raises before anything after them runs.
        deferred, lease.deferred = lease.deferred, None
        cursor = self._kept_cursor(lease)
        cursor.execute(deferred.text)
        deferred.check(cursor)

    def _kept_cursor(self, lease: _Lease) -> Any:
        """The cursor of the chain's queries on the lease's connection, kept with its others."""
        cursors = lease.cursors
        if cursors is None:
            return self._cursor(lease.conn)
        cursor = cursors.get(_CHAIN_CURSOR)
        if cursor is None:
            cursor = cursors[_CHAIN_CURSOR] = self._cursor(lease.conn)
        return cursor

    def _cursor(self, conn: Any) -> Any:
        # A plain tuple cursor whatever cursorclass the caller's connection was made with.
        return mysql_driver.plain_cursor(conn)

    def _db_time(self, value: datetime, *, what: str = "time") -> Any:
        return mysql_timestamp(value, what=what)

    def _from_db_time(self, value: Any) -> datetime:
        if value is None or isinstance(value, str):
            # PyMySQL gives the text of a date it cannot parse, mysqlclient None: 0000-00-00 00:00:00,
            # which a session without strict mode stores for an invalid time (the columns are NOT NULL).
            # It sorts before every time, so the job is due; reading it as the earliest datetime lets it
            # run instead of failing every claim.
            return datetime.min.replace(tzinfo=UTC)
        stored: datetime = value
        if stored.tzinfo is None:
            return EPOCH_UTC + (stored - EPOCH_NAIVE)  # stored.replace(tzinfo=UTC), for less
        return stored.replace(tzinfo=UTC)

    def _begin(self, conn: Any) -> Any:
        was_autocommit = conn.get_autocommit()
        if was_autocommit:
            conn.autocommit(False)
        return was_autocommit

    def _end(self, conn: Any, state: Any) -> None:
        if state and conn.open:
            conn.autocommit(True)

    def _is_broken(self, conn: Any) -> bool:
        return not conn.open

    def _generated_id(self, cursor: Any) -> Any:
        return cursor.lastrowid


def _server_session(conn: Any) -> Any:
    """The server's id for the connection's session (the drivers' thread_id()), new after a reconnect."""
    thread_id = getattr(conn, "thread_id", None)
    return thread_id() if callable(thread_id) else None


def _both_counts(cursor: Any) -> tuple[int, int]:
    """The row counts of a two-statement query; the second -1 if the server sent one result only."""
    first = int(cursor.rowcount)
    if not cursor.nextset():
        return first, -1
    return first, int(cursor.rowcount)


# What PyMySQL escapes in a string (its converters' _escape_table), but '"', which needs no escape
# between single quotes; a payload with none of them is its own SQL text between quotes.
_ESCAPED_IN_STRINGS: Final = ("\\", "'", "\0", "\n", "\r", "\x1a")


def _values_text(conn: Any, rows: list[tuple[Any, ...]]) -> list[str]:
    """Each enqueue row as the SQL text of its VALUES tuple, as the server reads the driver's parameters."""
    # Payloads rarely need an escape, so they are searched together (one memchr a character), and if
    # one does, every payload is escaped by the driver.
    together = "".join([row[3] for row in rows if type(row[3]) is str])
    quote = not any(char in together for char in _ESCAPED_IN_STRINGS)
    escape = mysql_driver.quote(conn)
    texts: list[str] = []
    queue = job_type = attempts = enqueued_at = process_at = middle = tail = _UNPREPARED
    for job_id, row_queue, row_job_type, payload, row_attempts, row_enqueued_at, row_process_at in rows:
        if row_queue is not queue or row_job_type is not job_type:
            queue, job_type = row_queue, row_job_type
            middle = f"{escape(queue)}, {escape(job_type)}"
        if (
            row_attempts is not attempts
            or row_enqueued_at is not enqueued_at
            or row_process_at is not process_at
        ):
            attempts, enqueued_at, process_at = row_attempts, row_enqueued_at, row_process_at
            tail = f"{escape(attempts)}, {escape(enqueued_at)}, {escape(process_at)}"
        id_text = f"X'{job_id.hex()}'" if type(job_id) is bytes else escape(job_id)
        payload_text = f"'{payload}'" if quote and type(payload) is str else escape(payload)
        texts.append(f"({id_text}, {middle}, {payload_text}, {tail})")
    return texts


def mysql_timestamp(value: datetime, *, what: str = "time") -> datetime:
    """An instant as the MySQL backend binds it: the exact UTC wall-clock time, fractions included.

    That is what Connector/J's setTimestamp sends for Proletarian: the server stores it in TIMESTAMP(0) its
    own way (MariaDB truncates, MySQL rounds to nearest), so a row does not tell which side wrote it
    (docs/mysql.md, "Timing"). Raises ConfigurationError, naming `what`, outside TIMESTAMP's range.
    """
    utc = EPOCH_NAIVE + (value.astimezone(UTC) - EPOCH_UTC)  # .replace(tzinfo=None), for less
    # Checked here because the server would refuse it in strict mode, after the caller's transaction
    # has spent a statement, and without strict mode store 0000-00-00, which makes the job due at once.
    # The bounds are whole seconds, so no server's rounding or truncation takes a value past them.
    if not TIMESTAMP_MIN <= utc <= TIMESTAMP_MAX:
        raise ConfigurationError(
            f"{what} {value.isoformat()} is outside what MySQL's TIMESTAMP column can hold "
            f"({TIMESTAMP_MIN} to {TIMESTAMP_MAX} UTC); nothing was written"
        )
    return utc
