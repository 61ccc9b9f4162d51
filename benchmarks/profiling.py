"""Where a job's time goes: cProfile of the library's poll path and of the raw loop, one thread each."""

from __future__ import annotations

import cProfile
import io
import pstats
import threading
import time
from collections import defaultdict
from typing import Any

from benchmarks.common import BENCH_QUEUE, analyze, bulk_load, require_sql, truncate
from benchmarks.raw import RawStatements, claim_one, raw_connection
from conformance.harness import Harness
from proletarian_ref.log import stdlib_logger
from proletarian_ref.worker import job_settings, run_next_job

TOP = 30


class OneJob:
    """One job, claimed, run by a no-op handler and archived, on the library's path or the raw loop's.

    Each method returns False when no job was due.
    """

    def __init__(self, harness: Harness) -> None:
        sql_harness, self._dialect = require_sql(harness)
        self._backend = harness.backend()
        self._settings = job_settings(self._backend, queue=BENCH_QUEUE, **harness.table_options)
        self._stop = threading.Event()
        self._conn = raw_connection(sql_harness, self._dialect)
        self._cursor = self._conn.cursor()
        self._statements = RawStatements.of(sql_harness, self._dialect)

    @staticmethod
    def _handler(job_type: str, payload: Any) -> None:
        return None

    def library(self) -> bool:
        ran = run_next_job(self._backend, self._settings, self._handler, stdlib_logger, {}, self._stop)
        return ran is not None

    def raw(self) -> bool:
        return claim_one(self._conn, self._cursor, self._statements, self._dialect, lambda: None)

    def close(self) -> None:
        self._cursor.close()
        self._conn.close()
        self._backend.close()


# Buckets by source file, so "where the time goes" reads as library / driver / waiting on the server.
_BUCKETS = (
    ("proletarian_ref/", "proletarian_ref"),
    ("/transit/", "transit (payload decode)"),
    ("/psycopg/", "psycopg (Python, incl. waiting)"),
    ("/psycopg_binary/", "psycopg (C part)"),
    ("/pymysql/", "PyMySQL"),
    ("/logging/", "stdlib logging"),
    ("datetime", "datetime"),
    ("uuid", "uuid"),
    ("threading", "threading"),
    ("contextlib", "contextlib"),
)


def _bucket(filename: str, function: str) -> str:
    if filename == "~":
        # Built-ins: the socket waits are the round trips to the server.
        if "recv" in function or "select" in function or "poll" in function or "wait" in function:
            return "waiting on the server (socket/select)"
        return f"built-in {function}"
    for needle, label in _BUCKETS:
        if needle in filename:
            return label
    return "other Python"


def _stats_report(profile: cProfile.Profile, jobs: int) -> tuple[dict[str, float], str]:
    stats = pstats.Stats(profile)
    buckets: dict[str, float] = defaultdict(float)
    raw_stats: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, function), (_cc, _nc, tottime, _ct, _callers) in raw_stats.items():
        buckets[_bucket(filename, function)] += tottime
    per_job_us = {k: round(v / jobs * 1e6, 2) for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])}
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(TOP)
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(TOP)
    return per_job_us, text.getvalue()


CHUNKS = 10


def _interleaved(
    paths: dict[str, Any], jobs: int, profiles: dict[str, cProfile.Profile] | None
) -> dict[str, tuple[float, float]]:
    """Wall and thread CPU seconds per path, alternating in chunks so that drift hits both alike."""
    wall = dict.fromkeys(paths, 0.0)
    cpu = dict.fromkeys(paths, 0.0)
    per_chunk = max(1, jobs // CHUNKS)
    names = list(paths)
    for chunk in range(CHUNKS):
        for name in names if chunk % 2 == 0 else names[::-1]:
            once = paths[name]
            profile = profiles[name] if profiles is not None else None
            start, start_cpu = time.perf_counter(), time.thread_time()
            if profile is not None:
                profile.enable()
            for _ in range(per_chunk):
                once()
            if profile is not None:
                profile.disable()
            wall[name] += time.perf_counter() - start
            cpu[name] += time.thread_time() - start_cpu
    return {name: (wall[name], cpu[name]) for name in names}


def profile_paths(harness: Harness, jobs: int) -> dict[str, Any]:
    """µs per job on one thread, unprofiled, for the library and the raw loop; then cProfile of each."""
    result: dict[str, Any] = {"jobs": jobs}
    texts: dict[str, str] = {}

    one_job = OneJob(harness)

    def library_once() -> None:
        if not one_job.library():
            raise RuntimeError("profiling ran out of jobs")

    def raw_once() -> None:
        if not one_job.raw():
            raise RuntimeError("profiling ran out of jobs")

    paths = {"library": library_once, "raw": raw_once}
    jobs = max(CHUNKS, jobs - jobs % CHUNKS)
    try:
        truncate(harness)
        # Both paths claim from one queue: enough for the timed pass, the profiled pass and the warm-up.
        bulk_load(harness, 0, 4 * jobs + 10, "due")
        analyze(harness)
        for once in paths.values():
            once()  # Connect and warm caches outside the timings.
        plain = _interleaved(paths, jobs, None)
        profiles = {name: cProfile.Profile() for name in paths}
        profiled = _interleaved(paths, jobs, profiles)
        for name in paths:
            buckets, texts[name] = _stats_report(profiles[name], jobs)
            result[name] = {
                "us_per_job": round(plain[name][0] / jobs * 1e6, 1),
                # CPU time of the polling thread: what the Python code costs, apart from waiting on the
                # server, and so much less sensitive to what else the machine is doing.
                "cpu_us_per_job": round(plain[name][1] / jobs * 1e6, 1),
                "us_per_job_profiled": round(profiled[name][0] / jobs * 1e6, 1),
                "tottime_us_per_job_by_source": buckets,
            }
    finally:
        one_job.close()
        truncate(harness)
    result["library_cpu_over_raw_us_per_job"] = round(
        result["library"]["cpu_us_per_job"] - result["raw"]["cpu_us_per_job"], 1
    )
    result["library_over_raw_us_per_job"] = round(
        result["library"]["us_per_job"] - result["raw"]["us_per_job"], 1
    )
    result["text"] = texts
    return result
