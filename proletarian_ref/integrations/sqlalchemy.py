"""SQLAlchemy 2: jobs in a Session or Connection transaction, a worker on an Engine (docs/sqlalchemy.md)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from proletarian_ref._async.job_tx import current_job as async_current_job
from proletarian_ref._sync.job_tx import current_job
from proletarian_ref.errors import ConfigurationError

__all__ = [
    "async_data_source",
    "async_driver_connection",
    "async_job_session",
    "data_source",
    "driver_connection",
    "job_session",
]


def driver_connection(obj: Any) -> Any:
    """The driver connection in whose transaction a job enqueued on `obj` (a Session or Connection) commits.

    Nothing is flushed and nothing committed: a Session or Connection in a transaction is left exactly as
    it was; one that has none begins it, as its own first statement would (its autobegin), so the job
    commits and rolls back with what the application does next.
    """
    if isinstance(obj, Session):
        # Session.connection() joins (or autobegins) the session's transaction and never autoflushes.
        return _driver_of(obj.connection())
    if isinstance(obj, Connection):
        if not obj.in_transaction():
            obj.begin()
        return _driver_of(obj)
    if isinstance(obj, AsyncSession | AsyncConnection):
        raise ConfigurationError(
            f"a SQLAlchemy {type(obj).__name__} enqueues with proletarian_ref.aio (await aio.enqueue(...))"
        )
    raise ConfigurationError(
        f"proletarian_ref enqueues on a SQLAlchemy Session or Connection, got {type(obj).__name__}"
    )


async def async_driver_connection(obj: Any) -> Any:
    """driver_connection for proletarian_ref.aio: an AsyncSession's or AsyncConnection's driver connection."""
    if isinstance(obj, AsyncSession):
        obj = await obj.connection()
    if isinstance(obj, AsyncConnection):
        if not obj.in_transaction():
            await obj.begin()
        return (await obj.get_raw_connection()).driver_connection
    if isinstance(obj, Session | Connection):
        raise ConfigurationError(
            f"a SQLAlchemy {type(obj).__name__} enqueues with proletarian_ref.enqueue, "
            "not proletarian_ref.aio"
        )
    raise ConfigurationError(
        "proletarian_ref.aio enqueues on a SQLAlchemy AsyncSession or AsyncConnection, "
        f"got {type(obj).__name__}"
    )


def _driver_of(conn: Connection) -> Any:
    return conn.connection.driver_connection


def data_source(engine: Any) -> Callable[[], Any]:
    """A threaded worker's connection factory on `engine`: its URL, connect_args, creator and connect events.

    Each connection is checked out of the engine's pool and detached from it, as a worker thread keeps
    its connection for its whole life and closes it itself: it never holds a slot of the pool's size.
    """
    if isinstance(engine, AsyncEngine):
        raise ConfigurationError(
            "a SQLAlchemy AsyncEngine feeds proletarian_ref.aio's create_queue_worker; the threaded worker "
            "takes a (sync) Engine"
        )
    if not isinstance(engine, Engine):
        raise ConfigurationError(
            f"a worker's SQLAlchemy data source is an Engine, got {type(engine).__name__}"
        )

    def connect() -> Any:
        pooled = engine.raw_connection()
        driver = pooled.driver_connection  # read first: a detached connection no longer names it
        pooled.detach()
        return driver

    return connect


def async_data_source(engine: Any) -> Callable[[], Awaitable[Any]]:
    """data_source for proletarian_ref.aio's worker: an AsyncEngine's driver connections (AsyncConnection)."""
    if not isinstance(engine, AsyncEngine):
        raise ConfigurationError(
            f"proletarian_ref.aio's worker takes a SQLAlchemy AsyncEngine, got {type(engine).__name__}: "
            "a sync Engine feeds proletarian_ref's threaded create_queue_worker"
        )

    async def connect() -> Any:
        pooled = await engine.raw_connection()
        driver = pooled.driver_connection  # read first: a detached connection no longer names it
        pooled.detach()
        return driver

    return connect


class _JobConnection:
    """The guarded job connection as SQLAlchemy's pool holds it: `close` (an invalidated pooled
    connection's) lets go of it without touching the transaction; commit and rollback stay refused."""

    __slots__ = ("_guarded",)

    def __init__(self, guarded: Any) -> None:
        self._guarded = guarded

    def __getattr__(self, name: str) -> Any:
        return getattr(self._guarded, name)

    @property
    def autocommit(self) -> bool:
        # What SQLAlchemy reads at checkout; the job's transaction is never in autocommit.
        return False

    def close(self) -> None:
        return None


