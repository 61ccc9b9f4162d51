"""pgqueuer as a peer: its schema, its enqueue, its QueueManager draining, in a child process of its own.

Nothing here imports pgqueuer at module level: the parent reads the SQL constants below without it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from benchmarks.peer_child import Signals, sample_latency

NAME: Final = "pgqueuer"
PACKAGE: Final = "pgqueuer"
ENTRYPOINT: Final = "bench_job"
BATCH_SIZE: Final = 10  # QueueManager.run's default, and what pgqueuer's documentation runs
CONFIG: Final = (
    "one QueueManager per connection (its dequeue, its completion log and its LISTEN share it), "
    f"batch_size={BATCH_SIZE} (the default), psycopg 3 AsyncConnection in autocommit"
)
PROMISE: Final = (
    "claims up to 10 jobs per autocommit statement (status 'picked'), runs the handler outside any "
    "transaction, writes completions to pgqueuer_log in buffered batches (about 0.2 commits a job); "
    "a crash leaves picked jobs to be picked again once their heartbeat is 30 s stale: at least once"
)
# Default object names (pgqueuer.domain.settings.DBSettings), in the peer's own schema.
TABLES: Final = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")
DONE_SQL: Final = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
# The log also records each job's 'queued' and 'picked'; its completion records are the rest: how many
# successes, of how many distinct jobs, and how many completions of another kind.
VERIFY_SQL: Final = (
    "SELECT count(*) FILTER (WHERE status = 'successful'), "
    "count(DISTINCT job_id) FILTER (WHERE status = 'successful'), "
    "count(*) FILTER (WHERE status NOT IN ('queued', 'picked', 'successful')) FROM pgqueuer_log"
)
LEFTOVER_SQL: Final = "SELECT count(*) FROM pgqueuer"
RESET_SQL: Final = "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics"
BULK_CHUNK: Final = 5_000


async def _connect(dsn: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


def install(dsn: str) -> str:
    """Create pgqueuer's tables, types, trigger and functions (what `pgq install` runs); its version."""
    from importlib.metadata import version

    from pgqueuer import Queries

    async def main() -> None:
        async with await _connect(dsn) as conn:
            await Queries.from_psycopg_connection(conn).install()

    asyncio.run(main())
    return version(PACKAGE)


def fill(dsn: str, jobs: int, timed: int) -> float:
    """Empty the queue and enqueue `jobs`: the first `timed` one per statement (its rate is returned), the
    rest in batched statements of the same call."""
    from pgqueuer import Queries

    async def main() -> float:
        async with await _connect(dsn) as conn:
            await conn.execute(RESET_SQL)
            queries = Queries.from_psycopg_connection(conn)
            start = time.perf_counter()
            for i in range(timed):
                await queries.enqueue(ENTRYPOINT, str(i).encode())
            elapsed = time.perf_counter() - start
            for lo in range(timed, jobs, BULK_CHUNK):
                hi = min(jobs, lo + BULK_CHUNK)
                await queries.enqueue(
                    [ENTRYPOINT] * (hi - lo), [str(i).encode() for i in range(lo, hi)], [0] * (hi - lo)
                )
            return timed / elapsed if elapsed > 0 else 0.0

    return asyncio.run(main())


def _manager(conn: Any, handler: Any) -> Any:
    from pgqueuer import Queries, QueueManager

    manager = QueueManager(Queries.from_psycopg_connection(conn))
    manager.entrypoint(ENTRYPOINT)(handler)
    return manager


async def _shut_down(managers: list[Any], runs: list[asyncio.Task[None]]) -> None:
    """Ask the managers to stop; cancel what is still running a moment later.

    By then every completion is in the log (the parent waited for it); what a graceful stop would still
    wait for is the heartbeat buffer's timer and the LISTEN watcher's poll, seconds that measure nothing.
    """
    for manager in managers:
        manager.shutdown.set()
    _, pending = await asyncio.wait(runs, timeout=0.2)
    for run in pending:
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)


def consume(dsn: str, connections: int, signals: Signals) -> None:
    """Each round: `connections` QueueManagers, one connection each, from its go until its stop."""
    from pgqueuer import Job

    async def handler(job: Job) -> None:
        signals.handled()

    async def main() -> None:
        for round_ in range(signals.rounds):
            conns = [await _connect(dsn) for _ in range(connections)]
            managers = [_manager(conn, handler) for conn in conns]
            if not await signals.async_wait_go(round_):
                return
            runs = [asyncio.create_task(m.run(batch_size=BATCH_SIZE)) for m in managers]
            await signals.async_wait_stop(round_)
            await _shut_down(managers, runs)
            for conn in conns:
                await conn.close()

    asyncio.run(main())


def latency(dsn: str, jobs: int, gap_ms: tuple[float, float]) -> list[float]:
    """Enqueue-to-start seconds with one idle QueueManager (woken by its LISTEN/NOTIFY)."""
    from pgqueuer import Job, Queries

    async def main() -> list[float]:
        starts: dict[int, float] = {}

        async def handler(job: Job) -> None:
            starts[int(job.payload or b"-1")] = time.monotonic()

        async with await _connect(dsn) as consumer, await _connect(dsn) as producer:
            await producer.execute(RESET_SQL)
            manager = _manager(consumer, handler)
            queries = Queries.from_psycopg_connection(producer)
            run = asyncio.create_task(manager.run(batch_size=BATCH_SIZE))

            async def enqueue(i: int) -> None:
                await queries.enqueue(ENTRYPOINT, str(i).encode())

            try:
                return await sample_latency(enqueue, starts, jobs, gap_ms)
            finally:
                await _shut_down([manager], [run])

    return asyncio.run(main())
