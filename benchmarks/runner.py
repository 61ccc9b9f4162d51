"""Runs the chosen benchmarks on every backend in turn, writes the report, fails loudly on bad results."""

from __future__ import annotations

import time
import traceback
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from benchmarks import (
    enqueue_rate,
    latency,
    load_test,
    long_handlers,
    memory,
    peers,
    poll_latency,
    serializer,
    throughput,
)
from benchmarks.common import BackendSpec, BenchmarkFailure
from benchmarks.machine import describe, machine
from benchmarks.progress import Progress
from benchmarks.report import write
from benchmarks.settings import ALL_BENCHMARKS, Settings

# Benchmarks that use no database: run with the first backend only.
ONCE_PER_RUN: Final = frozenset({"serializer"})


def _one(
    name: str, spec: BackendSpec, settings: Settings, progress: Progress, out_dir: Path
) -> dict[str, Any]:
    if name == "poll_latency":
        return poll_latency.run(spec, settings, progress)
    if name == "throughput":
        return throughput.run(spec, settings, progress)
    if name == "enqueue_rate":
        return enqueue_rate.run(spec, settings, progress)
    if name == "latency":
        return latency.run(spec, settings, progress)
    if name == "memory":
        return memory.run(spec, settings, progress)
    if name == "locust":
        return load_test.run(spec, settings, progress, out_dir)
    if name == "peers":
        return peers.run(spec, settings, progress)
    if name == "long_handlers":
        return long_handlers.run(spec, settings, progress)
    if name == "serializer":
        return serializer.run(spec, settings, progress)
    raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(ALL_BENCHMARKS)}")


def failures(results: dict[str, Any]) -> list[str]:
    """What makes the run fail: a benchmark that raised, or a locust run whose jobs were not archived once."""
    found: list[str] = []
    for name, entries in results["benchmarks"].items():
        for e in entries:
            who = f"{name} on {e.get('backend') or e.get('factory')}"
            if "error" in e:
                found.append(f"{who} raised {e['error']}")
            verification = e.get("verification")
            if verification is not None and not verification["ok"]:
                found.append(f"{who}: jobs not archived exactly once: {'; '.join(verification['problems'])}")
    return found


def run_all(
    backends: list[BackendSpec], settings: Settings, out_dir: Path, progress: Progress
) -> dict[str, Any]:
    """Run everything, write the report to `out_dir`, and raise BenchmarkFailure if anything went wrong."""
    started = time.perf_counter()
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": asdict(settings),
        "backends": [asdict(b) for b in backends],
        "meta": describe(backends),
        "benchmarks": {name: [] for name in settings.benchmarks},
    }
    once = [name for name in settings.benchmarks if name in ONCE_PER_RUN]
    per_backend = [name for name in settings.benchmarks if name not in ONCE_PER_RUN]
    overall = progress.task("benchmarks", len(backends) * len(per_backend) + len(once))
    for index, spec in enumerate(backends):
        for name in settings.benchmarks:
            if name in ONCE_PER_RUN and index:
                continue
            progress.describe(overall, f"{spec.factory}: {name}")
            bench_start = time.perf_counter()
            try:
                entry = _one(name, spec, settings, progress, out_dir)
            except Exception as exc:
                entry = {"factory": spec.factory, "error": f"{type(exc).__name__}: {exc}"}
                entry["traceback"] = traceback.format_exc()
                progress.log(f"[red]{spec.factory} {name} failed: {exc}")
            entry["duration_s"] = round(time.perf_counter() - bench_start, 2)
            results["benchmarks"][name].append(entry)
            progress.advance(overall)
    results["duration_s"] = round(time.perf_counter() - started, 2)
    results["meta"]["machine_at_end"] = machine()
    problems = failures(results)
    results["failures"] = problems
    write(results, out_dir)
    if problems:
        raise BenchmarkFailure("benchmark run failed:\n  " + "\n  ".join(problems))
    return results
