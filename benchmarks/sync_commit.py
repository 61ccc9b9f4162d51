"""The raw loop with and without `SET LOCAL synchronous_commit = off` in each job's transaction, A B A B.

The worker has no hook to run a statement in its own transaction, so this measures what the setting
could gain on the raw driver loop (benchmarks.raw), the ceiling the worker's default mode runs under.
`python -m benchmarks.sync_commit [--dsn DSN] [--jobs N] [--threads T] [--rounds R] [--out FILE.json]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BackendSpec,
    analyze,
    bulk_load,
    closing_harness,
    open_harness,
    require_sql,
    truncate,
    wait_until,
)
from benchmarks.raw import RawDrainer


def _reached(done: list[int], jobs: int) -> bool:
    return done[0] >= jobs


def drain(spec: BackendSpec, jobs: int, threads: int, rounds: int, suffix: str = "") -> dict[str, Any]:
    """Jobs a second for each setting, the settings alternating (A B, then B A) round by round."""
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
    return {
        "jobs": jobs,
        "threads": threads,
        "rounds": rounds,
        "jobs_per_s": {"on": on, "off": off},
        "rounds_jobs_per_s": rates,
        "off_over_on": off / on,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sync_commit", description=__doc__)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table-suffix", default="", help="appended to the bench_ table names")
    args = parser.parse_args(argv)
    options = {"dsn": args.dsn} if args.dsn else {}
    result = drain(
        BackendSpec("conformance.builtin:postgresql", options), args.jobs, args.threads, args.rounds
    )
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
