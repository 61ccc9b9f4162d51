"""What differs between the MySQL drivers the MySQL backend runs on: PyMySQL and mysqlclient (MySQLdb).

Both are DB-API drivers with the same pyformat parameters, cursors, nextset() for multi-statement queries,
client_flag, autocommit(), get_autocommit(), open and thread_id(); what differs is named here, once: their
error classes, their plain cursor class, how a value is written into SQL text, and how the server's version
is read. A driver's classes are looked up among the imported modules: a connection, or an error, of a driver
means that driver is imported, so nothing here imports one (PyMySQL installed as MySQLdb is PyMySQL).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Final

# The top-level modules of the drivers' connection and error classes.
PYMYSQL: Final = "pymysql"
MYSQLCLIENT: Final = "MySQLdb"
DRIVER_MODULES: Final = (PYMYSQL, MYSQLCLIENT)
# CLIENT_MULTI_STATEMENTS, a protocol capability: the same bit in every driver's client_flag.
MULTI_STATEMENTS: Final = 1 << 16


def driver_of(obj: Any) -> str:
    """The top-level module of `obj`'s class: "pymysql", "MySQLdb", or another driver's ("psycopg",
    "sqlalchemy": backends/__init__.py tells every connection and data source by it)."""
    return type(obj).__module__.split(".", 1)[0]


def _drivers() -> list[Any]:
    """The drivers imported, each once (PyMySQL installed as MySQLdb is PyMySQL)."""
    found: list[Any] = []
    for name in DRIVER_MODULES:
        module = sys.modules.get(name)
        if module is not None and all(module is not other for other in found):
            found.append(module)
    return found


def error_classes() -> tuple[type[BaseException], ...]:
    """Every imported driver's base error class (MySQLError): what the backend translates."""
    return tuple(driver.MySQLError for driver in _drivers())


def interface_error_classes() -> tuple[type[BaseException], ...]:
    """Every imported driver's InterfaceError: a connection the driver found closed or unusable."""
    return tuple(driver.InterfaceError for driver in _drivers())


def is_driver_error(exc: BaseException) -> bool:
    return isinstance(exc, error_classes())


def multi_statements(conn: Any) -> bool:
    """Whether `conn` was opened to send several statements in one query (mysqlclient's are by default)."""
    return bool(getattr(conn, "client_flag", 0) & MULTI_STATEMENTS)


def plain_cursor(conn: Any) -> Any:
    """A cursor returning tuples on `conn`, whatever cursor class the connection was given by default."""
    module = sys.modules.get(f"{driver_of(conn)}.cursors")
    cursor_class = getattr(module, "Cursor", None)
    return conn.cursor(cursor_class) if cursor_class is not None else conn.cursor()


def quote(conn: Any) -> Callable[[Any], str]:
    """How `conn` writes one parameter value as SQL text, as its cursor binds it: PyMySQL's (and aiomysql's)
    escape(); on mysqlclient an id's bytes as a hex literal (its text must be valid in the connection's
    encoding, which arbitrary bytes are not) and any other value as its own literal()."""
    if driver_of(conn) != MYSQLCLIENT:
        escape: Callable[[Any], str] = conn.escape
        return escape
    literal = conn.literal
    encoding = conn.encoding

    def mysqlclient_quote(value: Any) -> str:
        if isinstance(value, bytes | bytearray):
            return f"X'{value.hex()}'"
        return str(literal(value).decode(encoding))

    return mysqlclient_quote


# SERVER_STATUS_IN_TRANS, the bit of the status every OK and EOF packet carries (PyMySQL's server_status).
_IN_TRANS: Final = 1


def transaction_open(conn: Any) -> bool | None:
    """Whether `conn` has a transaction open: PyMySQL's and aiomysql's server status from the last reply (no
    round trip); mysqlclient does not show that status, so on MariaDB its @@in_transaction is read (one
    round trip, which opens none); None where neither tells (mysqlclient on MySQL)."""
    status = getattr(conn, "server_status", None)
    if isinstance(status, int):
        return bool(status & _IN_TRANS)
    if driver_of(conn) == MYSQLCLIENT and is_mariadb(conn):
        cursor = plain_cursor(conn)
        try:
            cursor.execute("SELECT @@in_transaction")
            row = cursor.fetchone()
        finally:
            cursor.close()
        return bool(row and row[0])
    return None


def server_version(conn: Any) -> str:
    """The server's version text ("10.11.19-MariaDB-..." on MariaDB) as the driver heard it at connect."""
    known = getattr(conn, "server_version", None)  # PyMySQL, aiomysql
    if known is not None:
        return str(known)
    get_server_info = getattr(conn, "get_server_info", None)  # mysqlclient
    return str(get_server_info()) if callable(get_server_info) else ""


def is_mariadb(conn: Any) -> bool:
    return "MariaDB" in server_version(conn)
