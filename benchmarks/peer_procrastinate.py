"""procrastinate as a peer: its schema, its defer, its worker draining, in a child process of its own.

Nothing here imports procrastinate at module level: the parent reads the SQL constants below without it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from benchmarks.peer_child import Signals, sample_latency

NAME: Final = "procrastinate"
PACKAGE: Final = "procrastinate"
TASK: Final = "bench_job"
QUEUE: Final = "bench"
CONFIG: Final = (
    "one worker per process, concurrency = its connections, psycopg_pool of exactly that many, "
    "listen_notify off in the drain (a listener holds one more connection; a busy worker never waits "
    "for it), wait=False (the worker stops once it finds the queue empty)"
)
PROMISE: Final = (
    "claims one job per call of procrastinate_fetch_job (autocommit, status 'doing'), runs the handler "
    "outside any transaction, then commits procrastinate_finish_job: 2 commits a job; a crashed worker's "
    "jobs stay 'doing' until the application retries them (get_stalled_jobs once the worker's heartbeat "
    "is 30 s old, e.g. from a periodic task): at most once unless it does"
)
TABLES: Final = ("procrastinate_jobs",)
DONE_SQL: Final = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
VERIFY_SQL: Final = (
    "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE status <> 'succeeded' OR attempts <> 1) "
    "FROM procrastinate_jobs"
)
LEFTOVER_SQL: Final = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
RESET_SQL: Final = "TRUNCATE procrastinate_jobs CASCADE"
BULK_CHUNK: Final = 5_000


def _app(dsn: str, pool_size: int, on_job: Any) -> Any:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=pool_size, max_size=pool_size))

    async def bench_job(i: int) -> None:
        on_job(i)

    app.task(name=TASK, queue=QUEUE)(bench_job)
    return app


def install(dsn: str) -> str:
    """Apply procrastinate's schema (what `procrastinate schema --apply` runs); its version."""
    from importlib.metadata import version

    async def main() -> None:
        app = _app(dsn, 1, lambda i: None)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(main())
    return version(PACKAGE)


async def _reset(app: Any) -> None:
    async with app.connector.pool.connection() as conn:
        await conn.execute(RESET_SQL)


def fill(dsn: str, jobs: int, timed: int) -> float:
    """Empty the jobs table and defer `jobs`: the first `timed` one per call (its rate is returned), the
    rest with batch_defer_async."""

    async def main() -> float:
        app = _app(dsn, 1, lambda i: None)
        async with app.open_async():
            await _reset(app)
            task = app.tasks[TASK]
            start = time.perf_counter()
            for i in range(timed):
                await task.defer_async(i=i)
            elapsed = time.perf_counter() - start
            for lo in range(timed, jobs, BULK_CHUNK):
                await task.batch_defer_async(*({"i": i} for i in range(lo, min(jobs, lo + BULK_CHUNK))))
            return timed / elapsed if elapsed > 0 else 0.0

    return asyncio.run(main())


def consume(dsn: str, connections: int, signals: Signals) -> None:
    """Each round: one worker, `connections` concurrent jobs on a pool of `connections`, from its go until
    it finds the queue empty."""

    async def main() -> None:
        app = _app(dsn, connections, lambda i: signals.handled())
        for round_ in range(signals.rounds):
            async with app.open_async():
                if not await signals.async_wait_go(round_):
                    return
                await app.run_worker_async(
                    queues=[QUEUE],
                    concurrency=connections,
                    wait=False,
                    listen_notify=False,
                    install_signal_handlers=False,
                )
                await signals.async_wait_stop(round_)

    asyncio.run(main())


def latency(dsn: str, jobs: int, gap_ms: tuple[float, float]) -> list[float]:
    """Enqueue-to-start seconds with one idle worker as documented: concurrency 1, LISTEN/NOTIFY on."""

    async def main() -> list[float]:
        starts: dict[int, float] = {}

        def on_job(i: int) -> None:
            starts[i] = time.monotonic()

        app = _app(dsn, 2, on_job)
        async with app.open_async():
            await _reset(app)
            task = app.tasks[TASK]
            worker = asyncio.create_task(
                app.run_worker_async(queues=[QUEUE], concurrency=1, install_signal_handlers=False)
            )

            async def enqueue(i: int) -> None:
                await task.defer_async(i=i)

            try:
                return await sample_latency(enqueue, starts, jobs, gap_ms)
            finally:
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)

    return asyncio.run(main())
