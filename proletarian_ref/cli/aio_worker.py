"""`proletarian-ref worker` with a coroutine handler: the asyncio worker, under the threaded one's rules."""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final, TypeGuard

from proletarian_ref import aio
from proletarian_ref.backends.dsn import asyncpg_connect_args, dialect_of_dsn, postgresql_connect_args
from proletarian_ref.cli import worker
from proletarian_ref.cli.database import (
    CONNECT_TIMEOUT_S,
    Database,
    cannot_connect,
    given_dsn,
    open_database,
    refuse_pipeline,
    tables_from,
)
from proletarian_ref.cli.errors import CliError, ExitCode, UsageError
from proletarian_ref.cli.logs import notice
from proletarian_ref.cli.periodic import running_scheduler
from proletarian_ref.errors import ConfigurationError, ShutdownTimeoutError

# How long to wait for a worker that stops itself (after a polling error) beyond its own shutdown timeout.
_SELF_STOP_MARGIN_S: Final = 5.0


def add_parser(subparsers: Any) -> None:
    """The worker command's parser (cli.worker's options), run by `run` here, which picks the worker."""
    worker.add_parser(subparsers).set_defaults(run=run)


def is_coroutine_handler(handler: object) -> TypeGuard[Callable[..., Awaitable[object]]]:
    """Whether `handler` is an `async def` function (or an object whose __call__ is one)."""
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object whose __call__ is async counts
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def run(args: argparse.Namespace) -> int:
    """The worker command: the asyncio worker for a coroutine handler, else the threaded one."""
    handler = worker.load_handler(args.handler)
    if not is_coroutine_handler(handler):
        check_async_driver(args, coroutine=False)
        return worker.run(args, handler)
    check_async_driver(args, coroutine=True)
    if args.pipeline and args.async_driver == "asyncpg":
        raise UsageError(
            "--pipeline is psycopg's pipeline mode, and asyncpg has none for a job's different statements: "
            "leave --async-driver asyncpg out (the asyncio worker runs psycopg), or --pipeline"
        )
    retry_fn = worker.retry_strategy_fn(args.retries, args.delays)
    queues = worker.queues_of(args.queue)
    tables = tables_from(args)
    if args.processes > 1:
        return worker.run_several(args)
    with open_database(args, tables) as db, worker.metrics_server(args, db) as metrics:
        if args.pipeline:
            refuse_pipeline(db)
            source: Any = _PipelinedConnections(db)
        else:
            source = async_data_source(db, args.threads * len(queues), args.async_driver)
        stop = threading.Event()  # the scheduler thread's
        with running_scheduler(args.schedules, db, stop):
            try:
                run_loop(args.loop, _serve(args, db, handler, source, retry_fn, queues, metrics, stop))
            finally:
                stop.set()
        notice("worker stopped")
    return ExitCode.OK


# -- the data source per dialect and driver ------------------------------------------------------------


def run_loop(loop: str, main: Coroutine[Any, Any, None]) -> None:
    """`main` to the end on `loop` (--loop): asyncio's own event loop, or uvloop's."""
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def check_async_driver(args: argparse.Namespace, *, coroutine: bool) -> None:
    """Refuse an --async-driver or --loop the command cannot honour, before anything connects (or starts
    children).

    psycopg with a plain handler is what the threaded worker runs anyway; asyncpg has no threaded worker,
    and a plain handler no event loop.
    """
    if args.loop != "asyncio":
        if not coroutine:
            raise UsageError(
                f"--loop {args.loop} is the asyncio worker's event loop, and --handler {args.handler} is a "
                "plain function, which runs on the threaded worker: make it a coroutine function, or leave "
                "--loop out"
            )
        try:
            import uvloop  # noqa: F401 - only whether it is installed
        except ImportError as exc:
            raise CliError(
                f"--loop uvloop needs uvloop: pip install 'proletarian-ref[uvloop]' ({exc})"
            ) from exc
    driver = args.async_driver
    if driver is None:
        return
    if not coroutine:
        if driver == "asyncpg":
            raise UsageError(
                f"--async-driver asyncpg runs a coroutine handler (async def) on the asyncio worker, and "
                f"--handler {args.handler} is a plain function, which runs on the threaded worker "
                "(psycopg): make it a coroutine function, or leave --async-driver out"
            )
        return
    dsn, source = given_dsn(args)
    with suppress(ConfigurationError):  # a DSN of no known database: open_database says so
        if dsn is not None and dialect_of_dsn(dsn) == "mysql":
            raise UsageError(
                f"--async-driver {driver} is a PostgreSQL driver, and the DSN (from {source}) is MySQL's: "
                "the asyncio worker on MySQL runs aiomysql; leave --async-driver out"
            )
    if driver == "asyncpg":
        try:
            import asyncpg  # noqa: F401 - only whether it is installed
        except ImportError as exc:
            raise CliError(
                f"--async-driver asyncpg needs asyncpg: pip install 'proletarian-ref[asyncpg]' ({exc})"
            ) from exc


