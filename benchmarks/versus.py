"""Default-mode throughput of the library at an earlier commit against the working tree, drained in turns.

    python -m benchmarks.versus REV [--backends postgresql,mysql] [--jobs 20000] [--rounds 5]
                                    [--threads 4] [--processes 1] [--compact] [--instructions JOBS]
                                    [--table-suffix _me] [--out FILE]
    python -m benchmarks.versus REV --serializer [--rounds 5] [--seconds 0.2] [--out FILE]

Issue 14 asks default mode (one job a transaction) for 1.3x the rate it had when the issue was filed. A
figure from another day or machine cannot say that, so this runs both versions here, in turns (REV, now,
REV, now, ...), on the same tables and server: each round loads the same due jobs, starts the worker
processes of one version (`create_queue_worker` with a no-op handler, as a user would), counts the
archived rows between 10% and 90% of the drain, and checks that every job ran exactly once. REV's
`proletarian_ref` and `sql/` come from `git archive`; only the package differs between the sides. With
--compact the working tree runs a third side, its backend on the compact statement plan. With
--serializer it drains nothing and needs no database: each side runs benchmarks/serializer.py (encode and
decode of ordinary and deeply nested payloads) in a process of its own, in turns.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Final

from benchmarks import serializer
from benchmarks.common import (
    BENCH_QUEUE,
    BackendSpec,
    BenchmarkFailure,
    analyze,
    bulk_load,
    closing_harness,
    count_rows,
    open_harness,
    truncate,
)
from benchmarks.instructions import BASE_JOBS, COLLECTED
from conformance.builtin import DEFAULT_MYSQL_DSN, DEFAULT_PG_DSN, MYSQL_ENV, PG_ENV
from conformance.harness import Harness

REPO = Path(__file__).resolve().parents[1]
# Where the rate is read: past start-up (connections, imports) and before the last threads run dry.
WINDOW = (0.1, 0.9)
# A drain that archives nothing for this long has stalled.
STALL_TIMEOUT_S = 60.0

# One worker process of either version: the public API only, which both versions share.
_CHILD = """
import sys, threading
import proletarian_ref
from proletarian_ref import create_queue_worker
from proletarian_ref.backends.dsn import connection_factory

tree, dsn, job_table, archived_job_table, queue, threads, compact = sys.argv[1:8]
if not proletarian_ref.__file__.startswith(tree):
    sys.exit(f"imported {proletarian_ref.__file__}, not the package in {tree}")
options = {}
if compact == "compact":
    if dsn.startswith("mysql"):
        from pymysql.constants import CLIENT
        from proletarian_ref.backends.mysql import MySQLBackend
        options["backend"] = MySQLBackend(
            connection_factory(dsn, client_flag=CLIENT.MULTI_STATEMENTS), compact=True
        )
    else:
        from proletarian_ref.backends.postgres import PostgresBackend
        options["backend"] = PostgresBackend(connection_factory(dsn), compact=True)
lock = threading.Lock()
runs = 0

def handler(job_type, payload):
    global runs
    with lock:
        runs += 1

worker = create_queue_worker(
    connection_factory(dsn), handler, queue=queue, job_table=job_table,
    archived_job_table=archived_job_table, worker_threads=int(threads), polling_interval_ms=100, **options
)
print("ready", flush=True)
sys.stdin.readline()
worker.start()
sys.stdin.readline()
worker.stop()
print(runs, flush=True)
"""


@dataclass(frozen=True, slots=True)
class Side:
    """One version under test: a label, the folder whose `proletarian_ref` the workers import, and whether
    its workers run the compact statement plan (docs/worker.md) instead of Proletarian's five statements."""

    label: str
    tree: Path
    compact: bool = False


def export_rev(rev: str, into: Path) -> Side:
    """REV's package and SQL in `into` (git archive): the workers of that side import them."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "proletarian_ref", "sql"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        # The "data" filter (no links out, no special files) exists from Python 3.11.4 on; before it, the
        # archive is git's own of two tracked folders, extracted as it is.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)
    return Side(commit, into)


def working_tree() -> Side:
    head = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Side(f"{head or 'working tree'} (now)", REPO)


@dataclass(frozen=True, slots=True)
class Drained:
    """What one drain gave: jobs a second between 10% and 90% archived, and each process's stderr."""

    rate: float
    stderr: list[str]


