"""Where a drain's time goes (issue 31): wait events, run-queue delay and CPU per job of one PostgreSQL drain.

`python -m benchmarks.limit_probe --dsn DSN --point 4x4x10 [--factory postgresql_pipeline] --out FILE.json`
tops up a queue, drains it with the library's worker at processes x threads x jobs a commit, and during
the measured window samples, every few milliseconds, the drain's own backends in pg_stat_activity (state,
wait event), and reads /proc/<pid>/schedstat of every client thread and every backend: the CPU time and
the time spent runnable but waiting for a core (the run queue). Per job, those say whether the CPU (client
or server), the locks, or the scheduler's queue on a loaded machine bound the drain.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import resource
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import psutil

from benchmarks.common import BackendSpec, open_harness, require_sql
from benchmarks.costs import _client_ports
from benchmarks.server_limit import limit_rate
from benchmarks.throughput import QueueFiller
from benchmarks.workers import DrainRun

# The threaded poll loop looks its run function up in its own module (generated from _async/poll_loop.py).
from proletarian_ref._sync import poll_loop as poll_loop_module


def schedstat(pids: list[int], threads: bool) -> tuple[float, float]:
    """Seconds on a core and seconds runnable in the run queue, summed over `pids` (and their threads)."""
    on_cpu = waiting = 0.0
    for pid in pids:
        tasks = [f"/proc/{pid}/task/{t}" for t in os.listdir(f"/proc/{pid}/task")] if threads else []
        for path in tasks or [f"/proc/{pid}"]:
            with contextlib.suppress(OSError):
                fields = Path(path, "schedstat").read_text().split()
                on_cpu += int(fields[0]) / 1e9
                waiting += int(fields[1]) / 1e9
    return on_cpu, waiting


@contextlib.contextmanager
def _counting_claims(batch: int) -> Iterator[collections.Counter[str]]:
    """In this process, every claim the worker makes, and those that found nothing (each followed by an
    idle wait of the polling interval): the poll loop's share of the window."""
    claims: collections.Counter[str] = collections.Counter()
    name = "run_next_job" if batch == 1 else "run_next_batch"
    original = getattr(poll_loop_module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        ran = original(*args, **kwargs)
        claims["claims" if ran is not None else "empty"] += 1
        return ran

    setattr(poll_loop_module, name, counted)
    try:
        yield claims
    finally:
        setattr(poll_loop_module, name, original)


def probe(
    dsn: str,
    factory: str,
    point: tuple[int, int, int],
    window_s: float,
    preload: int,
    suffix: str = "_limitprobe",
) -> dict[str, Any]:
    processes, threads, batch = point
    spec = BackendSpec(f"conformance.builtin:{factory}", {"dsn": dsn})
    harness = open_harness(spec, "probe", suffix)
    filler = QueueFiller(harness, preload)
    filler.top_up()
    run = DrainRun(harness, spec, "library", processes, threads, 100.0, batch_size=batch)
    sql_harness, _ = require_sql(harness)
    watcher = sql_harness.connect()
    watcher.autocommit = True
    samples: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    claiming: contextlib.AbstractContextManager[collections.Counter[str]] = (
        _counting_claims(batch) if processes == 1 else contextlib.nullcontext(collections.Counter())
    )
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(harness.close)
        cleanup.callback(watcher.close)
        claims: collections.Counter[str] = cleanup.enter_context(claiming)
        cleanup.callback(run.stop)
        cleanup.callback(stop.set)
        run.start()
        while run.count == 0:
            time.sleep(0.01)
        time.sleep(0.3)
        ports = sorted(_client_ports(run.pids, watcher.info.port))
        backends = [
            int(r[0])
            for r in watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", (ports,)
            ).fetchall()
        ]

        def sample() -> None:
            while not stop.is_set():
                for state, wtype, wevent in watcher.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity WHERE pid = ANY(%s)",
                    (backends,),
                ).fetchall():
                    samples[f"{state}|{wtype}:{wevent}"] += 1
                time.sleep(0.005)

        claims.clear()
        c0, t0 = run.count, time.perf_counter()
        client0, server0 = schedstat(run.pids, True), schedstat(backends, False)
        sampler = threading.Thread(target=sample)
        sampler.start()
        time.sleep(window_s)
        stop.set()
        sampler.join()
        client1, server1 = schedstat(run.pids, True), schedstat(backends, False)
        c1, t1 = run.count, time.perf_counter()
        polls = dict(claims)
    jobs = c1 - c0
    if jobs <= 0 or c1 >= preload:
        raise RuntimeError(f"the queue of {preload} jobs ran dry before the window ended: a larger --preload")
    total = sum(samples.values())
    return {
        "point": list(point),
        "factory": factory,
        "jobs": jobs,
        "seconds": round(t1 - t0, 3),
        "jobs_per_s": jobs / (t1 - t0),
        "per_job_us": {
            "client_cpu": (client1[0] - client0[0]) / jobs * 1e6,
            "client_runqueue": (client1[1] - client0[1]) / jobs * 1e6,
            "server_cpu": (server1[0] - server0[0]) / jobs * 1e6,
            "server_runqueue": (server1[1] - server0[1]) / jobs * 1e6,
        },
        "polls": polls if processes == 1 else None,
        "backend_states": {k: round(v / total, 3) for k, v in samples.most_common()},
        "load_average": list(psutil.getloadavg()),
    }