class _AsyncJobConnection(_JobConnection):
    """_JobConnection for the asyncio adaptation of a psycopg AsyncConnection, whose close is awaited."""

    __slots__ = ()

    async def close(self) -> None:  # type: ignore[override]
        return None


class _AiomysqlJobConnection(_JobConnection):
    """_JobConnection for the asyncio adaptation of an aiomysql Connection: its graceful close is
    ensure_closed (awaited), its forced close a plain close(); neither touches the job's transaction."""

    __slots__ = ()

    async def ensure_closed(self) -> None:
        return None


@contextmanager
def job_session(engine: Engine, **session_options: Any) -> Iterator[Session]:
    """A Session on the running job's own transaction, for a handler on the threaded worker.

    What the handler adds and flushes commits in the same commit as the job's archive row, and rolls
    back when the job fails or is retried (proletarian_ref.current_job). `engine` is the application's
    Engine of that database: its dialect, already set up, is reused, and no connection of its pool is
    taken once it has connected. The session joins the job's transaction with a savepoint of its own,
    so session.commit() and session.rollback() act on that savepoint; the block commits it at its end
    (an error leaving the block rolls it back). A commit() or rollback() of the job's transaction itself
    (session.connection().commit()) raises JobTransactionError.
    """
    if not isinstance(engine, Engine):
        raise ConfigurationError(f"job_session takes a SQLAlchemy Engine, got {type(engine).__name__}")
    held = _JobConnection(current_job().connection())
    if getattr(engine.dialect, "server_version_info", None) is None:
        with engine.connect():  # sets the dialect up (server version and the like) on the engine's own pool
            pass
    pool = StaticPool(lambda: held, reset_on_return=None, dialect=engine.dialect)
    on_job = Engine(pool, engine.dialect, engine.url)
    connection = on_job.connect()
    # Begun first, so the Session joins it (a savepoint) instead of committing it.
    connection.begin()
    session = Session(bind=connection, join_transaction_mode="create_savepoint", **session_options)
    try:
        yield session
        # Commits the session's savepoint only: the job's transaction commits with its archive row.
        session.commit()
    finally:
        session.close()
        # Let go of the driver connection with no ROLLBACK: the job's transaction is the worker's.
        connection.invalidate()
        connection.close()


@asynccontextmanager
async def async_job_session(engine: AsyncEngine, **session_options: Any) -> AsyncIterator[AsyncSession]:
    """job_session for the asyncio worker: an AsyncSession on the running job's own transaction.

    `engine` is the application's AsyncEngine of that database (postgresql+psycopg, mysql+aiomysql); the
    same promises as job_session: the session's savepoint commits at the end of the block, the job's
    transaction with its archive row.
    """
    if not isinstance(engine, AsyncEngine):
        raise ConfigurationError(
            f"async_job_session takes a SQLAlchemy AsyncEngine, got {type(engine).__name__}"
        )
    dialect = engine.sync_engine.dialect
    wrap = _AiomysqlJobConnection if dialect.driver == "aiomysql" else _AsyncJobConnection
    held = wrap(await async_current_job().connection())
    if getattr(dialect, "server_version_info", None) is None:
        async with engine.connect():  # sets the dialect up on the engine's own pool
            pass

    async def give(*args: Any, **kwargs: Any) -> Any:
        return held

    def adapted() -> Any:
        # The dialect's own adaptation of an asyncio driver connection, run inside SQLAlchemy's greenlet.
        return dialect.loaded_dbapi.connect(async_creator_fn=give)

    pool = StaticPool(adapted, reset_on_return=None, dialect=dialect)
    on_job = AsyncEngine(Engine(pool, dialect, engine.sync_engine.url))
    connection = await on_job.connect()
    await connection.begin()
    session = AsyncSession(bind=connection, join_transaction_mode="create_savepoint", **session_options)
    try:
        yield session
        await session.commit()
    finally:
        await session.close()
        await connection.invalidate()
        await connection.close()
