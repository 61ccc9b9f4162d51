"""The asyncio twin of the public API: enqueue, enqueue_many and a queue worker of tasks (docs/worker.md)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from proletarian_ref import aio_shutdown_hook
from proletarian_ref import log as ev
from proletarian_ref._acompat import AsyncHandlerFn
from proletarian_ref._async.enqueue import enqueue, enqueue_many
from proletarian_ref._async.job_run import run_next_batch, run_next_job
from proletarian_ref._async.job_timeout import AsyncJobTimeout
from proletarian_ref._async.job_tx import JobTransaction, current_job
from proletarian_ref._async.lifecycle import AsyncLifecycle
from proletarian_ref.backend import AsyncBackend, AsyncListener, Backend, is_async_backend
from proletarian_ref.backends import is_sqlalchemy
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.interrupts import bind_task_check, unbind_task_check
from proletarian_ref.log import LogFn, stdlib_logger
from proletarian_ref.watchdog import AsyncWatchdog
from proletarian_ref.worker import WORKER_OPTION_DEFAULTS, check_worker_options, worker_arguments
from proletarian_ref.worker_settings import job_settings

__all__ = [
    "AsyncQueueWorker",
    "JobTransaction",
    "create_queue_worker",
    "current_job",
    "enqueue",
    "enqueue_many",
    "process_next_job",
]


def backend_for_connection(conn: Any) -> AsyncBackend:
    """The asyncio backend that runs enqueue on `conn`: psycopg's AsyncConnection, asyncpg's connections,
    aiomysql's Connection."""
    own = getattr(conn, "proletarian_backend", None)
    if callable(own):
        return _checked(own())
    if type(conn).__module__.split(".", 1)[0] == "psycopg":
        import psycopg

        from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

        if isinstance(conn, psycopg.AsyncConnection):
            return _ENQUEUE_BACKENDS.setdefault("postgresql", AsyncPostgresBackend(None))
    if type(conn).__module__.split(".", 1)[0] == "asyncpg":  # a Connection, or a pool's connection proxy
        from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend

        return _ENQUEUE_BACKENDS.setdefault("asyncpg", AsyncpgBackend(None))
    if type(conn).__module__.split(".", 1)[0] == "aiomysql":
        import aiomysql

        from proletarian_ref.backends.mysql_async import AsyncMySQLBackend

        if isinstance(conn, aiomysql.Connection):
            return _ENQUEUE_BACKENDS.setdefault("mysql", AsyncMySQLBackend(None))
    raise ConfigurationError(
        "proletarian_ref.aio takes a psycopg.AsyncConnection, an asyncpg connection or an aiomysql "
        "Connection (or backend=an "
        f"AsyncBackend), got "
        f"{type(conn).__module__}.{type(conn).__name__}"
    )


_ENQUEUE_BACKENDS: dict[str, AsyncBackend] = {}


def backend_for_data_source(data_source: Any) -> tuple[AsyncBackend, bool]:
    """The asyncio backend for a worker, and whether it is built here (ours to close) or the caller's."""
    if is_async_backend(data_source):
        return cast(AsyncBackend, data_source), False
    own = getattr(data_source, "proletarian_backend", None)
    if callable(own):
        return _checked(own()), False
    if is_sqlalchemy(data_source):
        from proletarian_ref.integrations.sqlalchemy import async_data_source

        # An AsyncEngine's connections come from a closure of ours: the engine's dialect names the backend.
        dialect = getattr(getattr(data_source, "dialect", None), "name", None)
        data_source = async_data_source(data_source)
        if dialect in ("mysql", "mariadb"):
            from proletarian_ref.backends.mysql_async import AsyncMySQLBackend

            return AsyncMySQLBackend(data_source), True
    if isinstance(data_source, Backend) or (
        type(data_source).__name__ == "ConnectionPool" and not hasattr(data_source, "__aenter__")
    ):
        raise ConfigurationError(
            "proletarian_ref.aio needs an asyncio data source (an AsyncConnectionPool, a callable returning "
            "an awaitable AsyncConnection, or an AsyncBackend); a threaded one goes to proletarian_ref's "
            "create_queue_worker"
        )
    if _is_asyncpg(data_source):
        from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend

        return AsyncpgBackend(data_source), True
    if _driver_module(data_source) == "aiomysql":
        from proletarian_ref.backends.mysql_async import AsyncMySQLBackend

        return AsyncMySQLBackend(data_source), True
    if not callable(data_source) and type(data_source).__module__.split(".", 1)[0] != "psycopg_pool":
        raise ConfigurationError(
            f"data_source must be a psycopg_pool.AsyncConnectionPool, an asyncpg.Pool, an aiomysql.Pool, "
            f"or a zero-argument callable returning an awaitable psycopg.AsyncConnection (for asyncpg "
            f"connections of your own factory: AsyncpgBackend(factory)), got {type(data_source).__name__}"
        )
    from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

    return AsyncPostgresBackend(data_source), True


