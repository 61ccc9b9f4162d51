"""Finding the backend for a connection or data source, by the driver's type and without importing it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proletarian_ref.backend import Backend, is_async_backend
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.backends.mysql_driver import DRIVER_MODULES, driver_of
from proletarian_ref.errors import ConfigurationError

__all__ = [
    "SqlBackend",
    "backend_for_connection",
    "backend_for_data_source",
    "caller_connection",
    "dialect_of_connection",
    "refuse_async",
]


ASYNC_ADVICE = (
    "is an asyncio one: the threaded API takes the driver's blocking connections; await "
    "proletarian_ref.aio's enqueue, enqueue_many and create_queue_worker instead (docs/worker.md, asyncio)"
)


def refuse_async(obj: Any, what: str) -> None:
    """Refuse, naming it, an asyncio connection, pool or backend handed to the threaded API."""
    if type(obj).__name__.startswith("Async") or is_async_backend(obj):
        raise ConfigurationError(f"{what} {type(obj).__module__}.{type(obj).__qualname__} {ASYNC_ADVICE}")


def is_sqlalchemy(obj: Any) -> bool:
    """Whether `obj` is a SQLAlchemy Session, Connection or Engine (sync or async), not importing it."""
    return driver_of(obj) == "sqlalchemy"


def caller_connection(conn: Any) -> Any:
    """The driver connection enqueue writes on: `conn` itself, or the one under a SQLAlchemy Session or
    Connection, in its transaction (proletarian_ref.integrations.sqlalchemy)."""
    if driver_of(conn) == "sqlalchemy":
        from proletarian_ref.integrations.sqlalchemy import driver_connection

        return driver_connection(conn)
    return conn


async def acaller_connection(conn: Any) -> Any:
    """caller_connection for proletarian_ref.aio: `conn`, or the driver connection under a SQLAlchemy
    AsyncSession or AsyncConnection, in its transaction."""
    if driver_of(conn) == "sqlalchemy":
        from proletarian_ref.integrations.sqlalchemy import async_driver_connection

        return await async_driver_connection(conn)
    return conn


def abackend_for_connection(conn: Any) -> Any:
    """backend_for_connection for proletarian_ref.aio: the AsyncBackend that runs its enqueue on `conn`."""
    from proletarian_ref.aio import backend_for_connection as async_backend_for_connection

    return async_backend_for_connection(conn)


def dialect_of_connection(conn: Any) -> str:
    driver = driver_of(conn)
    if driver in ("psycopg", "psycopg_pool"):
        refuse_async(conn, "the connection")
        return "postgresql"
    if driver in DRIVER_MODULES:  # PyMySQL or mysqlclient
        return "mysql"
    raise ConfigurationError(
        f"cannot tell the database of a {type(conn).__module__}.{type(conn).__qualname__} connection; "
        "pass backend= (a PostgresBackend, MySQLBackend, MemoryBackend or your own Backend)"
    )


# One backend a dialect serves every enqueue: it has no data source, and it remembers which callers'
# connections it already prepared, so an enqueue costs one round trip, not two.
_ENQUEUE_BACKENDS: dict[str, Backend] = {}


def backend_for_connection(conn: Any) -> Backend:
    """The backend that runs enqueue on `conn`; a connection may name its own via proletarian_backend()."""
    own = getattr(conn, "proletarian_backend", None)
    if callable(own):
        return _checked(own())
    return backend_for_dialect(dialect_of_connection(conn))


def backend_for_dialect(dialect: str) -> Backend:
    """The one backend of `dialect` ("postgresql" or "mysql") that runs statements on callers' connections."""
    backend = _ENQUEUE_BACKENDS.get(dialect)
    if backend is None:
        backend = _ENQUEUE_BACKENDS.setdefault(dialect, _backend_class(dialect)(None))
    return backend


def backend_for_data_source(data_source: Any) -> Backend:
    """The backend for a worker: a psycopg_pool pool, a SQLAlchemy Engine, or a zero-argument callable
    returning connections.

    A callable is called once here to learn which driver it returns; that connection is kept for the
    first worker thread, not wasted.
    """
    refuse_async(data_source, "the data source")
    if isinstance(data_source, Backend):
        return data_source
    own = getattr(data_source, "proletarian_backend", None)
    if callable(own):
        return _checked(own())
    if driver_of(data_source) == "psycopg_pool":
        return _backend_class("postgresql")(data_source)
    if driver_of(data_source) == "sqlalchemy":
        from proletarian_ref.integrations.sqlalchemy import data_source as engine_connections

        data_source = engine_connections(data_source)
    if not callable(data_source):
        raise ConfigurationError(
            f"data_source must be a psycopg_pool.ConnectionPool, a SQLAlchemy Engine or a zero-argument "
            f"callable returning a DB-API connection, got {type(data_source).__name__}"
        )
    probe = data_source()
    try:
        dialect = dialect_of_connection(probe)
    except ConfigurationError:
        probe.close()
        raise
    return _backend_class(dialect)(data_source, first_connection=probe)


def _checked(backend: object) -> Backend:
    if not isinstance(backend, Backend):
        raise ConfigurationError(f"proletarian_backend() returned {backend!r}, which is not a Backend")
    return backend


def _backend_class(dialect: str) -> Callable[..., Backend]:
    if dialect == "postgresql":
        from proletarian_ref.backends.postgres import PostgresBackend

        return PostgresBackend
    from proletarian_ref.backends.mysql import MySQLBackend

    return MySQLBackend
