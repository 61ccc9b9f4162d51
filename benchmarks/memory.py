"""A worker's resident memory over a long drain (100k jobs): sampled start, middle and end, and the peak."""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

from benchmarks.common import (
    BackendSpec,
    analyze,
    bulk_load,
    closing_harness,
    count_rows,
    open_harness,
    truncate,
)
from benchmarks.progress import Progress
from benchmarks.settings import Settings
from benchmarks.workers import DrainRun, processes_skip_reason

SAMPLE_EVERY_S = 0.25
# "Flat", as a pass/fail figure: the end within this much of the start (fraction, and at least MiB).
FLAT_FRACTION = 0.10
FLAT_MIN_MIB = 8.0
MIB = 1024 * 1024


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    harness = open_harness(spec, "mem", settings.table_suffix)
    with closing_harness(harness):
        total = settings.memory_jobs
        bulk_load(harness, 0, total, "due")
        analyze(harness)
        # A worker of its own process, so the RSS is the worker's alone; the in-memory backend cannot
        # leave this process, and then its figure includes the table it holds.
        in_child = processes_skip_reason(harness) is None
        drain = DrainRun(
            harness,
            spec,
            "library",
            1,
            settings.memory_threads,
            settings.polling_interval_ms,
            report_rss=True,
            in_child=in_child,
        )
        process = psutil.Process(drain.pids[0] if in_child else os.getpid())
        task = progress.task(f"{harness.name}: memory over {total:,} jobs", total)
        samples: list[dict[str, Any]] = []
        start = time.perf_counter()
        rss_idle = process.memory_info().rss
        drain.start()
        deadline = start + settings.memory_timeout_s
        try:
            while True:
                done = drain.count
                samples.append(
                    {
                        "t_s": round(time.perf_counter() - start, 3),
                        "jobs": done,
                        "rss": process.memory_info().rss,
                    }
                )
                progress.advance(task, done - (samples[-2]["jobs"] if len(samples) > 1 else 0))
                if done >= total or time.perf_counter() > deadline:
                    break
                time.sleep(SAMPLE_EVERY_S)
        finally:
            elapsed = time.perf_counter() - start
            peaks = drain.stop()
        progress.done(task)
        finished = samples[-1]["jobs"] >= total
        truncate(harness)
        return {
            "backend": harness.name,
            "factory": spec.factory,
            "jobs": total,
            "threads": settings.memory_threads,
            "separate_process": in_child,
            "finished": finished,
            "seconds": round(elapsed, 2),
            "jobs_per_s": samples[-1]["jobs"] / elapsed if elapsed > 0 else 0.0,
            **summarize_rss(rss_idle, samples, total, peaks),
            "samples": samples,
            "left_in_queue": count_rows(harness) if not finished else 0,
        }


def summarize_rss(
    rss_idle: int, samples: list[dict[str, Any]], total: int, peaks: list[int]
) -> dict[str, Any]:
    """RSS in MiB when the first jobs ran, at half way, at the end; the growth and the flatness verdict."""
    working = [s for s in samples if s["jobs"] > 0] or samples

    def at(fraction: float) -> float:
        target = total * fraction
        sample = next((s for s in working if s["jobs"] >= target), working[-1])
        return float(sample["rss"]) / MIB

    start, middle, end = float(working[0]["rss"]) / MIB, at(0.5), float(working[-1]["rss"]) / MIB
    sampled_peak = max(float(s["rss"]) for s in samples) / MIB
    growth = end - start
    return {
        "rss_before_start_mib": round(rss_idle / MIB, 2),
        "rss_start_mib": round(start, 2),
        "rss_middle_mib": round(middle, 2),
        "rss_end_mib": round(end, 2),
        "rss_peak_sampled_mib": round(sampled_peak, 2),
        "rss_peak_getrusage_mib": round(max(peaks) / MIB, 2) if peaks and max(peaks) > 0 else None,
        "growth_mib": round(growth, 2),
        "growth_second_half_mib": round(end - middle, 2),
        "flat": growth <= max(FLAT_MIN_MIB, FLAT_FRACTION * start),
    }
