"""The figures docs/benchmarks.md quotes from the reference run against the server's limit are that run's.

"The reference run against the limit" pastes the limit and per-job cost tables of
benchmarks/results/limit3-2026-12-04/results.md and quotes spans, verdicts and a CPU budget in prose; these
tests recompute each from the run's results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest
from docs_support import assert_pasted, prose, run_named, section, span, throughput_rows

ROOT: Final = Path(__file__).resolve().parent.parent
RUN: Final = ROOT / "benchmarks" / "results" / "limit3-2026-12-04"
RESULTS: Final = json.loads((RUN / "results.json").read_text(encoding="utf-8"))
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
TARGET: Final = 0.6
CORES: Final = 2


def _section() -> str:
    return section(BENCHMARKS_MD, "### The reference run against the limit: `limit3-2026-12-04`", "\n## ")


def _prose() -> str:
    return prose(_section())


def _bullet(start: str) -> str:
    text = _prose()
    at = text.index(start)
    return text[at : text.find(" - **", at + 1)]


def _rows(backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return throughput_rows(RESULTS, backend, batch=batch)


def _values(backend: str, key: str, *, batch: bool) -> list[float]:
    values = [r[key] for r in _rows(backend, batch=batch) if r.get(key) is not None]
    assert values, f"the run has no {key} on {backend}"
    return values


def _span(backend: str, key: str, *, batch: bool = False) -> str:
    return span(_values(backend, key, batch=batch))


def test_the_tables_pasted_are_the_runs() -> None:
    assert_pasted(RUN / "results.md", "#### Against the server's limit", _section(), must="async of limit")


def test_the_run_is_named_with_its_revision_its_machine_and_its_load() -> None:
    text = _prose()
    meta = RESULTS["meta"]
    assert not meta["git"]["dirty"]
    assert f"{meta['machine']['logical_cores']}-core {meta['machine']['cpu_model']}" in text
    for phrase in run_named(meta):
        assert phrase in text, phrase


@pytest.mark.parametrize(
    ("backend", "start", "quoted"),
    [
        (
            "mysql",
            "**MariaDB: met.**",
            [("compact", False), ("library", False), ("async", False), ("library", True)],
        ),
        (
            "postgresql",
            "**PostgreSQL: not met.**",
            [("library", False), ("compact", False), ("async", False), ("library", True), ("async", True)],
        ),
    ],
)
def test_each_databases_spans_and_verdict_are_the_runs(
    backend: str, start: str, quoted: list[tuple[str, bool]]
) -> None:
    bullet = _bullet(start)
    for drain, batch in quoted:
        assert _span(backend, f"{drain}_ratio_limit", batch=batch) in bullet, (drain, batch)
    # Met: every point reaches the target on the compact plan or the asyncio worker, and in batch mode.
    default = [max(r["compact_ratio_limit"], r["async_ratio_limit"]) for r in _rows(backend, batch=False)]
    batched = [max(r["library_ratio_limit"], r["async_ratio_limit"]) for r in _rows(backend, batch=True)]
    met = min(default) >= TARGET and min(batched) >= TARGET
    assert met == (start.endswith(": met.**")), (default, batched)
    if not met:
        assert max(default) < TARGET and max(batched) < TARGET, "a point reaching the target is not 'not met'"


def test_mariadbs_server_cpu_span_is_the_runs() -> None:
    values = [
        v
        for r in _rows("mysql", batch=False)
        for drain in ("library", "compact", "async", "raw")
        if (v := r.get(f"{drain}_server_cpu_us_per_job")) is not None
    ]
    assert f"its server threads spend {min(values):.0f} to {max(values):.0f} µs a job" in _prose()


def test_the_postgresql_cpu_budget_is_the_runs() -> None:
    (row,) = [r for r in _rows("postgresql", batch=False) if (r["processes"], r["threads"]) == (1, 8)]
    limit = row["limit_jobs_per_s"]
    client, server = row["async_client_cpu_us_per_job"], row["async_server_cpu_us_per_job"]
    text = _prose()
    assert f"it ran {limit:,.0f} jobs/s at 1 x 8" in text
    assert f"spent at most {CORES / limit * 1e6:.0f} µs a job on it" in text
    assert f"a drain may spend at most {CORES / (TARGET * limit) * 1e6:.0f} µs a job" in text
    assert "(0.42 of the limit there)" in text and f"{row['async_ratio_limit']:.2f}" == "0.42"
    assert f"spent {client + server:.0f} ({client:.0f} in the client, {server:.0f} in the server" in text
    assert server > CORES / limit * 1e6  # "whose share alone is above the limit's whole cost a job"
    assert client + server > CORES / (TARGET * limit) * 1e6


def test_proletarians_plan_against_pgbench_and_the_raw_loop_are_the_runs() -> None:
    bullet = _bullet("**Proletarian's plan against pgbench")
    assert f"{_span('postgresql', 'ratio_pgbench')} on PostgreSQL, under the 0.95 bar" in bullet
    assert max(_values("postgresql", "ratio_pgbench", batch=False)) < 0.95
    assert f"*library of raw* {_span('postgresql', 'ratio')}" in bullet


def test_the_batch_mode_cpu_budget_is_the_runs() -> None:
    text = _prose()
    by_point = {(r["processes"], r["threads"]): r for r in _rows("postgresql", batch=True)}
    one, four = by_point[(1, 4)], by_point[(4, 4)]

    def spent(row: dict[str, Any], drain: str) -> float:
        return float(row[f"{drain}_client_cpu_us_per_job"] + row[f"{drain}_server_cpu_us_per_job"])

    def budget(row: dict[str, Any]) -> float:
        return float(CORES / (TARGET * row["limit_jobs_per_s"]) * 1e6)

    assert f"the same budget is {budget(one):.0f} µs a job at 1 x 4" in text
    assert f"the library spent {spent(one, 'library'):.0f}, over it" in text
    assert spent(one, "library") > budget(one)
    # "the asyncio worker spent 57, within it, and still reached only 0.48 of the limit"
    assert spent(one, "async") < budget(one) and one["async_ratio_limit"] < TARGET
    assert f"the asyncio worker spent {spent(one, 'async'):.0f}, within it" in text
    assert f"reached only {one['async_ratio_limit']:.2f} of the limit" in text
    assert (
        f"At 4 x 4 both are over the budget ({budget(four):.0f} µs a job: the library "
        f"{spent(four, 'library'):.0f}, the asyncio worker {spent(four, 'async'):.0f})" in text
    )
    assert min(spent(four, "library"), spent(four, "async")) > budget(four)
