"""The suite's clauses on an asyncio backend: a blocking view of it, run on a private event loop thread.

The clauses are written against the threaded Backend and DB-API connections. `BlockingBackend` gives an
AsyncBackend that form: each awaited verb runs on one event loop thread of its own, the calling thread
waiting for it, and `BlockingConnection` does the same for the driver's async connection and cursors, so
the harness reads and the caller's transactions of the clauses go through the async driver too. A third
party proves its own AsyncBackend with the recipe of docs/conformance.md and `async_harness`:

    def harness_factory(job_table, archived_job_table):
        return async_harness("mine", dialect="postgresql", connect=my_async_connect,
                             backend_class=MyAsyncBackend, job_table=job_table,
                             archived_job_table=archived_job_table)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, Final, TypeVar

from conformance.harness import SqlHarness
from proletarian_ref.backend import AsyncBackend
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE

_T = TypeVar("_T")
PG_ENV: Final = "PROLETARIAN_TEST_PG_DSN"
DEFAULT_PG_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
MYSQL_ENV: Final = "PROLETARIAN_TEST_MYSQL_DSN"
DEFAULT_MYSQL_DSN: Final = "mysql://root@127.0.0.1:3306/test"


class EventLoopThread:
    """An event loop running on a daemon thread of its own; `run` waits for a coroutine from any other."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="proletarian-aio-bridge", daemon=True
        )
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a blocking call on the bridge's own event loop thread would wait for itself")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


_LOOPS: list[EventLoopThread] = []
_LOOP_LOCK = threading.Lock()


def bridge_loop() -> EventLoopThread:
    """The one loop thread of this process (started on first use): every bridged object shares it, as
    a driver's async connection belongs to the loop it was made on."""
    with _LOOP_LOCK:
        if not _LOOPS:
            _LOOPS.append(EventLoopThread())
        return _LOOPS[0]


class BlockingConnection:
    """A blocking view of an async driver object (connection, cursor): its coroutine methods run on the
    bridge loop and return their results, an async object among them viewed the same way."""

    __slots__ = ("_loop", "target")

    def __init__(self, target: Any, loop: EventLoopThread) -> None:
        self.target = target
        self._loop = loop

    def _view(self, value: Any) -> Any:
        if hasattr(value, "__aenter__") and not isinstance(value, BlockingConnection):
            return BlockingConnection(value, self._loop)
        return value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.target, name)
        if inspect.iscoroutinefunction(value):

            def blocking(*args: Any, **kwargs: Any) -> Any:
                return self._view(self._loop.run(value(*args, **kwargs)))

            return blocking
        if inspect.ismethod(value):
            # A plain method runs on the loop too, and what it returns is awaited there if it can be:
            # aiomysql's cursor() and fetchone() are not coroutine functions but return awaitables.
            def on_loop(*args: Any, **kwargs: Any) -> Any:
                return self._view(self._loop.run(_called(value, args, kwargs)))

            return on_loop
        return value

    def __enter__(self) -> BlockingConnection:
        self._loop.run(self.target.__aenter__())
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        return self._loop.run(self.target.__aexit__(*exc_info))


def _target(value: Any) -> Any:
    return value.target if isinstance(value, BlockingConnection) else value


class BlockingListener:
    """An AsyncListener as a Listener: waits on the bridge loop."""

    def __init__(self, listener: Any, loop: EventLoopThread) -> None:
        self._listener = listener
        self._loop = loop

    @property
    def confirmed(self) -> bool:
        return bool(getattr(self._listener, "confirmed", True))

    @property
    def session(self) -> Any:
        """The async listener's own session (its `session`), for kill_session: its connection is the
        loop's, so the harness cannot ask it for its session as it asks a threaded listener's."""
        return getattr(self._listener, "session", self._listener)

    def wait(self, timeout: float) -> bool:
        return bool(self._loop.run(_awaited(self._listener.wait(timeout))))

    def interrupt(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._listener.interrupt)

    def close(self) -> None:
        self._loop.run(_awaited(self._listener.close()))


async def _awaited(value: Awaitable[_T]) -> _T:
    return await value


