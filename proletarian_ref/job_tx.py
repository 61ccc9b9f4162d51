"""The handler's side of the job's transaction: which job runs now, and a guarded view of its connection."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Final

from proletarian_ref.errors import JobTransactionError

__all__ = ["CURRENT", "GuardedConnection", "connection_is_lost", "transaction_is_open"]

# The JobTransaction (_async or _sync) of the handler running in this thread or task, else None. A
# contextvar, not a thread-local: each asyncio task sees its own, and a thread sees only what it set.
CURRENT: ContextVar[Any] = ContextVar("proletarian_ref.current_job", default=None)

# Methods and attributes that would end or change the worker's transaction behind its back. `begin` too:
# on MySQL a BEGIN commits the open transaction; `ping` may reconnect (PyMySQL) into a new session.
_REFUSED: Final = frozenset(
    {
        "begin",
        "close",
        "commit",
        "rollback",
        "autocommit",
        "set_autocommit",
        "set_isolation_level",
        "set_read_only",
        "set_deferrable",
        "ping",
        "select_db",
        "tpc_begin",
        "tpc_commit",
        "tpc_prepare",
        "tpc_rollback",
        "xid",
    }
)

# libpq's PQtransactionStatus: 0 idle (no transaction), 1 active, 2 in transaction, 3 in a failed one,
# 4 unknown (the connection is bad). Read as ints so the core imports no driver.
_PG_OPEN: Final = frozenset({1, 2, 3})
# MySQL's SERVER_STATUS_IN_TRANS bit of the status every OK and EOF packet carries (PyMySQL server_status).
_MYSQL_IN_TRANS: Final = 1


class GuardedConnection:
    """The job's driver connection as a handler gets it: everything but ending or reconfiguring the
    transaction is the driver's own (cursor, execute, ...); those raise JobTransactionError, and so does
    every use once the handler has returned."""

    __slots__ = ("_conn", "_live")

    def __init__(self, conn: Any) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_live", True)

    def __getattr__(self, name: str) -> Any:
        self._check(name)
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._check(name)
        setattr(self._conn, name, value)

    def __enter__(self) -> Any:
        # psycopg's `with conn:` commits and closes at the end of the block.
        raise JobTransactionError(
            "the job's connection is not a context manager here: its transaction is the worker's, "
            "committed with the job's archive row"
        )

    async def __aenter__(self) -> Any:
        return self.__enter__()

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        state = "" if self._live else ", handler returned"
        return f"<GuardedConnection of {self._conn!r}{state}>"

    def _check(self, name: str) -> None:
        if not self._live:
            raise JobTransactionError(
                f"the job's connection was used ({name}) after its handler returned: it belongs to the "
                "worker again"
            )
        if name in _REFUSED:
            raise JobTransactionError(
                f"a handler may not call {name} on the job's connection: the transaction is the worker's, "
                "and commits with the job's archive row (or rolls back with its retry or failure); "
                "raise to fail the job instead"
            )

    def end(self) -> None:
        """The handler returned: every later use raises."""
        object.__setattr__(self, "_live", False)


def transaction_is_open(conn: Any) -> bool | None:
    """Whether `conn` still has a transaction open, from what the driver last heard (no round trip).

    None when the driver does not say (mysqlclient, or a backend's connection this module does not know):
    the savepoint release after the handler still finds a transaction ended behind the guard.
    """
    info = getattr(conn, "info", None)
    status = getattr(info, "transaction_status", None)
    if status is not None:  # psycopg 3, sync or async
        return not getattr(conn, "closed", False) and int(status) in _PG_OPEN
    server_status = getattr(conn, "server_status", None)
    if isinstance(server_status, int):  # PyMySQL, aiomysql
        return _mysql_open(conn) and bool(server_status & _MYSQL_IN_TRANS)
    return None


def connection_is_lost(conn: Any) -> bool | None:
    """Whether the driver has found `conn` closed or broken (a killed session, after a failed statement);
    None when the driver does not say."""
    # psycopg 3: closed or BAD. Not mysqlclient, whose `info` is a method and whose `closed` stays false
    # when the server ends the session.
    if hasattr(getattr(conn, "info", None), "transaction_status") and hasattr(conn, "closed"):
        return bool(conn.closed)
    if isinstance(getattr(conn, "server_status", None), int):  # PyMySQL drops its socket when lost
        return not _mysql_open(conn)
    return None


def _mysql_open(conn: Any) -> bool:
    """Whether a PyMySQL (`open`) or aiomysql (`closed`, which closes its socket when lost) connection is
    still connected."""
    is_open = getattr(conn, "open", None)
    if is_open is not None:
        return bool(is_open)
    return not getattr(conn, "closed", False)
