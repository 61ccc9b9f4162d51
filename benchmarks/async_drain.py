"""The asyncio worker as a throughput drain: one event loop, a polling task and connection per "thread".

Throughput measures it beside the threaded worker at its limit points (issue 31, section 2): on
PostgreSQL AsyncpgBackend, on MariaDB/MySQL AsyncMySQLBackend (aiomysql), both on the compact plan; the
chained drain on psycopg's AsyncConnection in pipeline mode, and on aiomysql (ASYNC_CHAIN_BACKENDS). It
keeps DrainRun's drainer interface (start and stop from plain code, jobs counted by `on_job`), so a
drain of processes x threads runs here as processes x polling tasks, each process one loop in a thread
of its own. Each drain runs on asyncio's own event loop, or on uvloop's (`uvloop=True`, the
async_chain_uvloop drain), the loop `proletarian-ref worker --loop uvloop` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from benchmarks.common import BENCH_QUEUE, sql_dialect
from benchmarks.peer_aio import asyncpg_source
from conformance.builtin import DEFAULT_MYSQL_DSN, DEFAULT_PG_DSN, MYSQL_ENV, PG_ENV
from conformance.harness import Harness
from proletarian_ref import aio

# Each dialect's asyncio driver here, and where the built-in factories find their DSN when given none.
_DRIVERS = {"postgresql": "asyncpg", "mysql": "aiomysql"}
_DSN_DEFAULTS = {"postgresql": (PG_ENV, DEFAULT_PG_DSN), "mysql": (MYSQL_ENV, DEFAULT_MYSQL_DSN)}
# How long start() waits for the loop to start the worker before it gives up.
_START_TIMEOUT_S = 30.0


def async_skip_reason(harness: Harness) -> str | None:
    """Why the asyncio drain cannot run on `harness`, or None."""
    dialect = sql_dialect(harness)
    factory = harness.factory
    if dialect is None or factory is None or not factory.spec.startswith("conformance.builtin:"):
        return (
            f"{harness.name} is not one of the built-in factories, whose DSN the asyncio worker's driver "
            "connects to"
        )
    if factory.spec.startswith("conformance.builtin:mysqlclient"):
        # The asyncio worker is on aiomysql whichever blocking driver the threaded drains use: the
        # conformance.builtin:mysql rows of the same run measure it.
        return f"{harness.name}: the asyncio worker's driver is aiomysql, measured on the mysql rows"
    driver = _DRIVERS[dialect]
    if importlib.util.find_spec(driver) is None:
        return f"{driver} is not installed (pip install {driver}), so the asyncio worker is not measured"
    return None


_T = TypeVar("_T")


def run_on_loop(main: Coroutine[Any, Any, _T], *, uvloop: bool) -> _T:
    """`main` to the end on uvloop's event loop (`uvloop.run`), or on asyncio's own (`asyncio.run`)."""
    if uvloop:
        import uvloop as uvloop_module

        return uvloop_module.run(main)
    return asyncio.run(main)


def uvloop_skip_reason() -> str | None:
    """Why the asyncio drains cannot also run on uvloop's event loop here, or None."""
    if importlib.util.find_spec("uvloop") is None:
        return "uvloop is not installed (pip install 'proletarian-ref[uvloop]'): no asyncio drain runs on it"
    return None


def harness_dsn(harness: Harness) -> str:
    """The DSN a built-in factory's harness connects to: its `dsn` option, else the factory's default."""
    dialect = sql_dialect(harness)
    if dialect is None:
        raise TypeError(f"{harness.name} is not a built-in SQL dialect")
    given = harness.factory.kwargs.get("dsn") if harness.factory is not None else None
    env, default = _DSN_DEFAULTS[dialect]
    return str(given or os.environ.get(env) or default)