async def _called(method: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    result = method(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


class BlockingBackend:
    """An AsyncBackend as a Backend: the threaded core, and the clauses, call it as they call any other.

    It has exactly the optional verbs the async backend has, each waiting for its awaited twin.
    """

    def __init__(self, backend: AsyncBackend, loop: EventLoopThread | None = None) -> None:
        self.backend = backend
        self._loop = loop if loop is not None else bridge_loop()

    @property
    def dialect(self) -> str:
        return self.backend.dialect

    @property
    def capabilities(self) -> Any:
        return self.backend.capabilities

    @contextlib.contextmanager
    def transaction(self) -> Iterator[BlockingConnection]:
        manager = self.backend.transaction()
        conn = self._loop.run(_awaited(manager.__aenter__()))
        try:
            yield BlockingConnection(conn, self._loop)
        except BaseException:
            if not self._loop.run(_awaited(manager.__aexit__(*sys.exc_info()))):
                raise
        else:
            self._loop.run(_awaited(manager.__aexit__(None, None, None)))

    @contextlib.contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        manager = self.backend.savepoint(_target(conn))  # type: ignore[attr-defined]
        self._loop.run(_awaited(manager.__aenter__()))
        try:
            yield
        except BaseException:
            if not self._loop.run(_awaited(manager.__aexit__(*sys.exc_info()))):
                raise
        else:
            self._loop.run(_awaited(manager.__aexit__(None, None, None)))

    def listen(self, job_table: Any, queue: str, data_source: Any = None) -> BlockingListener:
        listen = self.backend.listen  # type: ignore[attr-defined]
        return BlockingListener(self._loop.run(_awaited(listen(job_table, queue, data_source))), self._loop)

    def close(self) -> None:
        self._loop.run(_awaited(self.backend.close()))

    def __getattr__(self, name: str) -> Any:
        if name in ("savepoint", "listen"):
            raise AttributeError(name)  # defined above; only reached when the backend has none
        value = getattr(self.backend, name)
        if not inspect.iscoroutinefunction(value):
            return value

        # wraps: __wrapped__ lets a caller that must not run its own statements on an asyncio backend
        # (error_history.find_store) still see the coroutine function behind the blocking view.
        @functools.wraps(value)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(value(*map(_target, args), **kwargs))

        return blocking

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *dir(self.backend)})


def blocking_enqueue(conn: BlockingConnection, job_type: str, payload: Any, **options: Any) -> Any:
    """proletarian_ref.aio.enqueue on the async connection `conn` views, waited for on its loop; a
    BlockingBackend as `backend=` goes as the AsyncBackend it wraps."""
    from proletarian_ref import aio

    backend = options.get("backend")
    if isinstance(backend, BlockingBackend):
        options["backend"] = backend.backend
    return conn._loop.run(aio.enqueue(conn.target, job_type, payload, **options))


def blocking_backend_class(
    backend_class: Callable[[Callable[[], Awaitable[Any]]], AsyncBackend],
) -> Callable[[Callable[[], Any]], Any]:
    """What SqlHarness takes as `backend_class` (and with_backend, for a mutant): the harness's blocking
    connect in, `backend_class` over the async connections it makes, seen as a Backend, out."""

    def make_backend(harness_connect: Callable[[], Any]) -> Any:
        async def async_connect() -> Any:
            # The harness's own connect (a zoned one, say) blocks on this very loop: from another thread.
            return _target(await asyncio.to_thread(harness_connect))

        return BlockingBackend(backend_class(async_connect))

    return make_backend


