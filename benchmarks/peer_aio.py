"""proletarian-ref's asyncio worker for the peers scenario: its consumers and latency sample, per driver.

A driver is one entry of DRIVERS: a name and how to make the worker's data source from a DSN. The
consumers run in a spawned child like the peers', one event loop per child.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any, Final

from benchmarks.common import BENCH_JOB_TYPE, BENCH_QUEUE
from benchmarks.peer_child import Signals, sample_latency
from proletarian_ref import aio
from proletarian_ref.backend import is_async_backend


def psycopg_source(dsn: str) -> Any:
    """psycopg 3's AsyncConnection: the worker keeps one open connection per polling task."""
    import psycopg

    return functools.partial(psycopg.AsyncConnection.connect, dsn)


async def psycopg_connect(dsn: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


def asyncpg_source(dsn: str) -> Any:
    """asyncpg's connect (AsyncpgBackend): the worker keeps one open connection per polling task, as on
    psycopg."""
    import asyncpg

    return functools.partial(asyncpg.connect, dsn)


def asyncpg_compact_source(dsn: str) -> Any:
    """AsyncpgBackend on the compact plan (archive and delete in one statement), lent to the worker as an
    application passes it when it chooses that plan."""
    from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend

    return AsyncpgBackend(asyncpg_source(dsn), compact=True)


async def _close_lent(source: Any) -> None:
    # A worker leaves a lent backend's connections open: closed after each drain, so that every round
    # opens its own as a worker does with a factory, and none outlives the child.
    if is_async_backend(source):
        await source.close()


async def asyncpg_connect(dsn: str) -> Any:
    import asyncpg

    return await asyncpg.connect(dsn)  # outside a transaction() each statement commits on its own


# name -> (the worker's data source from a DSN, an autocommit connection for the latency sample's enqueues).
DRIVERS: Final[dict[str, tuple[Callable[[str], Any], Callable[[str], Any]]]] = {
    "psycopg": (psycopg_source, psycopg_connect),
    "asyncpg": (asyncpg_source, asyncpg_connect),
    "asyncpg compact": (asyncpg_compact_source, asyncpg_connect),
}


def consume(
    dsn: str,
    driver: str,
    job_table: str,
    archived_job_table: str,
    polling_interval_ms: float,
    connections: int,
    batch_size: int,
    signals: Signals,
) -> None:
    """Each round: an AsyncQueueWorker of `connections` polling tasks (one connection each), from go until
    stop; in batch mode when `batch_size` > 1."""

    async def handler(job_type: Any, payload: Any) -> None:
        signals.handled()

    async def main() -> None:
        source = DRIVERS[driver][0](dsn)
        for round_ in range(signals.rounds):
            worker = aio.create_queue_worker(
                source,
                handler,
                queue=BENCH_QUEUE,
                worker_threads=connections,
                polling_interval_ms=polling_interval_ms,
                batch_size=batch_size,
                job_table=job_table,
                archived_job_table=archived_job_table,
            )
            if not await signals.async_wait_go(round_):
                return
            await worker.start()
            await signals.async_wait_stop(round_)
            await worker.stop()
            await _close_lent(source)

    asyncio.run(main())


def enqueue_rate(
    dsn: str, driver: str, job_table: str, archived_job_table: str, jobs: int
) -> tuple[int, float]:
    """`jobs` jobs enqueued with proletarian_ref.aio.enqueue, one a transaction on one connection of the
    driver's, as an asyncio application enqueues in its own transaction; the jobs and the seconds taken."""
    connect = DRIVERS[driver][1]

    async def main() -> tuple[int, float]:
        conn = await connect(dsn)
        try:
            start = time.perf_counter()
            for i in range(jobs):
                async with conn.transaction():
                    await aio.enqueue(
                        conn,
                        BENCH_JOB_TYPE,
                        {"i": i},
                        queue=BENCH_QUEUE,
                        job_table=job_table,
                        archived_job_table=archived_job_table,
                    )
            return jobs, time.perf_counter() - start
        finally:
            await conn.close()

    return asyncio.run(main())


def latency(
    dsn: str,
    driver: str,
    job_table: str,
    archived_job_table: str,
    batch_size: int,
    jobs: int,
    gap_ms: tuple[float, float],
) -> list[float]:
    """Enqueue-to-start seconds with one idle polling task, woken by LISTEN/NOTIFY as the threaded one is."""
    source, connect = DRIVERS[driver]

    async def main() -> list[float]:
        starts: dict[int, float] = {}

        async def handler(job_type: Any, payload: Any) -> None:
            starts[int(payload)] = time.monotonic()

        data_source = source(dsn)
        worker = aio.create_queue_worker(
            data_source,
            handler,
            queue=BENCH_QUEUE,
            worker_threads=1,
            batch_size=batch_size,
            wake_on_notify=True,
            job_table=job_table,
            archived_job_table=archived_job_table,
        )
        conn = await connect(dsn)
        try:
            await worker.start()

            async def enqueue(i: int) -> None:
                await aio.enqueue(
                    conn,
                    ":bench/job",
                    i,
                    queue=BENCH_QUEUE,
                    notify=True,
                    job_table=job_table,
                    archived_job_table=archived_job_table,
                )

            return await sample_latency(enqueue, starts, jobs, gap_ms)
        finally:
            await worker.stop()
            await _close_lent(data_source)
            await conn.close()

    return asyncio.run(main())
