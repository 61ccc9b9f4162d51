"""Poll latency against queue depth, with and without the (queue, process_at) index, plans recorded."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import (
    BENCH_QUEUE_TEXT,
    BackendSpec,
    Dialect,
    analyze,
    bulk_load,
    claim_sql,
    closing_harness,
    create_index,
    db_now,
    drop_index,
    job_table_of,
    open_harness,
    sql_dialect,
    summarize_ms,
    truncate,
)
from benchmarks.progress import Progress
from benchmarks.settings import Settings
from conformance.harness import Harness, SqlHarness
from proletarian_ref.backend import Backend

WARMUP_SAMPLES = 3
# The seed's claim, as a pass/fail figure: p99 at the deepest table within this factor of the shallowest.
INDEX_RATIO_LIMIT = 2.0


class _Rollback(Exception):
    """Raised inside the transaction so the backend rolls the claim back, leaving the row unlocked."""


def time_claims(backend: Backend, harness: Harness, samples: int, budget_s: float) -> list[float]:
    """Seconds per get_next_job call, each in its own transaction that is rolled back.

    Bounded by `samples` and by `budget_s` (at least a handful of samples are always taken).
    """
    job_table = job_table_of(harness)
    timings: list[float] = []
    deadline = time.monotonic() + budget_s
    for i in range(samples + WARMUP_SAMPLES):
        if i >= WARMUP_SAMPLES + 5 and time.monotonic() > deadline:
            break
        try:
            with backend.transaction() as conn:
                now = datetime.now(UTC)
                start = time.perf_counter()
                record = backend.get_next_job(conn, job_table, BENCH_QUEUE_TEXT, now)
                elapsed = time.perf_counter() - start
                if record is None:
                    raise RuntimeError("the poll benchmark's table has no due job in its queue")
                raise _Rollback
        except _Rollback:
            pass
        if i >= WARMUP_SAMPLES:
            timings.append(elapsed)
    return timings


def explain(harness: SqlHarness, dialect: Dialect) -> tuple[list[str], str]:
    """The claim's plan (PostgreSQL EXPLAIN ANALYZE, MariaDB ANALYZE, MySQL EXPLAIN) and a summary."""
    statement = claim_sql(dialect, harness)
    params = {"queue": BENCH_QUEUE_TEXT, "now": db_now(dialect)}
    if dialect == "postgresql":
        rows = harness.select(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", params)
        lines = [str(r[0]) for r in rows]
        return lines, _pg_summary(lines)
    version = str(harness.select("SELECT VERSION()")[0][0])
    prefix = "ANALYZE" if "mariadb" in version.lower() else "EXPLAIN"
    conn = harness.connect()
    try:
        cursor = conn.cursor()
        cursor.execute("SET time_zone = '+00:00'")
        cursor.execute(f"{prefix} {statement}", params)
        names = [d[0] for d in cursor.description]
        table = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        cursor.close()
        conn.rollback()
    finally:
        conn.close()
    lines = [", ".join(f"{k}={v}" for k, v in row.items()) for row in table]
    summary = "; ".join(
        f"type={row.get('type')} key={row.get('key')} rows={row.get('rows')}"
        + (f" r_rows={row['r_rows']}" if "r_rows" in row else "")
        + f" {row.get('Extra') or ''}".rstrip()
        for row in table
    )
    return lines, summary


def _pg_summary(lines: list[str]) -> str:
    nodes: list[str] = []
    removed = ""
    for line in lines:
        text = line.strip().removeprefix("->").strip()
        if "(cost=" in text:
            nodes.append(text.split("  (cost=")[0])
        if text.startswith("Rows Removed by Filter:"):
            removed = text
    return " > ".join(nodes) + (f" ({removed})" if removed else "")


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    harness = open_harness(spec, "poll", settings.table_suffix)
    with closing_harness(harness):
        dialect = sql_dialect(harness)
        index_control = dialect is not None
        backend = harness.backend()
        cells: list[dict[str, Any]] = []
        loaded = 0
        steps = len(settings.depths) * (2 if index_control else 1)
        task = progress.task(f"{harness.name}: poll latency", steps)
        for depth in settings.depths:
            load_start = time.perf_counter()
            if index_control:
                drop_index(harness)
            bulk_load(harness, loaded, depth, "mixed")
            loaded = depth
            analyze(harness)
            load_s = time.perf_counter() - load_start
            variants: list[bool | None] = [False, True] if index_control else [None]
            for indexed in variants:
                if indexed:
                    create_index(harness)
                    analyze(harness)
                samples = settings.claim_samples if indexed is not False else settings.noindex_samples
                budget = settings.claim_budget_s if indexed is not False else settings.noindex_budget_s
                progress.describe(task, f"{harness.name}: poll latency, {depth:,} rows, index={indexed}")
                cell: dict[str, Any] = {
                    "depth": depth,
                    "indexed": indexed,
                    "load_s": round(load_s, 3),
                    **summarize_ms(time_claims(backend, harness, samples, budget)),
                }
                if dialect is not None and isinstance(harness, SqlHarness):
                    cell["plan"], cell["plan_summary"] = explain(harness, dialect)
                cells.append(cell)
                progress.advance(task)
        progress.done(task)
        # A million rows are no use to anyone once measured.
        truncate(harness)
        return {
            "backend": harness.name,
            "factory": spec.factory,
            "index_control": index_control
            or "skipped: not a built-in dialect, so the index cannot be dropped; figures are as installed",
            "cells": cells,
            "index_check": index_check(cells),
        }


def index_check(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """p99 at the deepest depth over p99 at the shallowest, with the index (and without, for contrast)."""
    out: dict[str, Any] = {"limit": INDEX_RATIO_LIMIT}
    for label, indexed in (("indexed", True), ("no_index", False), ("as_installed", None)):
        rows = sorted((c for c in cells if c["indexed"] is indexed), key=lambda c: c["depth"])
        if len(rows) < 2:
            continue
        low, high = rows[0], rows[-1]
        ratio = high["p99_ms"] / low["p99_ms"] if low["p99_ms"] > 0 else float("inf")
        out[label] = {
            "from_depth": low["depth"],
            "to_depth": high["depth"],
            "p99_from_ms": low["p99_ms"],
            "p99_to_ms": high["p99_ms"],
            "ratio": ratio,
            "pass": ratio <= INDEX_RATIO_LIMIT,
            # The median is the steadier figure on a busy machine; p99 is the one the target names.
            "p50_ratio": high["p50_ms"] / low["p50_ms"] if low["p50_ms"] > 0 else float("inf"),
        }
    return out