def probe_limit(dsn: str, point: tuple[int, int, int], seconds: int, preload: int) -> dict[str, Any]:
    """The server's limit (pgbench of the CTE) at the point, with pgbench's CPU and its backends' per job."""
    processes, threads, batch = point
    spec = BackendSpec("conformance.builtin:postgresql", {"dsn": dsn})
    harness = open_harness(spec, "probe", "_limitprobe")
    QueueFiller(harness, preload).top_up()
    sql_harness, _ = require_sql(harness)
    watcher = sql_harness.connect()
    watcher.autocommit = True
    last: dict[int, tuple[float, float]] = {}
    done: list[dict[str, Any]] = []
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        runner = threading.Thread(
            target=lambda: done.append(limit_rate(harness, processes * threads, batch, seconds, 0.0))
        )
        runner.start()
        while runner.is_alive():
            pids = [
                int(r[0])
                for r in watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench'"
                ).fetchall()
            ]
            for pid in pids:
                stat = schedstat([pid], False)
                if stat != (0.0, 0.0):
                    last[pid] = stat
            time.sleep(0.02)
        runner.join()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        watcher.close()
        harness.close()
    result = done[0]
    jobs = result["jobs"]
    client = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {
        "point": list(point),
        "factory": "limit",
        "jobs": jobs,
        "jobs_per_s": result["jobs_per_s"],
        "per_job_us": {
            "client_cpu": client / jobs * 1e6,
            "server_cpu": sum(v[0] for v in last.values()) / jobs * 1e6,
            "server_runqueue": sum(v[1] for v in last.values()) / jobs * 1e6,
        },
        "load_average": list(psutil.getloadavg()),
    }


def table(results: list[dict[str, Any]]) -> str:
    """The probe's markdown table: medians over the rounds of each (point, drain), and each of library
    jobs/s over the same round's limit."""
    groups: dict[tuple[tuple[int, ...], str], list[dict[str, Any]]] = collections.defaultdict(list)
    for result in results:
        groups[(tuple(result["point"]), result["factory"])].append(result)
    lines = [
        "| processes x threads x jobs/commit | drain | jobs/s | of limit | client CPU µs/job | "
        "client run queue µs/job | server CPU µs/job | server run queue µs/job | backends waiting on "
        "the client | on a lock | empty claims |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (point, factory), runs in groups.items():
        limits = [r for r in results if tuple(r["point"]) == point and r["factory"] == "limit"]
        ratios = [run["jobs_per_s"] / lim["jobs_per_s"] for run, lim in zip(runs, limits, strict=False)]
        per_job = {k: statistics.median(r["per_job_us"].get(k, math.nan) for r in runs) for k in _COSTS}
        states = [r.get("backend_states") or {} for r in runs]
        client = statistics.median(sum(v for k, v in s.items() if "ClientRead" in k) for s in states)
        locked = statistics.median(sum(v for k, v in s.items() if "|Lock:" in k) for s in states)
        polls = [r["polls"] for r in runs if r.get("polls")]
        empty = f"{sum(p.get('empty', 0) for p in polls)} of {sum(sum(p.values()) for p in polls)}"
        cells = [
            "x".join(str(n) for n in point),
            factory,
            f"{statistics.median(r['jobs_per_s'] for r in runs):,.0f}",
            "-" if factory == "limit" else f"{statistics.median(ratios):.2f}",
            *("-" if math.isnan(per_job[k]) else f"{per_job[k]:,.0f}" for k in _COSTS),
            "-" if factory == "limit" else f"{client:.2f}",
            "-" if factory == "limit" else f"{locked:.3f}",
            empty if polls else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_COSTS: Final = ("client_cpu", "client_runqueue", "server_cpu", "server_runqueue")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limit_probe", description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--table", type=Path, help="print the table of a probe's JSON and exit")
    parser.add_argument("--factory", default="postgresql")
    parser.add_argument("--point", action="append", help="PxT or PxTxN; repeatable")
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--preload", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text(encoding="utf-8"))))
        return
    if not args.dsn or not args.point:
        parser.error("--dsn and --point are needed to probe")
    results = []
    for _ in range(args.rounds):
        for text in args.point:
            parts = [int(p) for p in text.split("x")]
            point = (parts[0], parts[1], parts[2] if len(parts) > 2 else 1)
            for factory in args.factory.split(","):
                if factory == "limit":
                    result = probe_limit(args.dsn, point, max(1, round(args.window)), args.preload)
                else:
                    result = probe(args.dsn, factory, point, args.window, args.preload)
                print(json.dumps(result), flush=True)
                results.append(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