def _is_asyncpg(data_source: Any) -> bool:
    """An asyncpg.Pool, or asyncpg's own connect (bare or in a functools.partial); a factory of the
    caller's cannot be told from a psycopg one before it is called: it comes as AsyncpgBackend(factory)."""
    made_by = getattr(data_source, "func", data_source)
    module = getattr(made_by, "__module__", None) or type(data_source).__module__
    return module.split(".", 1)[0] == "asyncpg"


def _driver_module(data_source: Any) -> str:
    """The top-level package of a pool, or of the function a functools.partial factory calls."""
    target = getattr(data_source, "func", data_source)  # functools.partial(aiomysql.connect, ...)
    module = target.__module__ if callable(target) and hasattr(target, "__module__") else None
    if target is data_source or not isinstance(module, str):
        module = type(data_source).__module__
    return module.split(".", 1)[0]


def _checked(backend: object) -> AsyncBackend:
    if not is_async_backend(backend):
        raise ConfigurationError(f"proletarian_backend() must return an AsyncBackend, got {backend!r}")
    return cast(AsyncBackend, backend)


# -- the queue worker ----------------------------------------------------------------------------------


def _check_handler(handler_fn: object) -> AsyncHandlerFn:
    call = getattr(handler_fn, "__call__", None)  # noqa: B004 - an object whose __call__ is async counts
    if not (inspect.iscoroutinefunction(handler_fn) or inspect.iscoroutinefunction(call)):
        raise ConfigurationError(
            f"handler_fn must be a coroutine function (async def) on the asyncio worker, got {handler_fn!r}: "
            "run a blocking handler with the threaded proletarian_ref.create_queue_worker, or wrap it "
            "(async def handler(job_type, payload): await asyncio.to_thread(blocking, job_type, payload))"
        )
    return cast(AsyncHandlerFn, handler_fn)


async def process_next_job(
    data_source: Any,
    handler_fn: Callable[..., Awaitable[object]],
    *,
    log: LogFn | None = None,
    backend: AsyncBackend | None = None,
    **options: Any,
) -> bool | None:
    """proletarian_ref.process_next_job, awaited: run the next due job (or batch) by hand."""
    handler = _check_handler(handler_fn)
    active, owns = (backend, False) if backend is not None else backend_for_data_source(data_source)
    try:
        settings = job_settings(active, **options)
        run = run_next_job if settings.batch_size == 1 else run_next_batch
        return await run(active, settings, handler, log or stdlib_logger, {}, asyncio.Event())
    finally:
        if owns:
            await active.close()


