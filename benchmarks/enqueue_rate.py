"""Enqueue rate on one connection, one job or a batch per transaction, against the raw-driver loop."""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.common import (
    BENCH_JOB_TYPE,
    BENCH_QUEUE,
    BackendSpec,
    closing_harness,
    open_harness,
    require_sql,
    truncate,
)
from benchmarks.progress import Progress
from benchmarks.raw import raw_enqueue
from benchmarks.settings import Settings
from benchmarks.workers import raw_skip_reason
from conformance.harness import Harness
from proletarian_ref import enqueue
from proletarian_ref.backend import Backend


def library_enqueue(
    harness: Harness, per_transaction: int, window_s: float, max_jobs: int, backend: Backend | None
) -> tuple[int, float]:
    """Jobs enqueued through proletarian_ref.enqueue and seconds taken, bounded by count and time.

    With `backend` None the library finds the backend from the connection on every call, as an
    application that passes only its connection does.
    """
    conn = harness.connect()
    try:
        count = 0
        start = time.perf_counter()
        deadline = start + window_s
        while count < max_jobs and time.perf_counter() < deadline:
            for _ in range(per_transaction):
                enqueue(
                    conn,
                    BENCH_JOB_TYPE,
                    {"i": count},
                    queue=BENCH_QUEUE,
                    job_table=harness.job_table,
                    backend=backend,
                )
            conn.commit()
            count += per_transaction
        return count, time.perf_counter() - start
    finally:
        conn.close()


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    harness = open_harness(spec, "enq", settings.table_suffix)
    with closing_harness(harness):
        raw_reason = raw_skip_reason(harness)
        sizes = (1, settings.enqueue_batch)
        variants = ["library", "library_backend_reused"] + ([] if raw_reason else ["raw"])
        rounds = max(1, settings.throughput_rounds)
        task = progress.task(f"{harness.name}: enqueue rate", len(sizes) * len(variants) * rounds)
        rows: list[dict[str, Any]] = []
        shared_backend = harness.backend()
        for per_txn in sizes:
            row: dict[str, Any] = {"jobs_per_transaction": per_txn}
            window = settings.enqueue_window_s / rounds
            for round_ in range(rounds):
                for variant in variants if round_ % 2 == 0 else variants[::-1]:
                    progress.describe(task, f"{harness.name}: enqueue {per_txn}/txn {variant}")
                    truncate(harness)
                    if variant == "raw":
                        sql_harness, dialect = require_sql(harness)
                        count, elapsed = raw_enqueue(
                            sql_harness, dialect, per_txn, window, settings.enqueue_max_jobs
                        )
                    else:
                        backend = shared_backend if variant == "library_backend_reused" else None
                        count, elapsed = library_enqueue(
                            harness, per_txn, window, settings.enqueue_max_jobs, backend
                        )
                    row.setdefault(f"{variant}_rounds", []).append(count / elapsed if elapsed > 0 else 0.0)
                    progress.advance(task)
            for variant in variants:
                row[f"{variant}_jobs_per_s"] = statistics.median(row[f"{variant}_rounds"])
            if "raw_jobs_per_s" in row and row["raw_jobs_per_s"] > 0:
                row["ratio"] = row["library_jobs_per_s"] / row["raw_jobs_per_s"]
                row["ratio_backend_reused"] = row["library_backend_reused_jobs_per_s"] / row["raw_jobs_per_s"]
            rows.append(row)
        truncate(harness)
        progress.done(task)
        out: dict[str, Any] = {"backend": harness.name, "factory": spec.factory, "rows": rows}
        if raw_reason:
            out["raw_skipped"] = raw_reason
        return out
