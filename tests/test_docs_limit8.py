"""The figures docs/benchmarks.md quotes from the two limit8 runs (the asyncio worker's chain pipelined
too, one exchange a job; the database on cores of its own, and sharing them) are theirs. README's figures
against the server's limit and docs/worker.md's word on the asyncio chain come from limit9's runs since
(tests/test_docs_limit9.py).

"The asyncio worker, one exchange a job" pastes both runs' limit and per-job cost tables and a table of the
targets met per point, and quotes in prose what the asyncio chain reached beside asyncpg's compact plan and
the threaded chain, its round trips and CPU a job, and the CPU bound of the points missed sharing the
cores; these tests recompute each from the runs' results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest
from docs_support import (
    CHAINED_BATCH_DRAINS,
    DATABASES,
    DEFAULT_DRAINS,
    LIMIT_TARGET,
    RESULTS_DIR,
    TARGET_DIGITS,
    assert_pair_named,
    assert_pasted,
    best_drain,
    best_of_limit,
    cpu_ceiling,
    load_runs,
    missed,
    missed_cpu_bounds,
    over_ceiling,
    point_row,
    prose,
    section,
    targets_table,
    throughput_rows,
)

from benchmarks.async_drain import ASYNC_CHAIN_BACKENDS

ROOT: Final = Path(__file__).resolve().parent.parent
CORES_RUN: Final = "limit8-cores-2026-12-05"
SHARED_RUN: Final = "limit8-shared-2026-12-05"
RUNS: Final = load_runs(CORES_RUN, SHARED_RUN)
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
READINGS: Final = {CORES_RUN: "on cores of its own", SHARED_RUN: "sharing the cores"}


def _section() -> str:
    return section(
        BENCHMARKS_MD,
        f"### The asyncio worker, one exchange a job: `{CORES_RUN}` and `{SHARED_RUN}`",
        "\n## ",
    )


def _rows(run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return throughput_rows(RUNS[run], backend, batch=batch)


def _missed(run: str, *, batch: bool) -> list[dict[str, Any]]:
    return missed(RUNS[run], "postgresql", CHAINED_BATCH_DRAINS if batch else DEFAULT_DRAINS, batch=batch)


def what_the_asyncio_chain_reached(run: str) -> str:
    """The asyncio chain beside asyncpg's compact plan and the threaded chain (one job a commit), and beside
    unchained asyncio batch mode, at each PostgreSQL point of `run`, as the prose says it."""
    default = [
        f"at {r['processes']} x {r['threads']} the asyncio chain reached "
        f"{r['async_chain_ratio_limit']:.2f} of the limit, asyncpg's compact plan "
        f"{r['async_ratio_limit']:.2f}, the threaded chain {r['chain_ratio_limit']:.2f}"
        for r in _rows(run, "postgresql", batch=False)
    ]
    batch = [
        f"at {r['processes']} x {r['threads']} in batch mode {r['async_chain_ratio_limit']:.2f}, unchained "
        f"{r['async_ratio_limit']:.2f}"
        for r in _rows(run, "postgresql", batch=True)
    ]
    return "; ".join(default + batch)


@pytest.mark.parametrize("run", [CORES_RUN, SHARED_RUN])
def test_both_runs_tables_are_pasted(run: str) -> None:
    assert_pasted(
        RESULTS_DIR / run / "results.md",
        "#### Against the server's limit",
        _section(),
        must="async batch chain",
    )


def test_the_runs_are_named_with_their_revision_machine_and_load() -> None:
    assert_pair_named(RUNS[CORES_RUN]["meta"], RUNS[SHARED_RUN]["meta"], prose(_section()))


def test_both_chains_drained_pipelined_the_asyncio_one_on_psycopg() -> None:
    for run in RUNS.values():
        (pg,) = [e for e in run["benchmarks"]["throughput"] if e["backend"] == "postgresql"]
        assert pg["chain_factory"] == "conformance.builtin:postgresql_pipeline_chain"
        assert pg["async_chain_backend"] == ASYNC_CHAIN_BACKENDS["postgresql"]
    assert f"`{ASYNC_CHAIN_BACKENDS['postgresql']}`" in prose(_section())


def test_the_targets_table_is_the_runs() -> None:
    text = _section()
    for line in targets_table(RUNS, READINGS, DATABASES, DEFAULT_DRAINS, CHAINED_BATCH_DRAINS, TARGET_DIGITS):
        assert line in text, line


def test_what_the_asyncio_chain_reached_is_the_runs() -> None:
    text = prose(_section())
    for run in RUNS:
        assert what_the_asyncio_chain_reached(run) in text, run


def test_the_asyncio_chains_exchanges_and_cpu_a_job_are_the_cores_runs() -> None:
    one = point_row(RUNS[CORES_RUN], "postgresql", 1, 1)
    four = point_row(RUNS[CORES_RUN], "postgresql", 1, 4)
    (batch,) = [r for r in _rows(CORES_RUN, "postgresql", batch=True) if r["processes"] == 1]
    text = prose(_section())
    assert (
        f"At 1 x 1 the asyncio chain took {one['async_chain_round_trips_per_job']:.2f} round trips a job, "
        f"asyncpg's compact plan {one['async_round_trips_per_job']:.2f}; in batch mode at 1 x 4 "
        f"{batch['async_chain_round_trips_per_job']:.2f} a job, {batch['async_round_trips_per_job']:.2f} "
        "unchained" in text
    )
    assert (
        f"at 1 x 4, {four['async_chain_client_cpu_us_per_job']:.0f} µs of client CPU and "
        f"{four['async_chain_server_cpu_us_per_job']:.0f} µs of server CPU against asyncpg's compact plan's "
        f"{four['async_client_cpu_us_per_job']:.0f} and {four['async_server_cpu_us_per_job']:.0f}" in text
    )


def test_where_the_targets_stand_is_the_runs() -> None:
    text = prose(_section())
    for run in RUNS:
        for backend in DATABASES:
            for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS)):
                met = [best_of_limit(r, drains) >= LIMIT_TARGET for r in _rows(run, backend, batch=batch)]
                # On cores of its own all are met; sharing them MariaDB's are and PostgreSQL's none.
                assert all(met) if run == CORES_RUN or backend == "mysql" else not any(met)
    assert "With the database on cores of its own, every target is met on both databases" in text
    assert "Sharing the cores, PostgreSQL misses 0.6 at every point; MariaDB meets it everywhere" in text
    # "and the asyncio worker meets them on its own now"
    for batch in (False, True):
        rows = _rows(CORES_RUN, "postgresql", batch=batch)
        assert all(best_of_limit(r, ("async", "async_chain")) >= LIMIT_TARGET for r in rows)


def test_the_cpu_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    text = prose(_section())
    shared = RUNS[SHARED_RUN]
    phrases = missed_cpu_bounds(shared)
    assert phrases, "no point missed sharing the cores: the prose on what bounds them is stale"
    for phrase in phrases:
        assert phrase in text, phrase
    assert f"Over 0.6: {over_ceiling(shared, DEFAULT_DRAINS, CHAINED_BATCH_DRAINS)}." in text
    under = [
        f"{r['processes']} x {r['threads']}{' in batch mode' if batch else ''}"
        for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS))
        for r in _missed(SHARED_RUN, batch=batch)
        if cpu_ceiling(shared, r, drains) < LIMIT_TARGET
    ]
    assert under == ["1 x 8", "4 x 4", "4 x 4 in batch mode"]
    assert "Under 0.6 (at 1 x 8 and 4 x 4, and at 4 x 4 in batch mode) CPU is the bound" in text


def test_the_best_drain_sharing_the_cores_and_what_sharing_cost_each_chain_are_the_runs() -> None:
    shared_rows = [
        (r, DEFAULT_DRAINS if not batch else CHAINED_BATCH_DRAINS)
        for batch in (False, True)
        for r in _rows(SHARED_RUN, "postgresql", batch=batch)
    ]
    best = [(r["threads"] * r["processes"], best_drain(r, drains)) for r, drains in shared_rows]
    # "The asyncio chain is the best drain there from 1 x 4 up", and "at every point but one connection".
    assert [drain for connections, drain in best if connections >= 4] == ["async_chain"] * (len(best) - 1)
    assert [drain for connections, drain in best if connections == 1] == ["chain"]
    cores, shared = (point_row(RUNS[run], "postgresql", 1, 4) for run in (CORES_RUN, SHARED_RUN))
    threaded, aio = (
        {run: row[f"{drain}_client_cpu_us_per_job"] for run, row in (("cores", cores), ("shared", shared))}
        for drain in ("chain", "async_chain")
    )
    assert (
        f"At 1 x 4 the threaded chain's client CPU a job rose from {threaded['cores']:.0f} µs with the "
        f"database on its own core to {threaded['shared']:.0f} µs sharing the cores, the asyncio chain's "
        f"from {aio['cores']:.0f} to {aio['shared']:.0f}" in prose(_section())
    )
    assert threaded["shared"] - threaded["cores"] > aio["shared"] - aio["cores"]


def test_the_asyncio_chain_drained_on_asyncpg_before_limit8_three_exchanges_a_job() -> None:
    (limit7,) = load_runs("limit7-cores-2026-12-05").values()
    (pg,) = [e for e in limit7["benchmarks"]["throughput"] if e["backend"] == "postgresql"]
    assert "async_chain_backend" not in pg
    one = point_row(limit7, "postgresql", 1, 1)
    assert round(one["async_chain_round_trips_per_job"]) == 3
    text = prose(section(BENCHMARKS_MD, "## Against the server's limit", "\n### "))
    assert "before, it ran on asyncpg's chain, three round trips a job" in text
    assert f"`{ASYNC_CHAIN_BACKENDS['postgresql']}`, one exchange a job" in text
