"""The figures docs/benchmarks.md quotes for asyncpg beside psycopg are the named run's.

"asyncpg beside psycopg" pastes the variants of benchmarks/results/aio-speed2-2026-12-04/aio-speed.json
(python -m benchmarks.aio_speed) with each variant's paired ratio to the threaded drain of the same round;
these tests recompute each row and each claim, so a new run with stale prose fails here.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Final

from docs_support import prose, section

from benchmarks.aio_speed import paired, table

ROOT: Final = Path(__file__).resolve().parent.parent
RUN: Final = ROOT / "benchmarks" / "results" / "aio-speed2-2026-12-04"
SPEED: Final = json.loads((RUN / "aio-speed.json").read_text(encoding="utf-8"))
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
TARGET: Final = 1.3


def _section() -> str:
    return section(BENCHMARKS_MD, "### asyncpg beside psycopg: `aio-speed2-2026-12-04`", "\n### ")


def _prose() -> str:
    return prose(_section())


def _variants() -> dict[str, Any]:
    found: dict[str, Any] = SPEED["variants"]
    return found


def _paired(name: str) -> list[float]:
    return paired(SPEED, name)


def test_the_run_holds_asyncpg_beside_psycopg_and_the_threaded_worker() -> None:
    names = set(_variants())
    assert {"threaded", "asyncio", "asyncio asyncpg", "asyncio asyncpg compact"} <= names
    assert (SPEED["connections"], SPEED["jobs"], SPEED["rounds"]) == (8, 3000, 8)
    assert all(len(v["rounds_jobs_per_s"]) == SPEED["rounds"] for v in _variants().values())
    text = _prose()
    assert f"{SPEED['jobs']:,} jobs a drain, {SPEED['rounds']} rounds" in text
    assert f"load average {SPEED['load_average'][0]:.2f} at its end" in text


def test_the_table_is_the_runs_as_the_module_prints_it() -> None:
    section = _section()
    for line in table(SPEED).splitlines():
        assert line in section, line


def test_the_claims_and_the_verdict_are_the_runs() -> None:
    text = _prose()
    variants = _variants()
    base_cpu = variants["threaded"]["cpu_us_per_job"]
    asyncpg_cpu = variants["asyncio asyncpg"]["cpu_us_per_job"] / base_cpu
    psycopg_cpu = variants["asyncio"]["cpu_us_per_job"] / base_cpu
    # "on asyncpg ... less client CPU a job than the threaded worker ..., where on psycopg it spends more"
    assert asyncpg_cpu < 1.0 < psycopg_cpu
    assert f"({asyncpg_cpu:.2f}x on asyncio's own loop)" in text
    assert f"{statistics.median(_paired('asyncio asyncpg')):.2f}x the threaded one's (paired median)" in text
    others = [name for name in variants if name != "threaded"]
    best = max(others, key=lambda name: statistics.median(_paired(name)))
    best_ratio = statistics.median(_paired(best))
    assert f"the best variant, {best}, {best_ratio:.2f}x" in text
    verdict = "is **met**" if best_ratio >= TARGET else "is **not met** by any variant of this run"
    assert f"least 1.3x in default mode at 8 connections in one process, {verdict}" in text
    # "The client's CPU a job fell further than the drain rose" on the best variant.
    assert variants[best]["cpu_us_per_job"] / base_cpu < 1 / best_ratio
