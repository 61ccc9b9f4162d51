"""The figures docs/benchmarks.md quotes from the two limit4 runs (cores of its own, and shared) are theirs.

"The database on cores of its own" pastes both runs' limit and per-job cost tables and quotes spans,
verdicts, CPU caps and budgets in prose; these tests recompute each from the runs' results.json, so a new
run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest
from docs_support import (
    LIMIT_TARGET,
    RESULTS_DIR,
    assert_pasted,
    load_runs,
    point_row,
    prose,
    run_named,
    section,
    span,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
CORES_RUN: Final = "limit4-cores-2026-12-05"
SHARED_RUN: Final = "limit4-shared-2026-12-05"
RUNS: Final = load_runs(CORES_RUN, SHARED_RUN)
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
CORES: Final = 2


def _section() -> str:
    return section(
        BENCHMARKS_MD,
        f"### The database on cores of its own: `{CORES_RUN}` and `{SHARED_RUN}`",
        "\n## ",
    )


def _prose() -> str:
    return prose(_section())


def _bullet(start: str) -> str:
    text = _prose()
    at = text.index(start)
    end = text.find(" - **", at + 1)
    return text[at : end if end != -1 else text.index(" So on PostgreSQL", at)]


def _rows(run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return throughput_rows(RUNS[run], backend, batch=batch)


def _span(run: str, backend: str, key: str, *, batch: bool = False) -> str:
    return span(r[key] for r in _rows(run, backend, batch=batch))


def _point(run: str, backend: str, processes: int, threads: int) -> dict[str, Any]:
    return point_row(RUNS[run], backend, processes, threads)


def _met_points(run: str, backend: str, *, batch: bool) -> tuple[int, int]:
    """How many points reach the target on their best drain (compact or asyncio; batch: either worker)."""
    drains = ("library", "async") if batch else ("compact", "async")
    rows = _rows(run, backend, batch=batch)
    return sum(max(r[f"{d}_ratio_limit"] for d in drains) >= LIMIT_TARGET for r in rows), len(rows)


@pytest.mark.parametrize("run", [CORES_RUN, SHARED_RUN])
def test_both_runs_tables_are_pasted(run: str) -> None:
    assert_pasted(
        RESULTS_DIR / run / "results.md", "#### Against the server's limit", _section(), must="async of limit"
    )


def test_the_runs_are_named_with_their_revision_machine_and_load() -> None:
    text = _prose()
    cores, shared = RUNS[CORES_RUN]["meta"], RUNS[SHARED_RUN]["meta"]
    assert not cores["git"]["dirty"] and cores["git"] == shared["git"]
    assert f"{cores['machine']['logical_cores']}-core {cores['machine']['cpu_model']}" in text
    for phrase in run_named(cores, end="at its end"):
        assert phrase in text, phrase
    assert (
        f"{shared['machine']['load_average'][0]} at the start of the second (the first one's drains), "
        f"{shared['machine_at_end']['load_average'][0]} at its end" in text
    )
    limit = _point(SHARED_RUN, "postgresql", 1, 8)["limit_jobs_per_s"]
    assert f"sharing the cores, ran {limit:,.0f} jobs/s here against 13,319 there" in text


def test_the_pinning_the_cores_run_reports_is_pasted_and_quoted() -> None:
    printed = (RESULTS_DIR / CORES_RUN / "results.md").read_text(encoding="utf-8")
    lines = [line for line in printed.splitlines() if "cores of its own (`--server-cores`)" in line]
    assert len(lines) == 2
    for line in lines:
        assert line in _section()
    entries = {e["backend"]: e for e in RUNS[CORES_RUN]["benchmarks"]["throughput"]}
    for entry in entries.values():
        assert entry["server_cores"]["failures"] == [] and entry["server_cores"]["pinned"] > 0
    pg, my = entries["postgresql"], entries["mysql"]
    pg_cpu, my_cpu = pg["server_cores"]["pinner_cpu_s"], my["server_cores"]["pinner_cpu_s"]
    assert (
        f"The pinning thread's own CPU, on the clients' core, was {pg_cpu:.2f} s of the PostgreSQL run's "
        f"{pg['duration_s']:.0f} s and {my_cpu:.2f} s of MariaDB's: under 4% of that core" in _prose()
    )
    assert pg["server_cores"]["pinner_cpu_s"] / pg["duration_s"] < 0.04
    assert my["server_cores"]["pinner_cpu_s"] / my["duration_s"] < 0.04
    assert "server_cores" not in RUNS[SHARED_RUN]["benchmarks"]["throughput"][0]


@pytest.mark.parametrize(
    ("run", "backend", "start", "quoted", "verdict"),
    [
        (
            CORES_RUN,
            "mysql",
            "**MariaDB, on cores of its own: met.**",
            [("compact", False), ("library", False), ("async", False), ("library", True), ("async", True)],
            ((4, 4), (2, 2)),
        ),
        (
            SHARED_RUN,
            "mysql",
            "**MariaDB, sharing the cores: met in batch mode, in default mode at 2 of 4 points.**",
            [("compact", False), ("async", False), ("library", True)],
            ((2, 4), (2, 2)),
        ),
        (
            CORES_RUN,
            "postgresql",
            "**PostgreSQL, on cores of its own: met in batch mode on the asyncio worker; default mode not "
            "met.**",
            [("async", True), ("library", True), ("compact", False), ("async", False)],
            ((0, 4), (2, 2)),
        ),
        (
            SHARED_RUN,
            "postgresql",
            "**PostgreSQL, sharing the cores: not met.**",
            [("compact", False), ("async", False), ("library", True), ("async", True)],
            ((0, 4), (0, 2)),
        ),
    ],
)
def test_each_verdict_and_its_spans_are_the_runs(
    run: str,
    backend: str,
    start: str,
    quoted: list[tuple[str, bool]],
    verdict: tuple[tuple[int, int], tuple[int, int]],
) -> None:
    bullet = _bullet(start)
    for drain, batch in quoted:
        assert _span(run, backend, f"{drain}_ratio_limit", batch=batch) in bullet, (drain, batch)
    assert (_met_points(run, backend, batch=False), _met_points(run, backend, batch=True)) == verdict


def test_the_points_where_mariadb_sharing_the_cores_misses_are_named() -> None:
    missed = [
        f"{r['processes']} x {r['threads']}"
        for r in _rows(SHARED_RUN, "mysql", batch=False)
        if max(r["compact_ratio_limit"], r["async_ratio_limit"]) < LIMIT_TARGET
    ]
    assert f"under 0.6 at {' and '.join(missed)};" in _bullet("**MariaDB, sharing the cores")


def test_mariadbs_client_and_server_cpu_spans_are_the_runs() -> None:
    def values(side: str) -> list[float]:
        return [
            r[f"{d}_{side}_cpu_us_per_job"]
            for r in _rows(SHARED_RUN, "mysql", batch=False)
            for d in ("library", "compact", "async")
        ]

    client, server = values("client"), values("server")
    assert (
        f"a MariaDB job costs the client ({min(client):,.0f} to {max(client):,.0f} µs) about what it "
        f"costs the server ({min(server):,.0f} to {max(server):,.0f} µs)" in _prose()
    )


def test_what_bounds_postgresql_on_cores_of_its_own_is_the_runs() -> None:
    eight, one = _point(CORES_RUN, "postgresql", 1, 8), _point(CORES_RUN, "postgresql", 1, 1)
    limit = eight["limit_jobs_per_s"]
    server, client = eight["compact_server_cpu_us_per_job"], eight["compact_client_cpu_us_per_job"]
    budget = 1e6 / limit  # the server's one core, all of it on the limit
    text = _prose()
    assert f"the limit's {limit:,.0f} jobs/s took the server's core at most {budget:.0f} µs a job" in text
    assert f"the compact plan's backends spent {server:.0f}" in text
    assert f"the server's core alone caps it at {budget / server:.2f} of the limit" in text
    assert (
        f"its client spent {client:.0f} µs a job on the client's core, a cap of {1e6 / client / limit:.2f}"
        in text
    )
    assert f"and it reached {eight['compact_ratio_limit']:.2f}" in text
    assert eight["compact_ratio_limit"] < min(budget / server, 1e6 / client / limit)
    serial = one["compact_client_cpu_us_per_job"] + one["compact_server_cpu_us_per_job"]
    assert (
        f"the client's {one['compact_client_cpu_us_per_job']:.0f} µs and the server's "
        f"{one['compact_server_cpu_us_per_job']:.0f} µs add up, one job after the other, to at most "
        f"{1e6 / serial / one['limit_jobs_per_s']:.2f} of the limit's {one['limit_jobs_per_s']:,.0f} jobs/s "
        f"(it reached {one['compact_ratio_limit']:.2f})" in text
    )


def test_the_postgresql_budget_sharing_the_cores_is_the_runs() -> None:
    row = _point(SHARED_RUN, "postgresql", 1, 8)
    limit = row["limit_jobs_per_s"]
    client, server = row["async_client_cpu_us_per_job"], row["async_server_cpu_us_per_job"]
    text = _prose()
    assert f"The limit ran {limit:,.0f} jobs/s at 1 x 8" in text
    most, allowed = CORES / limit * 1e6, CORES / (LIMIT_TARGET * limit) * 1e6
    assert f"spent at most {most:.0f} µs a job on it, and 0.6 of it allows {allowed:.0f}" in text
    assert f"spent {client + server:.0f} ({client:.0f} in the client, {server:.0f} in the server)" in text
    assert client + server > CORES / (LIMIT_TARGET * limit) * 1e6


def test_proletarians_plan_against_pgbench_and_the_raw_loop_are_the_runs() -> None:
    bullet = _bullet("**Proletarian's plan against pgbench")
    cores, shared = (_span(run, "postgresql", "ratio_pgbench") for run in (CORES_RUN, SHARED_RUN))
    assert f"{cores} (on cores of its own) and {shared} (sharing), under the 0.95 bar" in bullet
    raw = " and ".join(_span(run, "postgresql", "ratio") for run in (CORES_RUN, SHARED_RUN))
    assert f"*library of raw* {raw}" in bullet
    for run in RUNS:
        assert max(r["ratio_pgbench"] for r in _rows(run, "postgresql", batch=False)) < 0.95
