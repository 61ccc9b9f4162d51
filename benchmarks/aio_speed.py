"""Client CPU and server waits per job, threaded worker against asyncio worker, in one process, PostgreSQL.

    python -m benchmarks.aio_speed [--dsn DSN] [--jobs 2000] [--rounds 3] [--connections 8] [--out FILE]
        [--variants NAME,...] [--pin]
    python -m benchmarks.aio_speed --profile [--jobs 2000] [--out FILE]
    python -m benchmarks.aio_speed --table FILE.json

Each round drains `--jobs` no-op jobs with every variant in turn (the order reversed every other round):
the threaded worker (`worker_threads` threads, one connection each), on Proletarian's plan and on the
compact plan; the asyncio worker on psycopg's AsyncConnection and on asyncpg (as many polling tasks), on
either plan, and again on uvloop's event loop when uvloop is installed; and the ceilings, no library in the
loop: Proletarian's statements on bare psycopg threads (`raw threaded`), the compact plan's on bare asyncpg
tasks (`raw asyncpg compact`). Per variant: drain jobs/s, the process's CPU seconds per job (user and
system, the server apart) and the waits on the server a job takes: psycopg's Connection.wait calls, one a
statement or COMMIT (the BEGIN psycopg sends first rides in the claim's wait, one round trip more). On a
machine others load, jobs/s moves by tens of percent from one drain to the next; the CPU per job moves much
less, and the waits not at all, so the table's ratios are paired: each round's drain over the threaded
worker's of the same round. `--pin` puts the client on the first half of the CPUs and the server backends
of its connections on the others (benchmarks/server_cores.py, as `python -m benchmarks run --server-cores`).
`--profile` runs one asyncio drain under cProfile, on CPU time, and prints each source's share of it (the
library, psycopg, the event loop). `--table` prints a saved run's table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.async_drain import run_on_loop
from benchmarks.common import (
    BENCH_QUEUE,
    BENCH_QUEUE_TEXT,
    BackendSpec,
    analyze,
    archived_table_of,
    bulk_load,
    job_table_of,
    open_harness,
    require_sql,
    truncate,
)
from benchmarks.raw import STATUS_SUCCESS, RawDrainer
from benchmarks.server_cores import server_cores
from conformance.harness import Harness
from proletarian_ref import aio, create_queue_worker
from proletarian_ref.backends.asyncpg_enqueue import numbered
from proletarian_ref.sql import positional, render

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def _waits() -> Iterator[list[int]]:
    """Counts psycopg's waits on the server (a statement or COMMIT each), sync and async connections."""
    import psycopg

    counted = [0]
    sync_wait, async_wait = psycopg.Connection.wait, psycopg.AsyncConnection.wait

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return sync_wait(self, *args, **kwargs)

    async def await_(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return await async_wait(self, *args, **kwargs)

    psycopg.Connection.wait = wait  # type: ignore[method-assign]
    psycopg.AsyncConnection.wait = await_  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        psycopg.Connection.wait = sync_wait  # type: ignore[method-assign]
        psycopg.AsyncConnection.wait = async_wait  # type: ignore[method-assign]


def _threaded(harness: Harness, jobs: int, connections: int, *, compact: bool = False) -> tuple[float, float]:
    from proletarian_ref.backends.postgres import PostgresBackend

    done = [0]
    lock = threading.Lock()

    def handler(job_type: Any, payload: Any) -> None:
        with lock:
            done[0] += 1

    # The compact plan is the backend's option: lent to the worker, and closed here after the drain.
    backend = PostgresBackend(harness.data_source, compact=True) if compact else None
    worker = create_queue_worker(
        harness.data_source,
        handler,
        backend=backend,
        queue=BENCH_QUEUE,
        worker_threads=connections,
        polling_interval_ms=100,
        **harness.table_options,
    )
    try:
        return _timed_threads(worker.start, worker.stop, done, jobs)
    finally:
        if backend is not None:
            backend.close()


def _asyncio(
    dsn: str,
    table_options: dict[str, Any],
    jobs: int,
    connections: int,
    *,
    compact: bool,
    uvloop: bool,
    driver: str = "psycopg",
) -> tuple[float, float]:
    import psycopg

    from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

    source: Any
    backend: Any
    if driver == "asyncpg":
        import asyncpg

        from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend

        source = functools.partial(asyncpg.connect, dsn)
        backend = AsyncpgBackend(source, compact=compact)
    else:
        source = functools.partial(psycopg.AsyncConnection.connect, dsn)
        backend = AsyncPostgresBackend(source, compact=compact)

    async def main() -> tuple[float, float]:
        done = [0]
        finished = asyncio.Event()

        async def handler(job_type: Any, payload: Any) -> None:
            done[0] += 1
            if done[0] >= jobs:
                finished.set()

        worker = aio.create_queue_worker(
            source,
            handler,
            backend=backend,
            queue=BENCH_QUEUE,
            worker_threads=connections,
            polling_interval_ms=100,
            **table_options,
        )
        start, start_cpu = time.perf_counter(), _cpu()
        await worker.start()
        await finished.wait()
        wall, cpu = time.perf_counter() - start, _cpu() - start_cpu
        await worker.stop()
        await worker.backend.close()
        return wall, cpu

    return run_on_loop(main(), uvloop=uvloop)


def _raw_threaded(harness: Harness, jobs: int, connections: int) -> tuple[float, float]:
    """The threaded ceiling: Proletarian's plan on bare psycopg (benchmarks.raw), no library in the loop."""
    sql_harness, _ = require_sql(harness)
    done = [0]
    lock = threading.Lock()

    def on_job() -> None:
        with lock:
            done[0] += 1

    drainer = RawDrainer(sql_harness, "postgresql", connections, 100, on_job)
    return _timed_threads(drainer.start, drainer.stop, done, jobs)


def _timed_threads(
    start: Callable[[], Any], stop: Callable[[], Any], done: list[int], jobs: int
) -> tuple[float, float]:
    """Wall and CPU seconds from start() until `done[0]` reaches `jobs` (a thread drain); then stop()."""
    began, began_cpu = time.perf_counter(), _cpu()
    start()
    while done[0] < jobs:
        time.sleep(0.002)
    wall, cpu = time.perf_counter() - began, _cpu() - began_cpu
    stop()
    return wall, cpu


def _raw_asyncpg(
    harness: Harness, dsn: str, jobs: int, connections: int, *, uvloop: bool
) -> tuple[float, float]:
    """The asyncio ceiling: the compact plan's statements on bare asyncpg tasks, no library in the loop.

    The statements are the backends' own (sql/postgresql/queries.sql, with asyncpg's $n placeholders), read
    before the clock starts; each task claims, archives-and-deletes and commits in asyncpg's transaction.
    """
    import asyncpg

    sql_harness, _ = require_sql(harness)
    job, archived = job_table_of(sql_harness), archived_table_of(sql_harness)
    claim, claim_names = _asyncpg_statement(render("postgresql", "get_next_job", job))
    archive, archive_names = _asyncpg_statement(render("postgresql", "archive_and_delete_job", job, archived))
    if claim_names != ("queue", "now") or archive_names != ("job_id", "status", "finished_at"):
        raise RuntimeError(f"queries.sql's parameters moved: {claim_names}, {archive_names}")

    async def main() -> tuple[float, float]:
        done = [0]
        finished = asyncio.Event()
        connections_ = [await asyncpg.connect(dsn) for _ in range(connections)]

        async def drain(conn: Any) -> None:
            while not finished.is_set():
                transaction = conn.transaction()
                await transaction.start()
                now = datetime.now(UTC)
                row = await conn.fetchrow(claim, BENCH_QUEUE_TEXT, now)
                if row is None:
                    await transaction.rollback()
                    await asyncio.sleep(0.1)
                    continue
                done[0] += 1
                await conn.execute(archive, row[0], STATUS_SUCCESS, datetime.now(UTC))
                await transaction.commit()
                if done[0] >= jobs:
                    finished.set()

        start, start_cpu = time.perf_counter(), _cpu()
        await asyncio.gather(*(drain(conn) for conn in connections_))
        wall, cpu = time.perf_counter() - start, _cpu() - start_cpu
        for conn in connections_:
            await conn.close()
        return wall, cpu

    return run_on_loop(main(), uvloop=uvloop)


def _asyncpg_statement(statement: str) -> tuple[str, tuple[str, ...]]:
    """A queries.sql statement with asyncpg's $n placeholders, and its parameters' names in their order."""
    text, names = positional(statement)
    return numbered(text).replace("%%", "%"), names


def variants(dsn: str, harness: Harness, connections: int) -> dict[str, Callable[[int], tuple[float, float]]]:
    options = harness.table_options

    def run_async(
        compact: bool, uvloop: bool, driver: str = "psycopg"
    ) -> Callable[[int], tuple[float, float]]:
        return lambda jobs: _asyncio(
            dsn, options, jobs, connections, compact=compact, uvloop=uvloop, driver=driver
        )

    found: dict[str, Callable[[int], tuple[float, float]]] = {
        "threaded": lambda jobs: _threaded(harness, jobs, connections),
        "threaded compact": lambda jobs: _threaded(harness, jobs, connections, compact=True),
        "raw threaded": lambda jobs: _raw_threaded(harness, jobs, connections),
        "asyncio": run_async(False, False),
        "asyncio compact": run_async(True, False),
    }
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        pass
    else:
        # asyncpg's own protocol on the loop: no psycopg wait a statement (its waits/job read 0 here).
        found["asyncio asyncpg"] = run_async(False, False, "asyncpg")
        found["asyncio asyncpg compact"] = run_async(True, False, "asyncpg")
        found["raw asyncpg compact"] = lambda jobs: _raw_asyncpg(
            harness, dsn, jobs, connections, uvloop=False
        )
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return found
    found["asyncio uvloop"] = run_async(False, True)
    found["asyncio compact uvloop"] = run_async(True, True)
    if "asyncio asyncpg" in found:
        found["asyncio asyncpg uvloop"] = run_async(False, True, "asyncpg")
        found["asyncio asyncpg compact uvloop"] = run_async(True, True, "asyncpg")
        found["raw asyncpg compact uvloop"] = lambda jobs: _raw_asyncpg(
            harness, dsn, jobs, connections, uvloop=True
        )
    return found


def measure(
    dsn: str,
    jobs: int,
    rounds: int,
    connections: int,
    suffix: str,
    only: list[str] | None = None,
    *,
    pin: bool = False,
) -> dict[str, Any]:
    """The variants' paired rounds; with `pin`, the database on cores of its own (server_cores.py)."""
    harness = open_harness(BackendSpec("conformance.builtin:postgresql", {"dsn": dsn}), "aiospeed", suffix)
    try:
        with server_cores(harness) if pin else contextlib.nullcontext(None) as pinned:
            result = _measure(dsn, harness, jobs, rounds, connections, only)
    finally:
        truncate(harness)
        harness.close()
    return result | {"pinned": pinned}


def _measure(
    dsn: str, harness: Harness, jobs: int, rounds: int, connections: int, only: list[str] | None
) -> dict[str, Any]:
    runs = variants(dsn, harness, connections)
    if only:
        unknown = [name for name in only if name not in runs]
        if unknown:
            raise SystemExit(f"--variants: no variant {unknown!r} here; there are {sorted(runs)!r}")
        runs = {name: runs[name] for name in only}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for round_ in range(rounds):
        names = list(runs) if round_ % 2 == 0 else list(runs)[::-1]
        for name in names:
            truncate(harness)
            # More than the drain: the last polls find jobs too, so no drain ends on empty polls.
            bulk_load(harness, 0, jobs + 20 * connections, "due")
            analyze(harness)
            with _waits() as counted:
                wall, cpu = runs[name](jobs)
            rows[name].append(
                {
                    "jobs_per_s": jobs / wall,
                    "cpu_us_per_job": cpu / jobs * 1e6,
                    "waits_per_job": counted[0] / jobs,
                }
            )
    summary = {
        name: {
            key: round(statistics.median(row[key] for row in values), 2)
            for key in ("jobs_per_s", "cpu_us_per_job", "waits_per_job")
        }
        | {"rounds_jobs_per_s": [round(row["jobs_per_s"]) for row in values]}
        for name, values in rows.items()
    }
    return {
        "jobs": jobs,
        "rounds": rounds,
        "connections": connections,
        "load_average": list(os.getloadavg()),
        "variants": summary,
    }


# Where a profiled asyncio drain's CPU goes, by the source file of each function's own time.
_SOURCES = (
    ("/proletarian_ref/", "proletarian_ref"),
    ("/psycopg/", "psycopg"),
    ("/psycopg_binary/", "psycopg"),
    ("/asyncio/", "asyncio event loop"),
    ("/selectors.py", "asyncio event loop"),
    ("/contextlib.py", "contextlib"),
)


def _source(filename: str, function: str) -> str:
    if filename == "~":
        return "asyncio event loop" if "epoll" in function else "built-ins"
    return next((label for needle, label in _SOURCES if needle in filename), "other Python")


def profile_asyncio(dsn: str, jobs: int, connections: int, suffix: str) -> dict[str, Any]:
    """One asyncio drain (default plan) under cProfile on CPU time: each source's share of the own time."""
    import cProfile
    import pstats

    harness = open_harness(BackendSpec("conformance.builtin:postgresql", {"dsn": dsn}), "aiospeed", suffix)
    try:
        truncate(harness)
        bulk_load(harness, 0, jobs + 20 * connections, "due")
        analyze(harness)
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        _asyncio(dsn, harness.table_options, jobs, connections, compact=False, uvloop=False)
        profile.disable()
    finally:
        truncate(harness)
        harness.close()
    by_source: dict[str, float] = {}
    raw: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for (filename, _line, function), (_cc, _nc, own, _cumulative, _callers) in raw.items():
        label = _source(filename, function)
        by_source[label] = by_source.get(label, 0.0) + own
    total = sum(by_source.values())
    return {
        "jobs": jobs,
        "connections": connections,
        "profiled_cpu_us_per_job": round(total / jobs * 1e6),
        "share_percent": {
            label: round(100 * own / total, 1)
            for label, own in sorted(by_source.items(), key=lambda item: -item[1])
        },
    }


def paired(result: dict[str, Any], name: str, base: str = "threaded") -> list[float]:
    """Each round's drain rate of `name` over `base`'s in the same round."""
    variants_ = result["variants"]
    return [
        a / b
        for a, b in zip(
            variants_[name]["rounds_jobs_per_s"], variants_[base]["rounds_jobs_per_s"], strict=True
        )
    ]


def table(result: dict[str, Any]) -> str:
    """A measure() result as the markdown table docs/benchmarks.md pastes: each variant's median drain rate
    and rounds, its paired ratio to the threaded worker (median, spread), its client CPU a job and psycopg's
    waits a job (none on asyncpg, whose waits are not psycopg's)."""
    variants_ = result["variants"]
    base_cpu = variants_["threaded"]["cpu_us_per_job"]
    lines = [
        "| variant | drain jobs/s | rounds | paired over threaded | min-max | client CPU µs/job "
        "| over threaded | waits/job |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, v in variants_.items():
        ratios = paired(result, name)
        waits = "-" if "asyncpg" in name else f"{v['waits_per_job']:.2f}"
        lines.append(
            f"| {name} | {v['jobs_per_s']:,.0f} | {' '.join(str(r) for r in v['rounds_jobs_per_s'])} | "
            f"{statistics.median(ratios):.2f} | {min(ratios):.2f}-{max(ratios):.2f} | "
            f"{v['cpu_us_per_job']:.0f} | {v['cpu_us_per_job'] / base_cpu:.2f} | {waits} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.aio_speed", description=__doc__)
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--table-suffix", default="")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--variants",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        help="only these variants, comma-separated, in this order (default: every one installed here)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="instead: one asyncio drain under cProfile, shares by source"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the client on the first half of the CPUs and its server backends on the others (a database "
        "on cores of its own, server_cores.py); PostgreSQL on this machine, as root or with CAP_SYS_NICE",
    )
    parser.add_argument(
        "--table",
        type=Path,
        metavar="FILE.json",
        help="instead: print a saved run's table (docs/benchmarks.md)",
    )
    args = parser.parse_args(argv)
    if args.table is not None:
        print(table(json.loads(args.table.read_text(encoding="utf-8"))))
        return 0
    if args.profile:
        result = profile_asyncio(args.dsn, args.jobs, args.connections, args.table_suffix)
    else:
        result = measure(
            args.dsn, args.jobs, args.rounds, args.connections, args.table_suffix, args.variants, pin=args.pin
        )
    text = json.dumps(result, indent=2)
    print(text)
    if "variants" in result:
        print(table(result))
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