# What the asyncio chain drain runs on, by dialect, as the result records it: on PostgreSQL psycopg's
# AsyncConnection in pipeline mode (asyncpg cannot pipeline different statements), on MySQL aiomysql's
# multi-statement query; one exchange a job either way.
ASYNC_CHAIN_BACKENDS = {
    "postgresql": "AsyncPostgresBackend(pipeline=True, compact=True, chain=True)",
    "mysql": "AsyncMySQLBackend(compact=True, chain=True)",
}
# What the asyncio drain of Proletarian's exact plan pipelined runs on (PostgreSQL): the backend's own
# exchanges, BEGIN with the claim, the archive with the delete, COMMIT.
ASYNC_PIPELINE_BACKEND = "AsyncPostgresBackend(pipeline=True)"


def async_backend(harness: Harness, *, chain: bool = False, pipeline: bool = False) -> Any:
    """The asyncio backend on the compact plan for the harness's database, over its own connections:
    asyncpg's on PostgreSQL, aiomysql's on MySQL. With `chain`, the dialect's ASYNC_CHAIN_BACKENDS: a
    finished job's server-checked archive (and delete), its COMMIT and the next claim in one exchange.
    With `pipeline` (PostgreSQL), ASYNC_PIPELINE_BACKEND: Proletarian's exact plan pipelined."""
    dsn = harness_dsn(harness)
    if sql_dialect(harness) == "postgresql":
        if chain or pipeline:
            import psycopg

            from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

            connect = functools.partial(psycopg.AsyncConnection.connect, dsn)
            if pipeline:
                return AsyncPostgresBackend(connect, pipeline=True)
            return AsyncPostgresBackend(connect, pipeline=True, compact=True, chain=True)
        from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend

        return AsyncpgBackend(asyncpg_source(dsn), compact=True)
    import aiomysql

    from proletarian_ref.backends.mysql_async import AsyncMySQLBackend, aiomysql_connect_kwargs

    # aiomysql opens every connection with CLIENT.MULTI_STATEMENTS, which the compact plan and the chain need.
    return AsyncMySQLBackend(
        functools.partial(aiomysql.connect, **aiomysql_connect_kwargs(dsn)), compact=True, chain=chain
    )


class AsyncDrainer:
    """An AsyncQueueWorker of `tasks` polling tasks with a no-op handler that only counts, on its own loop."""

    def __init__(
        self,
        harness: Harness,
        tasks: int,
        polling_interval_ms: float,
        on_job: Callable[[], Any],
        batch_size: int = 1,
        *,
        chain: bool = False,
        pipeline: bool = False,
        uvloop: bool = False,
    ) -> None:
        self._harness = harness
        self._chain = chain
        self._uvloop = uvloop
        self._pipeline = pipeline
        self._tasks = tasks
        self._polling_interval_ms = polling_interval_ms
        self._on_job = on_job
        self._batch_size = batch_size
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    async def _main(self) -> None:
        on_job = self._on_job

        async def handler(job_type: str, payload: Any) -> None:
            on_job()

        backend = async_backend(self._harness, chain=self._chain, pipeline=self._pipeline)
        worker = aio.create_queue_worker(
            None,
            handler,
            backend=backend,
            queue=BENCH_QUEUE,
            worker_threads=self._tasks,
            polling_interval_ms=self._polling_interval_ms,
            batch_size=self._batch_size,
            **self._harness.table_options,
        )
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await worker.start()
            self._started.set()
            await self._stop.wait()
            await worker.stop()
        finally:
            await backend.close()

    def _run(self) -> None:
        try:
            run_on_loop(self._main(), uvloop=self._uvloop)
        except BaseException as exc:
            # Handed to the thread that calls start() or stop().
            self._error = exc
        finally:
            self._started.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-async-drain", daemon=True)
        self._thread.start()
        if not self._started.wait(_START_TIMEOUT_S):
            raise RuntimeError(f"the asyncio worker did not start within {_START_TIMEOUT_S:.0f} s")
        if self._error is not None:
            raise RuntimeError("the asyncio worker failed to start") from self._error

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None:
            # The loop's own Event, set from this thread through the loop (ended already if it failed).
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s + _START_TIMEOUT_S)
        if self._error is not None:
            raise RuntimeError("the asyncio worker failed") from self._error
