"""A drain with and without `SET LOCAL synchronous_commit = off` in each job's transaction, A B A B.

`--loop raw` (the default) measures the setting on the raw driver loop (benchmarks.raw), the ceiling the
worker's default mode runs under; `--loop library` drains with the library's own threaded worker, its
backend PostgresBackend(source, synchronous_commit_off=False, then True), in default mode.
`python -m benchmarks.sync_commit [--dsn DSN] [--loop raw|library] [--jobs N] [--threads T] [--rounds R]
[--out FILE.json]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BENCH_QUEUE,
    BackendSpec,
    analyze,
    bulk_load,
    closing_harness,
    count_rows,
    open_harness,
    require_sql,
    truncate,
    wait_until,
)
from benchmarks.raw import RawDrainer
from conformance.harness import SqlHarness
from proletarian_ref import create_queue_worker
from proletarian_ref.backends.postgres import PostgresBackend

LOOPS = ("raw", "library")


def _reached(done: list[int], jobs: int) -> bool:
    return done[0] >= jobs


def _library_seconds(harness: SqlHarness, jobs: int, threads: int, *, off: bool) -> float:
    """Seconds the library's threaded worker takes to run `jobs` jobs, `threads` polling threads."""
    done = [0]
    lock = threading.Lock()

    def handler(job_type: Any, payload: Any) -> None:
        with lock:
            done[0] += 1

    backend = PostgresBackend(harness.data_source, synchronous_commit_off=off)
    worker = create_queue_worker(
        None,
        handler,
        backend=backend,
        queue=BENCH_QUEUE,
        worker_threads=threads,
        polling_interval_ms=100,
        **harness.table_options,
    )
    try:
        start = time.perf_counter()
        worker.start()
        finished = wait_until(partial(_reached, done, jobs), 600.0, 0.002)
        seconds = time.perf_counter() - start
        worker.stop()
    finally:
        backend.close()
    setting = "off" if off else "on"
    if not finished:
        raise RuntimeError(f"library, synchronous_commit {setting}: {done[0]:,} of {jobs:,} jobs in 600 s")
    # Counted after the window: each job run once by the handler, archived once, none left queued.
    queued, archived = count_rows(harness), count_rows(harness, archived=True)
    if (done[0], queued, archived) != (jobs, 0, jobs):
        raise RuntimeError(
            f"library, synchronous_commit {setting}: {done[0]:,} handler calls, {queued:,} jobs left "
            f"queued, {archived:,} archived; expected {jobs:,}, 0, {jobs:,}"
        )
    return seconds


def drain(
    spec: BackendSpec, jobs: int, threads: int, rounds: int, suffix: str = "", loop: str = "raw"
) -> dict[str, Any]:
    """Jobs a second for each setting, the settings alternating (A B, then B A) round by round."""
    if loop not in LOOPS:
        raise SystemExit(f"--loop is one of {', '.join(LOOPS)}, got {loop!r}")
    harness = open_harness(spec, "sync_commit", suffix)
    rates: dict[str, list[float]] = {"on": [], "off": []}
    with closing_harness(harness):
        sql_harness, dialect = require_sql(harness)
        if dialect != "postgresql":
            raise SystemExit("synchronous_commit is PostgreSQL's")
        for round_ in range(rounds):
            order = ["on", "off"] if round_ % 2 == 0 else ["off", "on"]
            for setting in order:
                truncate(harness)
                bulk_load(harness, 0, jobs, "due")
                analyze(harness, vacuum=True)
                if loop == "library":
                    seconds = _library_seconds(sql_harness, jobs, threads, off=setting == "off")
                    rates[setting].append(jobs / seconds)
                    continue
                done = [0]

                def on_job(done: list[int] = done) -> None:
                    done[0] += 1

                drainer = RawDrainer(
                    sql_harness, dialect, threads, 1.0, on_job, synchronous_commit_off=setting == "off"
                )
                start = time.perf_counter()
                drainer.start()
                finished = wait_until(partial(_reached, done, jobs), 600.0, 0.002)
                seconds = time.perf_counter() - start
                drainer.stop()
                if not finished:
                    raise RuntimeError(f"synchronous_commit {setting}: {done[0]:,} of {jobs:,} jobs in 600 s")
                rates[setting].append(jobs / seconds)
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    off_over_on_rounds = [b / a for a, b in zip(rates["on"], rates["off"], strict=True)]
    return {
        "loop": loop,
        "jobs": jobs,
        "threads": threads,
        "rounds": rounds,
        "jobs_per_s": {"on": on, "off": off},
        "rounds_jobs_per_s": rates,
        "off_over_on": off / on,
        # Each round's two drains ran back to back, so their ratio is free of the drift between rounds
        # that a loaded machine brings; the median of those is the figure to quote.
        "off_over_on_rounds": off_over_on_rounds,
        "off_over_on_paired": statistics.median(off_over_on_rounds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sync_commit", description=__doc__)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--loop", choices=LOOPS, default="raw")
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table-suffix", default="", help="appended to the bench_ table names")
    args = parser.parse_args(argv)
    options = {"dsn": args.dsn} if args.dsn else {}
    result = drain(
        BackendSpec("conformance.builtin:postgresql", options),
        args.jobs,
        args.threads,
        args.rounds,
        args.table_suffix,
        args.loop,
    )
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