def _postgresql(db: Database, size: int) -> Any:
    from psycopg_pool import AsyncConnectionPool

    conninfo, options = postgresql_connect_args(db.dsn)
    return AsyncConnectionPool(
        conninfo,
        kwargs={**options, "connect_timeout": CONNECT_TIMEOUT_S},
        min_size=size,
        max_size=size,
        open=False,
    )


class _AsyncpgPool:
    """An asyncpg.Pool of `size` connections to a postgresql:// DSN, made when entered (on the running
    loop, as asyncpg's pools must be); `listen_factory` opens the wake-up listener's own connection, so
    that it does not hold one of the pool's."""

    def __init__(self, db: Database, size: int) -> None:
        # Checked now, so a DSN asyncpg cannot take is a usage error before anything runs.
        url, kwargs = asyncpg_connect_args(db.dsn)
        kwargs.setdefault("timeout", CONNECT_TIMEOUT_S)
        self._db = db
        self._url = url
        self._kwargs = kwargs
        self._size = size
        self._pool: Any = None

    def listen_factory(self) -> Any:
        import asyncpg

        return functools.partial(asyncpg.connect, self._url, **self._kwargs)

    async def __aenter__(self) -> Any:
        import asyncpg

        try:
            self._pool = await asyncpg.create_pool(
                self._url, min_size=self._size, max_size=self._size, **self._kwargs
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise cannot_connect(self._db, exc) from exc
        return self._pool

    async def __aexit__(self, *exc: object) -> None:
        await self._pool.close()


class _PipelinedConnections:
    """--pipeline's data source: psycopg AsyncConnections the backend opens itself, one a polling task, and
    keeps in pipeline mode (a pool's connections it never puts in it); entered as the pools are."""

    def __init__(self, db: Database) -> None:
        import psycopg

        conninfo, options = postgresql_connect_args(db.dsn)
        options = {**options, "connect_timeout": CONNECT_TIMEOUT_S}
        self.connect = functools.partial(psycopg.AsyncConnection.connect, conninfo, **options)

    async def __aenter__(self) -> Any:
        return self.connect

    async def __aexit__(self, *exc: object) -> None:
        return None


def _asyncpg(db: Database, size: int) -> Any:
    return _AsyncpgPool(db, size)


def _mysql(db: Database, size: int) -> Any:
    return _AiomysqlPool(db.dsn, size)


class _AiomysqlPool:
    """An aiomysql.Pool of `size` connections to a mysql:// DSN, made when entered: aiomysql makes its
    pools on the running loop only, which the command starts after picking the data source."""

    def __init__(self, dsn: str, size: int) -> None:
        from proletarian_ref.backends.mysql_async import aiomysql_connect_kwargs

        # Checked now, so a DSN the asyncio backend cannot take is a usage error before anything runs.
        self._kwargs = {"connect_timeout": CONNECT_TIMEOUT_S, **aiomysql_connect_kwargs(dsn)}
        self._size = size
        self._pool: Any = None

    async def __aenter__(self) -> Any:
        import aiomysql

        self._pool = await aiomysql.create_pool(minsize=self._size, maxsize=self._size, **self._kwargs)
        return self._pool

    async def __aexit__(self, *exc: object) -> None:
        self._pool.close()
        await self._pool.wait_closed()


# One small function per dialect and driver (--async-driver): an unopened asyncio data source of `size`
# connections for the workers.
ASYNC_DATA_SOURCES: Final[dict[tuple[str, str], Callable[[Database, int], Any]]] = {
    ("postgresql", "psycopg"): _postgresql,
    ("postgresql", "asyncpg"): _asyncpg,
    ("mysql", "aiomysql"): _mysql,
}
# The driver of each dialect when --async-driver is not given.
DEFAULT_ASYNC_DRIVERS: Final = {"postgresql": "psycopg", "mysql": "aiomysql"}


def async_data_source(db: Database, size: int, driver: str | None = None) -> Any:
    """The asyncio workers' data source on `db` (an AsyncConnectionPool or an asyncpg.Pool on PostgreSQL,
    an aiomysql.Pool on MySQL), an async context manager entered by _serve, which gives the open pool."""
    chosen = driver if driver is not None else DEFAULT_ASYNC_DRIVERS.get(db.dialect, "")
    make = ASYNC_DATA_SOURCES.get((db.dialect, chosen))
    if make is None:
        raise UsageError(f"a coroutine handler has no asyncio worker on {db.dialect} with {chosen}")
    return make(db, size)


# -- running -------------------------------------------------------------------------------------------


class AsyncWorkerRun(worker.StopRules[asyncio.Event]):
    """An asyncio queue worker under the CLI's stop rules: a signal, or an error that stops it itself."""

    def __init__(self, stop_requested: asyncio.Event) -> None:
        super().__init__(stop_requested, asyncio.Event())

    async def finish(self, queue_worker: aio.AsyncQueueWorker, db: Database, await_timeout_ms: float) -> None:
        """Stop the worker (or wait for it to stop itself) and raise what made it stop on its own."""
        if self.error is None:
            try:
                await queue_worker.stop()
            except ShutdownTimeoutError as exc:
                raise worker.released_error(exc) from exc
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(self.shut_down.wait(), await_timeout_ms / 1000 + _SELF_STOP_MARGIN_S)
        raise worker.stopped_on_error(self.error, db) from self.error


@contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set `stop`; a second one raises KeyboardInterrupt out of the loop to give up waiting.

    The handlers are the running loop's (loop.add_signal_handler), so they run as loop callbacks, never
    inside a task; the signals' previous handlers come back when the block ends.
    """
    loop = asyncio.get_running_loop()

    def request_stop(signum: signal.Signals) -> None:
        if stop.is_set():
            # BaseException: a loop callback's KeyboardInterrupt leaves run_until_complete (asyncio.run
            # then cancels the tasks, whose transactions roll back), as the threaded command's does.
            raise KeyboardInterrupt
        notice(f"{signum.name}: stopping (send it again to exit at once)")
        stop.set()

    previous = {signum: signal.getsignal(signum) for signum in worker.STOP_SIGNALS}
    for signum in worker.STOP_SIGNALS:
        loop.add_signal_handler(signum, request_stop, signum)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)


async def _serve(
    args: argparse.Namespace,
    db: Database,
    handler: Callable[..., Awaitable[object]],
    source: Any,
    retry_fn: Any,
    queues: list[str],
    metrics: Any,
    scheduler_stop: threading.Event,
) -> None:
    stop = asyncio.Event()
    async with source as pool:
        plans = {"compact": args.compact, "chain": args.chain, "pipeline": args.pipeline}
        backend = _plan_backend(db, pool, args.async_driver, **plans) if any(plans.values()) else None
        listen = source.listen_factory() if isinstance(source, _AsyncpgPool) and args.wake_on_notify else None
        runs: list[tuple[AsyncWorkerRun, aio.AsyncQueueWorker]] = []
        for queue in queues:
            run_state = AsyncWorkerRun(stop)
            queue_worker = aio.create_queue_worker(
                pool,
                handler,
                job_table=db.tables.job,
                archived_job_table=db.tables.archived,
                on_polling_error=run_state.on_polling_error,
                on_shutdown=run_state.on_shutdown,
                **worker.queue_worker_options(args, queue, retry_fn, metrics, backend),
                **({} if listen is None else {"listen_data_source": listen}),
            )
            runs.append((run_state, queue_worker))
        with stop_on_signals(stop):
            for _, queue_worker in runs:
                await queue_worker.start()
            # The loop that runs, read off it rather than --loop: the line tells what ran.
            on_uvloop = type(asyncio.get_running_loop()).__module__.startswith("uvloop")
            loop_named = ", on uvloop's event loop" if on_uvloop else ""
            notice(f"asyncio worker on {driver_of(source)}{loop_named}")
            notice(worker.running_notice(args, queues, db, "asyncio task"))
            await stop.wait()
            scheduler_stop.set()
            # Every queue worker drains at once; the first error any of them had is the command's.
            results = await asyncio.gather(
                *(run_state.finish(w, db, args.shutdown_timeout_ms) for run_state, w in runs),
                return_exceptions=True,
            )
        if backend is not None:
            await backend.close()
    for result in results:
        if isinstance(result, BaseException):
            raise result


def driver_of(source: Any) -> str:
    """The driver of the data source the workers run on, as --async-driver names it (aiomysql on MySQL),
    and whether its connections are pipelined."""
    if isinstance(source, _PipelinedConnections):
        return "psycopg in pipeline mode"
    return {
        _AsyncpgPool: "asyncpg",
        _AiomysqlPool: "aiomysql",
    }.get(type(source), "psycopg")


def _plan_backend(
    db: Database, pool: Any, driver: str | None, *, compact: bool, chain: bool, pipeline: bool
) -> Any:
    """The backend for --compact, --chain and/or --pipeline on `pool`: its dialect's (and driver's) asyncio
    backend on those plans (pipelining on PostgreSQL only)."""
    if driver == "asyncpg":
        from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend

        return AsyncpgBackend(pool, compact=compact, chain=chain)
    if db.dialect == "mysql":
        from proletarian_ref.backends.mysql_async import AsyncMySQLBackend

        # The compact plan always, as the threaded worker's on MySQL (database.plan_backend).
        return AsyncMySQLBackend(pool, compact=True, chain=chain)
    from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

    return AsyncPostgresBackend(pool, compact=compact, chain=chain, pipeline=pipeline)
