"""The figures docs/benchmarks.md quotes from the two limit15 runs (the asyncio chain on MariaDB, and
Proletarian's exact plan pipelined beside pgbench; the database on cores of its own, and sharing them) are
theirs.

"The asyncio chain on MariaDB, and the exact plan pipelined" pastes both runs' tables and the targets per
point (checked by tests/test_docs_limit_pairs.py), and quotes in prose the asyncio chain beside the
unchained asyncio worker and the threaded chain at each MariaDB point, what it cost a job, the exact plan
pipelined against pgbench at each PostgreSQL point, and the bound of each point missed sharing the cores:
these tests recompute each from the runs' results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from docs_support import (
    CHAINED_BATCH_DRAINS,
    DATABASES,
    DEFAULT_DRAINS,
    LIMIT15,
    PGBENCH_BAR,
    best_drain,
    missed,
    point_name,
    point_row,
    prose,
    span,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT15
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run


def async_chain_beside(run: str) -> str:
    """At each MariaDB point of `run`, the asyncio chain's share of the limit beside the asyncio worker
    unchained and the threaded chain (batch mode's own on batch rows)."""
    return "; ".join(
        f"{point_name(r, batch)} {r['async_chain_ratio_limit']:.3f} chained, {r['async_ratio_limit']:.3f} "
        f"unchained (the threaded chain {r['chain_ratio_limit']:.3f})"
        for batch in (False, True)
        for r in PAIR.rows(run, "mysql", batch=batch)
    )


def async_chain_costs() -> str:
    """What the asyncio chain cost a job at MariaDB's 1 x 1 on cores of its own, beside its neighbours."""
    r = point_row(PAIR.runs[CORES_RUN], "mysql", 1, 1)
    return (
        f"At 1 x 1 on cores of its own the asyncio chain took "
        f"{r['async_chain_round_trips_per_job']:.2f} round trips a job, against the unchained asyncio "
        f"worker's {r['async_round_trips_per_job']:.2f}, and "
        f"{r['async_chain_client_cpu_us_per_job']:.0f} µs of client CPU a job, against the unchained "
        f"asyncio worker's {r['async_client_cpu_us_per_job']:.0f} µs and the threaded chain's "
        f"{r['chain_client_cpu_us_per_job']:.0f} µs"
    )


def test_mariadbs_asyncio_chain_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        phrase = f"MariaDB, {reading}: {async_chain_beside(run)}"
        assert phrase in text, phrase
    phrase = async_chain_costs()
    assert phrase in text, phrase
    best = {
        point_name(r, batch): best_drain(r, DEFAULT_DRAINS if not batch else CHAINED_BATCH_DRAINS)
        for batch in (False, True)
        for r in PAIR.rows(CORES_RUN, "mysql", batch=batch)
    }
    async_best = ", ".join(point for point, drain in best.items() if drain == "async_chain")
    assert set(best.values()) == {"async_chain", "chain"}
    phrase = (
        f"On cores of its own it was MariaDB's best drain at {async_best}, the threaded chain at the others"
    )
    assert phrase in text, phrase
    one = point_row(PAIR.runs[CORES_RUN], "mysql", 1, 1)
    assert round(one["async_chain_round_trips_per_job"]) == 1


def test_the_exact_plan_pipelined_against_pgbench_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        phrase = f"The exact plan pipelined against pgbench, {reading}: {PAIR.pipeline_beside(run)}"
        assert phrase in text, phrase
    phrase = f"A job's round trips and client CPU, on cores of its own: {PAIR.pipeline_costs()}"
    assert phrase in text, phrase
    own = PAIR.rows(CORES_RUN, "postgresql", batch=False)
    # One exchange a job fewer, and no client CPU saved, at each point of one process (whose exchanges count).
    for r in own:
        assert r["pipeline_client_cpu_us_per_job"] > r["library_client_cpu_us_per_job"]
        if r["processes"] == 1:
            assert 0.9 < r["library_round_trips_per_job"] - r["pipeline_round_trips_per_job"] < 1.1
    assert sum(r["pipeline_ratio_pgbench"] >= PGBENCH_BAR for r in own) == 2
    assert "the bar is met at two points with the database on cores of its own" in text
    library_of_raw = span(r["ratio"] for run in PAIR.runs for r in PAIR.rows(run, "postgresql", batch=False))
    assert f"*library of raw* {library_of_raw} in these runs" in text
    # Sharing the cores no point comes near the bar, pipelined or not.
    shared = PAIR.rows(SHARED_RUN, "postgresql", batch=False)
    assert all(r["pipeline_ratio_pgbench"] < PGBENCH_BAR and r["ratio_pgbench"] < PGBENCH_BAR for r in shared)


def test_every_point_is_met_with_the_database_on_cores_of_its_own() -> None:
    for backend in DATABASES:
        for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS)):
            assert not missed(PAIR.runs[CORES_RUN], backend, drains, batch=batch), (backend, batch)
    assert "With the database on cores of its own every point is met on both databases" in prose(PAIR.text())


def test_mariadb_meets_every_point_sharing_the_cores_too() -> None:
    for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS)):
        assert not missed(PAIR.runs[SHARED_RUN], "mysql", drains, batch=batch), batch
    assert "Sharing the cores MariaDB meets every point too" in prose(PAIR.text())


def test_the_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()
    phrase = (
        f"Under 0.6, the cores themselves the bound: {PAIR.cpu_bound_points(under=True)}; the others waited"
    )
    assert phrase in prose(PAIR.text()), phrase