def drain(
    harness: Harness,
    dsn: str,
    side: Side,
    jobs: int,
    threads: int,
    processes: int,
    wrap: Sequence[str] = (),
) -> Drained:
    """Load `jobs` due jobs and drain them with `processes` x `threads` of `side`, each process run under
    the command `wrap` (e.g. valgrind) if given; every job must run and be archived exactly once."""
    truncate(harness)
    bulk_load(harness, 0, jobs, "due")
    analyze(harness, vacuum=True)
    env = {**os.environ, "PYTHONPATH": str(side.tree), "PYTHONHASHSEED": "0"}
    command = [*wrap, sys.executable, "-c", _CHILD, str(side.tree), dsn]
    command += [harness.job_table, harness.archived_job_table, BENCH_QUEUE, str(threads)]
    command.append("compact" if side.compact else "plain")
    children = [
        # cwd: `python -c` puts the current folder first on sys.path, before PYTHONPATH.
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=side.tree,
        )
        for _ in range(processes)
    ]
    outputs: list[tuple[str, str]] = []
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                child.kill()
                raise BenchmarkFailure(
                    f"{side.label}: a worker process did not start: {child.communicate()[1][-2000:]}"
                )
        _tell(children, "go")
        marks = _window(harness, side, jobs)
        _tell(children, "stop")
        for child in children:
            outputs.append(child.communicate(timeout=120))
            if child.returncode != 0:
                raise BenchmarkFailure(
                    f"{side.label}: a worker process exited with {child.returncode}: {outputs[-1][1][-2000:]}"
                )
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    runs = sum(int(out.split()[-1]) for out, _ in outputs)
    archived = count_rows(harness, archived=True)
    if runs != jobs or archived != jobs or count_rows(harness) != 0:
        raise BenchmarkFailure(
            f"{side.label}: {jobs} jobs loaded, handlers ran {runs} times, {archived} archived"
        )
    (t0, a0), (t1, a1) = marks
    return Drained((a1 - a0) / (t1 - t0), [err for _, err in outputs])


def _tell(children: list[subprocess.Popen[str]], word: str) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.write(word + "\n")
        child.stdin.flush()


CALLGRIND: Final = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")


def instructions_per_job(
    harness: Harness, dsn: str, side: Side, jobs: int, wrap: Sequence[str] = CALLGRIND
) -> float:
    """Client instructions a job costs `side`'s worker (one thread), counted by callgrind: two drains, of
    BASE_JOBS and of BASE_JOBS + `jobs`, so that start-up and shutdown cancel out of the difference."""
    counts = []
    for total in (BASE_JOBS, BASE_JOBS + jobs):
        (stderr,) = drain(harness, dsn, side, total, 1, 1, wrap).stderr
        match = COLLECTED.search(stderr)
        if match is None:
            raise BenchmarkFailure(f"{side.label}: valgrind printed no count: {stderr[-2000:]}")
        counts.append(int(match.group(1)))
    return (counts[1] - counts[0]) / jobs


def _window(harness: Harness, side: Side, jobs: int) -> tuple[tuple[float, int], tuple[float, int]]:
    """The first readings at or past 10% and 90% archived; then waits for the rest of the drain."""
    low, high = (int(jobs * f) for f in WINDOW)
    marks: list[tuple[float, int]] = []
    seen, deadline = -1, 0.0
    while True:
        archived = count_rows(harness, archived=True)
        now = time.monotonic()
        if archived > seen:
            seen, deadline = archived, now + STALL_TIMEOUT_S
        if not marks and archived >= low:
            marks.append((now, archived))
        if len(marks) == 1 and archived >= high and now > marks[0][0]:
            marks.append((now, archived))
        if archived >= jobs and len(marks) == 2:
            return marks[0], marks[1]
        if now > deadline:
            raise BenchmarkFailure(
                f"{side.label}: {archived} of {jobs} jobs archived, none more in {STALL_TIMEOUT_S:.0f} s"
            )
        time.sleep(0.005)


def compare(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"rev": args.rev, "jobs": args.jobs, "threads": args.threads}
    results["processes"] = args.processes
    with tempfile.TemporaryDirectory(prefix="versus-") as tmp:
        now = working_tree()
        sides = [export_rev(args.rev, Path(tmp)), now]
        if args.compact:
            sides.append(Side(f"{now.label}, compact plan", now.tree, compact=True))
        results["sides"] = [side.label for side in sides]
        if args.serializer:
            pairs = [(side.label, side.tree) for side in sides if not side.compact]
            results["serializer"] = serializer.compare(pairs, args.rounds, args.seconds)
            return results
        for dialect in args.backends.split(","):
            dsn = args.pg_dsn if dialect == "postgresql" else args.mysql_dsn
            spec = BackendSpec(f"conformance.builtin:{dialect}", {"dsn": dsn})
            with closing_harness(open_harness(spec, "versus", args.table_suffix)) as harness:
                results[dialect] = _rates(harness, dsn, dialect, sides, args)
                if args.instructions:
                    results[dialect]["instructions"] = {
                        side.label: instructions_per_job(harness, dsn, side, args.instructions)
                        for side in sides
                    }
                truncate(harness)
    return results


