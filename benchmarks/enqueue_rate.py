"""Enqueue rate on one connection, one job, a batch or an enqueue_many per transaction, against raw SQL.

The library's variants run without notify (Proletarian's statements only, as the raw loop); the
`_notify` variants add the wake-up announcement (pg_notify on PostgreSQL), interleaved with them, so the
ratio of the two is what notify costs an enqueuer.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.common import (
    BENCH_JOB_TYPE,
    BENCH_QUEUE,
    BackendSpec,
    closing_harness,
    open_harness,
    require_sql,
    sql_dialect,
    timed_transactions,
    truncate,
)
from benchmarks.latency import announces
from benchmarks.progress import Progress
from benchmarks.raw import raw_enqueue, raw_enqueue_batched
from benchmarks.settings import Settings
from benchmarks.workers import raw_skip_reason
from conformance.harness import Harness
from proletarian_ref import enqueue, enqueue_many
from proletarian_ref.backend import Backend


def library_enqueue(
    harness: Harness,
    per_transaction: int,
    window_s: float,
    max_jobs: int,
    backend: Backend | None,
    notify: bool = False,
) -> tuple[int, float]:
    """Jobs enqueued through proletarian_ref.enqueue and seconds taken, bounded by count and time.

    With `backend` None the library finds the backend from the connection on every call, as an
    application that passes only its connection does.
    """

    def one_transaction(conn: Any, first: int) -> None:
        for _ in range(per_transaction):
            enqueue(
                conn,
                BENCH_JOB_TYPE,
                {"i": first},
                queue=BENCH_QUEUE,
                job_table=harness.job_table,
                backend=backend,
                notify=notify,
            )

    return _timed_transactions(harness, per_transaction, window_s, max_jobs, one_transaction)


def library_enqueue_many(
    harness: Harness,
    per_transaction: int,
    window_s: float,
    max_jobs: int,
    backend: Backend | None,
    notify: bool = False,
) -> tuple[int, float]:
    """Jobs enqueued through one proletarian_ref.enqueue_many call per transaction, and seconds taken."""

    def one_transaction(conn: Any, first: int) -> None:
        enqueue_many(
            conn,
            [(BENCH_JOB_TYPE, {"i": first + n}) for n in range(per_transaction)],
            queue=BENCH_QUEUE,
            job_table=harness.job_table,
            backend=backend,
            notify=notify,
        )

    return _timed_transactions(harness, per_transaction, window_s, max_jobs, one_transaction)


def _timed_transactions(
    harness: Harness,
    per_transaction: int,
    window_s: float,
    max_jobs: int,
    one_transaction: Callable[[Any, int], None],
) -> tuple[int, float]:
    """timed_transactions on a new caller connection of the harness, as an application's."""
    conn = harness.connect()
    try:
        return timed_transactions(
            conn, per_transaction, window_s, max_jobs, lambda first: one_transaction(conn, first)
        )
    finally:
        conn.close()


def _many_row(
    harness: Harness, settings: Settings, progress: Progress, raw_reason: str | None
) -> dict[str, Any]:
    """enqueue_many of settings.enqueue_many_batch jobs a transaction against the driver's batched insert."""
    per_txn = settings.enqueue_many_batch
    # On PostgreSQL the raw batch is COPY, the driver's fastest; its executemany (the batched INSERT most
    # code writes) is measured beside it. On MySQL executemany is the raw batch already.
    raws = [] if raw_reason else ["raw_batched"]
    if raws and sql_dialect(harness) == "postgresql":
        raws.append("raw_executemany")
    variants = ["library_many", *_notify_variant(harness, "library_many"), *raws]
    rounds = max(1, settings.throughput_rounds)
    task = progress.task(f"{harness.name}: enqueue_many rate", len(variants) * rounds)
    row: dict[str, Any] = {"jobs_per_transaction": per_txn}
    window = settings.enqueue_window_s / rounds
    # At least two transactions a round, so a round is never one commit's noise.
    max_jobs = max(settings.enqueue_max_jobs, 2 * per_txn)
    for round_ in range(rounds):
        for variant in variants if round_ % 2 == 0 else variants[::-1]:
            progress.describe(task, f"{harness.name}: enqueue_many {per_txn}/txn {variant}")
            truncate(harness)
            if variant.startswith("raw_"):
                sql_harness, dialect = require_sql(harness)
                count, elapsed = raw_enqueue_batched(
                    sql_harness, dialect, per_txn, window, max_jobs, copy=variant == "raw_batched"
                )
            else:
                notify = variant.endswith("_notify")
                count, elapsed = library_enqueue_many(harness, per_txn, window, max_jobs, None, notify)
            row.setdefault(f"{variant}_rounds", []).append(count / elapsed if elapsed > 0 else 0.0)
            progress.advance(task)
    for variant in variants:
        row[f"{variant}_jobs_per_s"] = statistics.median(row[f"{variant}_rounds"])
    if row.get("raw_batched_jobs_per_s", 0) > 0:
        row["ratio"] = row["library_many_jobs_per_s"] / row["raw_batched_jobs_per_s"]
    if row.get("raw_executemany_jobs_per_s", 0) > 0:
        row["ratio_executemany"] = row["library_many_jobs_per_s"] / row["raw_executemany_jobs_per_s"]
    _notify_ratio(row, "library_many")
    progress.done(task)
    return row


def _notify_variant(harness: Harness, variant: str) -> list[str]:
    """`variant` with notify, where the backend announces enqueued jobs (PostgreSQL, not MySQL)."""
    return [f"{variant}_notify"] if announces(harness) else []


def _notify_ratio(row: dict[str, Any], variant: str) -> None:
    """Round by round (the two ran next to each other), what notify leaves of the rate: with / without."""
    with_notify = row.get(f"{variant}_notify_rounds")
    if with_notify:
        pairs = zip(with_notify, row[f"{variant}_rounds"], strict=True)
        row["notify_ratio"] = statistics.median(a / b for a, b in pairs if b > 0)


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    harness = open_harness(spec, "enq", settings.table_suffix)
    with closing_harness(harness):
        raw_reason = raw_skip_reason(harness)
        sizes = (1, settings.enqueue_batch)
        variants = ["library", *_notify_variant(harness, "library"), "library_backend_reused"] + (
            [] if raw_reason else ["raw"]
        )
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
                            harness,
                            per_txn,
                            window,
                            settings.enqueue_max_jobs,
                            backend,
                            notify=variant == "library_notify",
                        )
                    row.setdefault(f"{variant}_rounds", []).append(count / elapsed if elapsed > 0 else 0.0)
                    progress.advance(task)
            for variant in variants:
                row[f"{variant}_jobs_per_s"] = statistics.median(row[f"{variant}_rounds"])
            if "raw_jobs_per_s" in row and row["raw_jobs_per_s"] > 0:
                row["ratio"] = row["library_jobs_per_s"] / row["raw_jobs_per_s"]
                row["ratio_backend_reused"] = row["library_backend_reused_jobs_per_s"] / row["raw_jobs_per_s"]
            _notify_ratio(row, "library")
            rows.append(row)
        truncate(harness)
        progress.done(task)
        many = _many_row(harness, settings, progress, raw_reason)
        truncate(harness)
        out: dict[str, Any] = {"backend": harness.name, "factory": spec.factory, "rows": rows, "many": many}
        if raw_reason:
            out["raw_skipped"] = raw_reason
        return out
