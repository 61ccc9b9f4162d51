"""The figures docs/benchmarks.md quotes from the two limit5 runs (chained claims; the database on cores of
its own, and sharing them) are theirs.

"Chained claims" pastes both runs' limit and per-job cost tables, a table of the targets met per point,
and quotes spans, round trips and the bound at 1 x 1 in prose; these tests recompute each from the runs'
results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest
from docs_support import (
    DATABASES,
    DEFAULT_DRAINS,
    RESULTS_DIR,
    assert_pasted,
    load_runs,
    point_row,
    prose,
    run_named,
    section,
    span,
    targets_table,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
CORES_RUN: Final = "limit5-cores-2026-12-05"
SHARED_RUN: Final = "limit5-shared-2026-12-05"
RUNS: Final = load_runs(CORES_RUN, SHARED_RUN)
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
# Issue 31's drains for each target: default mode as in docs_support, batch mode on either worker (limit5
# has no chained batches).
BATCH_DRAINS: Final = ("library", "async")
READINGS: Final = {CORES_RUN: "on cores of its own", SHARED_RUN: "sharing the cores"}


def _section() -> str:
    return section(BENCHMARKS_MD, f"### Chained claims: `{CORES_RUN}` and `{SHARED_RUN}`", "\n## ")


def _rows(run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return throughput_rows(RUNS[run], backend, batch=batch)


def _point(run: str, backend: str, processes: int, threads: int) -> dict[str, Any]:
    return point_row(RUNS[run], backend, processes, threads)


@pytest.mark.parametrize("run", [CORES_RUN, SHARED_RUN])
def test_both_runs_tables_are_pasted(run: str) -> None:
    assert_pasted(
        RESULTS_DIR / run / "results.md", "#### Against the server's limit", _section(), must="chain of limit"
    )


def test_the_runs_are_named_with_their_revision_machine_and_load() -> None:
    text = prose(_section())
    cores, shared = RUNS[CORES_RUN]["meta"], RUNS[SHARED_RUN]["meta"]
    assert not cores["git"]["dirty"] and cores["git"] == shared["git"]
    assert f"{cores['machine']['logical_cores']}-core {cores['machine']['cpu_model']}" in text
    for phrase in run_named(cores, end="at its end"):
        assert phrase in text, phrase
    assert (
        f"{shared['machine']['load_average'][0]} at the start of the second (the first one's drains), "
        f"{shared['machine_at_end']['load_average'][0]} at its end" in text
    )


def test_the_targets_table_is_the_runs() -> None:
    text = _section()
    for line in targets_table(RUNS, READINGS, DATABASES, DEFAULT_DRAINS, BATCH_DRAINS):
        assert line in text, line


def test_the_chained_drains_spans_and_round_trips_are_the_cores_run() -> None:
    text = prose(_section())
    rows = _rows(CORES_RUN, "postgresql", batch=False)
    for drain in ("compact", "chain", "async", "async_chain"):
        assert f"*{drain.replace('_', ' ')}* {span(r[f'{drain}_ratio_limit'] for r in rows)}" in text, drain
    one = [r for r in rows if r["processes"] == 1]
    trips = {d: span(r[f"{d}_round_trips_per_job"] for r in one) for d in ("compact", "chain")}
    assert f"{trips['compact']} round trips a job on the compact plan, {trips['chain']} chained" in text


def test_the_bound_at_one_connection_is_the_cores_run() -> None:
    one = _point(CORES_RUN, "postgresql", 1, 1)
    client, server = one["chain_client_cpu_us_per_job"], one["chain_server_cpu_us_per_job"]
    limit = one["limit_jobs_per_s"]
    text = prose(_section())
    assert (
        f"the chained worker's client spent {client:.0f} µs a job and its backend {server:.0f} µs, one after "
        f"the other: at most {1e6 / (client + server) / limit:.2f} of the limit's {limit:,.0f} jobs/s before "
        f"any round trip is waited for (it reached {one['chain_ratio_limit']:.2f})" in text
    )
    assert one["chain_ratio_limit"] < 1e6 / (client + server) / limit


def test_the_asyncio_workers_gain_and_pgbench_at_one_connection_are_the_cores_run() -> None:
    text = prose(_section())
    eight, four = _point(CORES_RUN, "postgresql", 1, 8), _point(CORES_RUN, "postgresql", 4, 4)
    assert (
        f"at 1 x 8 and 4 x 4 the asyncio worker reached {eight['async_chain_ratio_limit']:.2f} and "
        f"{four['async_chain_ratio_limit']:.2f} with chained claims, {eight['async_ratio_limit']:.2f} and "
        f"{four['async_ratio_limit']:.2f} without" in text
    )
    one = _point(CORES_RUN, "postgresql", 1, 1)
    assert f"reached {one['pgbench_ratio_limit']:.2f} of it at 1 x 1" in text
    client, limit = one["chain_client_cpu_us_per_job"], one["limit_jobs_per_s"]
    assert f"a job ({client:.0f} µs, the driver's mostly) is as much as the limit's whole job" in text
    assert f"({1e6 / limit:.0f} µs)" in text
    assert abs(client - 1e6 / limit) < 0.25 * client


def test_the_machine_against_limit4s_is_the_shared_run() -> None:
    limit = _point(SHARED_RUN, "postgresql", 1, 8)["limit_jobs_per_s"]
    assert f"sharing the cores, ran {limit:,.0f} jobs/s here against 5,292 there" in prose(_section())


def test_proletarians_plan_against_pgbench_and_the_raw_loop_are_the_runs() -> None:
    text = prose(_section())
    cores, shared = (span(r["ratio_pgbench"] for r in _rows(run, "postgresql", batch=False)) for run in RUNS)
    assert f"(issue 31's bar, 0.95): {cores} on cores of its own and {shared} sharing them" in text
    raw = " and ".join(span(r["ratio"] for r in _rows(run, "postgresql", batch=False)) for run in RUNS)
    assert f"*library of raw* {raw}" in text