class AsyncQueueWorker(AsyncJobTimeout, AsyncLifecycle):
    """Polling tasks over one queue on the running event loop; build it with create_queue_worker.

    The threaded QueueWorker's promises, with tasks for threads: one job a transaction with its handler
    (a coroutine) inside it, retries and failed_job_fn, batch mode, the compact plan, wake-up on NOTIFY,
    and stop() draining then releasing (docs/worker.md, "asyncio").
    """

    backend: AsyncBackend

    def __init__(self, *args: Any, install_shutdown_hook: bool = False, **kwargs: Any) -> None:
        # WorkerCore's arguments, as worker_arguments makes them.
        super().__init__(*args, **kwargs)
        self._install_shutdown_hook = install_shutdown_hook
        self._lock = contextlib.nullcontext()  # one event loop thread: nothing to guard
        self._stop_event = asyncio.Event()
        self._wake = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._listener_task: asyncio.Task[None] | None = None
        self._listener: AsyncListener | None = None
        # The job timeout, when there is one: per task, its check's binding and the bound its handler
        # runs inside (cancelled after the grace).
        self._watchdog: AsyncWatchdog | None = None
        self._checks: dict[int, contextvars.Token[Callable[[], bool] | None]] = {}
        self._bounds: dict[int, asyncio.Timeout] = {}
        if self._job_timeout_ms is not None:
            self._watchdog = AsyncWatchdog(
                self.queue_worker_id,
                self._job_timeout_ms / 1000,
                self._grace_ms / 1000,
                self._at_deadline,
                self._after_grace,
            )

    # -- lifecycle -------------------------------------------------------------------------------------

    # Stop: from the call on, no task claims a job and no handler starts. A running handler may see the
    # request (`stopping()`) and give its job back by raising JobInterrupted (attempts unchanged); one
    # still running at the deadline is cancelled: CancelledError is raised at its await, its transaction's
    # connection is closed so the database rolls it back, and the job goes back with attempts unchanged.
    # Then stop() raises ShutdownTimeoutError and skips on_shutdown, as the threaded worker does; a second
    # stop() only logs already-shut-down.
    _ON_SHUTDOWN_AGAIN = False

    def _hook_signals(self) -> None:
        if self._install_shutdown_hook:
            aio_shutdown_hook.hook(self)

    def _unhook_signals(self) -> None:
        aio_shutdown_hook.unhook(self)

    def _request_stop(self) -> AsyncListener | None:
        self._stop_event.set()
        return self._listener

    async def _drain(self, timeout: float) -> list[tuple[int, asyncio.Task[None]]]:
        if self._listener_task is not None:
            self._listener_task.cancel()
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        stuck: set[asyncio.Task[None]] = set()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=timeout)
        return [(n, task) for n, task in enumerate(self._tasks, 1) if task in stuck]

    def _releasing(self, n: int) -> dict[str, Any]:
        return dict(self._current_jobs.get(n, {}))

    def _release_poller(self, poller: asyncio.Task[None]) -> bool:
        # CancelledError at the handler's await: its transaction's connection is closed, so the database
        # rolls it back.
        poller.cancel()
        return True

    async def _drained(self, stuck: list[tuple[int, asyncio.Task[None]]]) -> None:
        if stuck:
            await asyncio.wait([task for _, task in stuck])
        if self._listener_task is not None:
            await asyncio.wait([self._listener_task])

    # -- polling ---------------------------------------------------------------------------------------

    def _may_handle(self, n: int) -> Callable[[Mapping[str, Any]], bool]:
        stopping, current = self._stop_event.is_set, self._current_jobs

        def may_handle(job_context: Mapping[str, Any]) -> bool:
            # One event loop thread: no await between this check and the handler's start, so stop()
            # cannot begin in between.
            if stopping():
                return False
            current[n] = {key: job_context[key] for key in (ev.JOB_ID, ev.JOB_TYPE, ev.ATTEMPT)}
            return True

        return may_handle

    def _poller_ended(self) -> None:
        return None

    async def _poller_handler(self, n: int) -> AsyncHandlerFn:
        if n == 1:
            await self._check_server_limits()
        if self._watchdog is None:
            return self.handler_fn
        return self._timed_handler(n, self.handler_fn, self._watchdog)

    def _run_over(self, n: int) -> None:
        self._current_jobs.pop(n, None)

    def _run_failed(self, n: int) -> tuple[bool, bool, dict[str, Any]]:
        # stop() releases a stuck task by cancelling it, and CancelledError never comes here.
        return False, False, self._current_jobs.pop(n, {})

    def _stop_in_background(self) -> None:
        # stop() waits for this very task: it runs as a task of its own.
        asyncio.get_running_loop().create_task(self._stop_logging_errors())

    # -- the job timeout -------------------------------------------------------------------------------

    def _arm(self, n: int, token: object) -> None:
        stopping, timed_out = self._stop_event.is_set, self._timed_out
        self._checks[n] = bind_task_check(lambda: timed_out.get(n) is token or stopping())

    def _bound(self, n: int) -> asyncio.Timeout:
        bound = self._bounds[n] = asyncio.timeout(None)
        return bound

    def _disarm(self, n: int) -> None:
        self._bounds.pop(n, None)
        unbind_task_check(self._checks.pop(n))

    def _tell_late(self, n: int) -> None:
        # Its task's check (interrupted()) reads the deadline _at_deadline has marked.
        return None

    def _end_handler(self, n: int) -> bool:
        # Cancelled at its next await, with the transaction still the worker's: unlike a thread's, the
        # job's failure (JobTimeoutError) is written, attempts counted, retry_strategy_fn decides, so
        # nothing goes back to the queue to be logged as released.
        bound = self._bounds.get(n)
        if bound is not None:
            bound.reschedule(asyncio.get_running_loop().time())
        return False

    async def _stop_logging_errors(self) -> None:
        """stop() where no caller could catch its error (after a polling task's error)."""
        try:
            await self.stop()
        except Exception as exc:
            self._safe_log(
                ev.QUEUE_WORKER_SHUTDOWN_ERROR, {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.THROWABLE: exc}
            )

    async def _close_listener(self, listener: AsyncListener) -> None:
        # Shielded: the listener task is cancelled by stop(), and its connection must still be closed.
        await asyncio.shield(listener.close())