def async_harness(
    name: str,
    *,
    dialect: str,
    connect: Callable[[], Awaitable[Any]],
    backend_class: Callable[[Callable[[], Awaitable[Any]]], AsyncBackend],
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """A SqlHarness whose backend is `backend_class(async_connect)` seen through BlockingBackend, and whose
    connections (the harness's reads and the clauses' callers) are `connect()`'s async ones, seen through
    BlockingConnection."""
    loop = bridge_loop()

    def blocking_connect() -> BlockingConnection:
        return BlockingConnection(loop.run(_awaited(connect())), loop)

    harness = SqlHarness(
        name,
        dialect=dialect,
        connect=blocking_connect,
        backend_class=blocking_backend_class(backend_class),
        job_table=job_table,
        archived_job_table=archived_job_table,
    )
    return harness


def postgresql_async(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """psycopg 3's AsyncConnection (AsyncPostgresBackend) at `dsn`, else $PROLETARIAN_TEST_PG_DSN."""
    import psycopg

    from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

    target = dsn or os.environ.get(PG_ENV) or DEFAULT_PG_DSN

    async def connect() -> Any:
        return await psycopg.AsyncConnection.connect(target)

    return async_harness(
        "postgresql-async",
        dialect="postgresql",
        connect=connect,
        backend_class=AsyncPostgresBackend,
        job_table=job_table,
        archived_job_table=archived_job_table,
    )


def postgresql_async_pipeline(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """postgresql_async on the pipelined statement plan (AsyncPostgresBackend(pipeline=True))."""
    from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

    harness = postgresql_async(dsn, job_table, archived_job_table)
    backend = functools.partial(AsyncPostgresBackend, pipeline=True)
    return harness.with_backend(blocking_backend_class(backend), "postgresql-async-pipeline")


def postgresql_async_chain(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """postgresql_async with chained claims on the compact plan, three round trips a job: a finished job's
    COMMIT goes with the next BEGIN (AsyncPostgresBackend(compact=True, chain=True))."""
    from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

    harness = postgresql_async(dsn, job_table, archived_job_table)
    backend = functools.partial(AsyncPostgresBackend, compact=True, chain=True)
    return harness.with_backend(blocking_backend_class(backend), "postgresql-async-chain")


def postgresql_async_pipeline_chain(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """postgresql_async with chained claims in pipeline mode, one round trip a job: a finished job's
    archive (its row count checked by the server), its COMMIT, the next BEGIN and the next claim go
    together (AsyncPostgresBackend(pipeline=True, compact=True, chain=True))."""
    from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

    harness = postgresql_async(dsn, job_table, archived_job_table)
    backend = functools.partial(AsyncPostgresBackend, pipeline=True, compact=True, chain=True)
    return harness.with_backend(blocking_backend_class(backend), "postgresql-async-pipeline-chain")


def postgresql_asyncpg(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """asyncpg's connections (AsyncpgBackend) at `dsn`, else $PROLETARIAN_TEST_PG_DSN; the harness reads
    and the clauses' callers go through asyncpg too, as AsyncpgSession's psycopg-shaped view of it."""
    import asyncpg

    from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend
    from proletarian_ref.backends.asyncpg_session import AsyncpgSession

    target = dsn or os.environ.get(PG_ENV) or DEFAULT_PG_DSN

    async def connect() -> Any:
        return AsyncpgSession(await asyncpg.connect(target))

    return async_harness(
        "postgresql-asyncpg",
        dialect="postgresql",
        connect=connect,
        backend_class=AsyncpgBackend,
        job_table=job_table,
        archived_job_table=archived_job_table,
    )


def mysql_async(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """aiomysql's Connection (AsyncMySQLBackend) at `dsn`, else $PROLETARIAN_TEST_MYSQL_DSN."""
    from proletarian_ref.backends.mysql_async import AsyncMySQLBackend, aiomysql_connection_factory

    connect = aiomysql_connection_factory(dsn or os.environ.get(MYSQL_ENV) or DEFAULT_MYSQL_DSN)
    return async_harness(
        "mysql-async",
        dialect="mysql",
        connect=connect,
        backend_class=AsyncMySQLBackend,
        job_table=job_table,
        archived_job_table=archived_job_table,
    )


def mysql_async_compact(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """The same, its backend on the compact plan (AsyncMySQLBackend(compact=True))."""
    from proletarian_ref.backends.mysql_async import AsyncMySQLBackend

    harness = mysql_async(dsn, job_table, archived_job_table)
    return harness.with_backend(
        blocking_backend_class(functools.partial(AsyncMySQLBackend, compact=True)), "mysql-async-compact"
    )


def mysql_async_chain(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """mysql_async with chained claims on the compact plan, one round trip a job: a finished job's archive
    and delete, each count checked by the server, its COMMIT and the next claim as one query
    (AsyncMySQLBackend(compact=True, chain=True))."""
    from proletarian_ref.backends.mysql_async import AsyncMySQLBackend

    harness = mysql_async(dsn, job_table, archived_job_table)
    backend = functools.partial(AsyncMySQLBackend, compact=True, chain=True)
    return harness.with_backend(blocking_backend_class(backend), "mysql-async-chain")