def _rates(
    harness: Harness, dsn: str, dialect: str, sides: list[Side], args: argparse.Namespace
) -> dict[str, Any]:
    """Each side's rate, round by round in turns, and each later side's paired ratio to the first."""
    then = sides[0].label
    rounds: list[dict[str, float]] = []
    for n in range(args.rounds):
        row = {
            side.label: drain(harness, dsn, side, args.jobs, args.threads, args.processes).rate
            for side in sides
        }
        rounds.append(row)
        rates = ", ".join(f"{label} {rate:,.0f} jobs/s" for label, rate in row.items())
        print(f"{dialect} round {n + 1}: {rates}", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {"rounds": rounds}
    for side in sides if rounds else ():
        summary[side.label] = {"median": statistics.median(r[side.label] for r in rounds)}
        if side.label != then:
            ratios = [r[side.label] / r[then] for r in rounds]
            summary[side.label].update(
                ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios)
            )
    return summary


def report(results: dict[str, Any], command: str) -> str:
    if "serializer" in results:
        return f"`{command}`\n\n" + serializer.compare_table(results["serializer"])
    then, *later = results["sides"]
    dialects = {key: value for key, value in results.items() if key in ("postgresql", "mysql")}
    rounds = len(next(iter(dialects.values()))["rounds"])
    lines = [f"`{command}`"]
    if rounds:
        lines += [
            "",
            f"{results['jobs']:,} no-op jobs drained by {results['processes']} process(es) x "
            f"{results['threads']} thread(s), one job a transaction, {rounds} rounds in turns",
            "",
            f"| database | version | jobs/s (median) | / {then} (median) | min | max |",
            "|---|---|---:|---:|---:|---:|",
        ]
    for dialect, row in dialects.items() if rounds else ():
        lines.append(f"| {dialect} | {then} | {row[then]['median']:,.0f} | | | |")
        for label in later:
            side = row[label]
            lines.append(
                f"| {dialect} | {label} | {side['median']:,.0f} | {side['ratio_median']:.2f} | "
                f"{side['ratio_min']:.2f} | {side['ratio_max']:.2f} |"
            )
    counted = {dialect: row["instructions"] for dialect, row in dialects.items() if "instructions" in row}
    if counted:
        lines += [
            "",
            "Client instructions per job (callgrind, one worker thread):",
            "",
            f"| database | version | instructions/job | {then} / version |",
            "|---|---|---:|---:|",
        ]
        for dialect, count in counted.items():
            for label in (then, *later):
                lines.append(
                    f"| {dialect} | {label} | {count[label]:,.0f} | {count[then] / count[label]:.2f} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.versus", description=__doc__)
    parser.add_argument("rev", help="the earlier commit (e.g. 48e59c3, where issue 14 was filed)")
    parser.add_argument("--backends", default="postgresql,mysql", help="postgresql, mysql or both")
    parser.add_argument("--pg-dsn", default=os.environ.get(PG_ENV) or DEFAULT_PG_DSN)
    parser.add_argument("--mysql-dsn", default=os.environ.get(MYSQL_ENV) or DEFAULT_MYSQL_DSN)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--table-suffix", default="")
    parser.add_argument(
        "--compact",
        action="store_true",
        help="also drain with the working tree's compact statement plan (compact=True), a third side",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        metavar="JOBS",
        help="also count each side's client instructions per job over JOBS jobs under valgrind",
    )
    parser.add_argument(
        "--serializer",
        action="store_true",
        help="compare the serializer benchmark (benchmarks/serializer.py) instead of draining jobs",
    )
    parser.add_argument(
        "--seconds", type=float, default=0.2, help="with --serializer: least duration of one timing"
    )
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    unknown = set(args.backends.split(",")) - {"postgresql", "mysql"}
    if unknown:
        parser.error(f"--backends: unknown {', '.join(sorted(unknown))}; expected postgresql, mysql")
    if args.serializer and (args.rounds < 1 or args.instructions or args.compact):
        parser.error(
            "--serializer needs --rounds of at least 1, and takes neither --instructions nor --compact"
        )
    if args.rounds < 0 or (args.rounds == 0 and not args.instructions):
        parser.error("--rounds must be at least 1, or 0 with --instructions (counts only)")
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind (Debian: apt-get install valgrind)")
    results = compare(args)
    command = "python -m benchmarks.versus " + " ".join(argv if argv is not None else sys.argv[1:])
    results["command"] = command
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