def create_queue_worker(
    data_source: Any,
    handler_fn: Callable[..., Awaitable[object]],
    *,
    backend: AsyncBackend | None = None,
    install_shutdown_hook: bool = False,
    **options: Any,
) -> AsyncQueueWorker:
    """proletarian_ref.create_queue_worker for asyncio, with the same options and defaults
    (proletarian_ref.worker.WORKER_OPTION_DEFAULTS). `handler_fn` is a coroutine function; the data source
    a psycopg_pool.AsyncConnectionPool, a callable returning an awaitable AsyncConnection, an asyncpg.Pool
    (or asyncpg.connect in a functools.partial), an aiomysql.Pool or functools.partial of aiomysql.connect,
    or an AsyncBackend such as AsyncpgBackend(factory); `worker_threads` the number of polling tasks.
    Nothing runs until `await start()` or `async with`. failed_job_fn, retry_strategy_fn and on_shutdown
    may be plain or coroutine functions. With install_shutdown_hook, start() makes SIGTERM and SIGINT stop
    the worker and end the process, as the threaded hook does, through the running loop's signal handlers
    (proletarian_ref.aio_shutdown_hook).
    """
    unknown = sorted(set(options) - set(WORKER_OPTION_DEFAULTS))
    if unknown:
        raise TypeError(f"create_queue_worker() got unexpected keyword arguments: {', '.join(unknown)}")
    handler = _check_handler(handler_fn)
    merged = {**WORKER_OPTION_DEFAULTS, **options}
    check_worker_options(merged)
    active, owns_backend = (backend, False) if backend is not None else backend_for_data_source(data_source)
    settings, arguments = worker_arguments(active, merged)
    return AsyncQueueWorker(
        active,
        handler,
        settings,
        owns_backend=owns_backend,
        install_shutdown_hook=bool(install_shutdown_hook),
        **arguments,
    )
