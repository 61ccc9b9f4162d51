"""Connection factories from DSNs: postgresql://... for psycopg, mysql://... for PyMySQL."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from proletarian_ref.errors import ConfigurationError

_PG_SCHEMES = ("postgresql", "postgres")
_MYSQL_SCHEMES = ("mysql", "mysql+pymysql", "mariadb")
PREPARE_THRESHOLD: Final = "prepare_threshold"


def dialect_of_dsn(dsn: str) -> str:
    scheme = urlsplit(dsn).scheme.lower()
    if scheme in _PG_SCHEMES:
        return "postgresql"
    if scheme in _MYSQL_SCHEMES:
        return "mysql"
    raise ConfigurationError(
        f"cannot tell the database of DSN {redact(dsn)!r}: it must start with postgresql:// or mysql://"
    )


def redact(dsn: str) -> str:
    """The DSN with its password hidden, for error messages and logs."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def mysql_connect_kwargs(dsn: str) -> dict[str, Any]:
    """PyMySQL keyword arguments for mysql://user:password@host:port/database?option=value."""
    parts = urlsplit(dsn)
    kwargs: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username) if parts.username else "root",
        "password": unquote(parts.password) if parts.password else "",
        "charset": "utf8mb4",
    }
    database = parts.path.lstrip("/")
    if database:
        kwargs["database"] = unquote(database)
    for key, value in parse_qsl(parts.query):
        if key == "unix_socket":
            kwargs["unix_socket"] = value
        elif key in ("connect_timeout", "read_timeout", "write_timeout"):
            kwargs[key] = int(value)
        else:
            raise ConfigurationError(f"unsupported MySQL DSN option {key!r} in {redact(dsn)!r}")
    return kwargs


def postgresql_connect_args(dsn: str) -> tuple[str, dict[str, Any]]:
    """The conninfo for libpq and psycopg's own keyword arguments, from a postgresql:// DSN.

    `prepare_threshold` is psycopg's, not libpq's (which refuses options it does not know), so it is
    taken out of the query: `?prepare_threshold=none` turns off psycopg's automatic prepared statements,
    which PgBouncer before 1.21 cannot carry in transaction mode (docs/scaling.md).
    """
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kwargs: dict[str, Any] = {}
    kept = []
    for key, value in query:
        if key != PREPARE_THRESHOLD:
            kept.append((key, value))
        elif value.lower() == "none":
            kwargs[PREPARE_THRESHOLD] = None
        elif value.isdigit():
            kwargs[PREPARE_THRESHOLD] = int(value)
        else:
            raise ConfigurationError(
                f"{PREPARE_THRESHOLD} must be none or a whole number >= 0, got {value!r} in {redact(dsn)!r}"
            )
    if len(kept) == len(query):
        return dsn, kwargs
    return parts._replace(query=urlencode(kept)).geturl(), kwargs


def connection_factory(dsn: str, **overrides: Any) -> Callable[[], Any]:
    """A zero-argument callable opening a new connection to `dsn` (a data source for a queue worker)."""
    dialect = dialect_of_dsn(dsn)
    if dialect == "postgresql":
        import psycopg

        conninfo, options = postgresql_connect_args(dsn)
        options.update(overrides)

        def connect_postgresql() -> Any:
            return psycopg.connect(conninfo, **options)

        return connect_postgresql

    import pymysql

    kwargs = {**mysql_connect_kwargs(dsn), **overrides}

    def connect_mysql() -> Any:
        return pymysql.connect(**kwargs)

    return connect_mysql


def failover_connection_factory(dsns: Sequence[str], **overrides: Any) -> Callable[[], Any]:
    """A connection factory that tries `dsns` in order on every call and returns the first that connects.

    For a cluster whose nodes all take writes but that you run with one writer (MariaDB Galera, see
    docs/scaling.md): give every worker and enqueuer the same order, and all of them write to the first
    node that is up, moving together to the next when it goes down. On PostgreSQL prefer libpq's own
    multi-host DSN with target_session_attrs=read-write. If no node connects, the last node's error is
    raised.
    """
    if not dsns:
        raise ConfigurationError("failover_connection_factory needs at least one DSN")
    factories = [connection_factory(dsn, **overrides) for dsn in dsns]

    def connect_first_reachable() -> Any:
        for factory in factories[:-1]:
            try:
                return factory()
            except Exception:  # This node is down: the next one is the point of the list.
                continue
        return factories[-1]()

    return connect_first_reachable
