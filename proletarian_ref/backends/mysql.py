"""The MySQL 8.0.1+ backend (MariaDB 10.6+ too), on PyMySQL."""

from __future__ import annotations

import weakref
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

import pymysql
import pymysql.cursors

from proletarian_ref.backend import Capabilities
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.errors import (
    ConfigurationError,
    DatabaseError,
    SchemaMissingError,
    TransientDatabaseError,
)

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
# Errors after which the worker thread drops its connection rather than keep it: a Galera node that is
# not in the primary component answers every statement with 1047 until it rejoins, so the thread must
# connect again, which a failover_connection_factory sends to a node that is.
_RECONNECT_CODES: Final = frozenset({1047})
_CLIENT_ERRORS: Final = range(2000, 3000)  # CR_* codes: connection lost, server gone away, cannot connect
# The range of MySQL's TIMESTAMP type, as UTC wall-clock time (MariaDB before 11.5 too).
TIMESTAMP_MIN: Final = datetime(1970, 1, 1, 0, 0, 1)
TIMESTAMP_MAX: Final = datetime(2038, 1, 19, 3, 14, 7)
_TIME_ZONE_SQL: Final = "SET time_zone = '+00:00'"
_ISOLATION_SQL: Final = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"


class MySQLBackend(SqlBackend):
    """Proletarian's statements on MySQL 8.0.1+ / MariaDB 10.6+ (SKIP LOCKED), ids as BINARY(16)."""

    dialect: ClassVar[str] = "mysql"
    capabilities: ClassVar[Capabilities] = Capabilities(
        time_precision=timedelta(seconds=1), claim_locks_only_the_claimed_row=False
    )

    def __init__(self, data_source: Any = None, *, first_connection: Any = None) -> None:
        super().__init__(data_source, first_connection=first_connection)
        # Connections already set up: True for worker connections, False for callers' (time zone only).
        self._prepared: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

    def _translate(self, exc: BaseException) -> DatabaseError | None:
        if not isinstance(exc, pymysql.err.MySQLError):
            return None
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        message = f"{type(exc).__name__}: {exc}"
        if code == _NO_SUCH_TABLE:
            return SchemaMissingError(f"{message} (install the schema: proletarian_ref.schema.install)")
        if isinstance(exc, pymysql.err.InterfaceError) or code in _TRANSIENT_CODES or code in _CLIENT_ERRORS:
            return TransientDatabaseError(message)
        return DatabaseError(message)

    def _abandons_connection(self, error: BaseException) -> bool:
        cause = error.__cause__ if isinstance(error, DatabaseError) else error
        return (
            isinstance(cause, pymysql.err.MySQLError)
            and bool(cause.args)
            and cause.args[0] in _RECONNECT_CODES
        )

    def _prepare_session(self, conn: Any, *, worker: bool = False) -> None:
        # TIMESTAMP literals are read in the session time zone, so UTC values need a UTC session. On the
        # worker's own connections READ COMMITTED also keeps the claim's locking read from taking InnoDB
        # gap locks, which under the default REPEATABLE READ make enqueues wait for running handlers; a
        # caller's connection keeps its isolation level. Session state survives commits, so once will do.
        done = self._prepared.get(conn)
        if done is not None and (done or not worker):
            return
        with conn.cursor() as cursor:
            cursor.execute(_TIME_ZONE_SQL)
            if worker:
                cursor.execute(_ISOLATION_SQL)
        self._prepared[conn] = worker

    def _cursor(self, conn: Any, *, reads_rows: bool = False) -> Any:
        # A plain tuple cursor whatever cursorclass the caller's connection was made with.
        return conn.cursor(pymysql.cursors.Cursor)

    def _db_time(self, value: datetime, *, scheduled: bool = False, what: str = "time") -> Any:
        # TIMESTAMP keeps whole seconds and the server rounds fractions, which can push a job due now
        # half a second into the future. Write whole seconds ourselves: down for times already passed
        # (the job is due at once), up for a scheduled time so a job never runs before it was asked to.
        utc = value.astimezone(UTC).replace(tzinfo=None)
        whole = utc.replace(microsecond=0)
        if scheduled and whole != utc and whole.year < 9999:  # the year test only avoids an overflow
            whole += timedelta(seconds=1)
        # Checked here because the server would refuse it in strict mode, after the caller's transaction
        # has spent a statement, and without strict mode store 0000-00-00, which makes the job due at once.
        if not TIMESTAMP_MIN <= whole <= TIMESTAMP_MAX:
            raise ConfigurationError(
                f"{what} {value.isoformat()} is outside what MySQL's TIMESTAMP column can hold "
                f"({TIMESTAMP_MIN} to {TIMESTAMP_MAX} UTC); nothing was written"
            )
        return whole

    def _from_db_time(self, value: Any) -> datetime:
        if isinstance(value, str):
            # PyMySQL gives the text of a date it cannot parse: 0000-00-00 00:00:00, which a session
            # without strict mode stores for an invalid time. It sorts before every time, so the job is
            # due; reading it as the earliest datetime lets it run instead of failing every claim.
            return datetime.min.replace(tzinfo=UTC)
        stored: datetime = value
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
