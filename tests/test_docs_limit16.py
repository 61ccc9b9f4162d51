"""The figures docs/benchmarks.md quotes from the two limit16 runs (Proletarian's exact plan pipelined, its
BEGIN sent with the claim, beside pgbench; the database on cores of its own, and sharing them) are
theirs.

"The exact plan's BEGIN sent with its claim" pastes both runs' tables and the targets per point (checked by
tests/test_docs_limit_pairs.py), and quotes in prose the exact plan pipelined against pgbench at each
PostgreSQL point, what it cost a job beside the unpipelined plan, and the bound of each point missed sharing
the cores: these tests recompute each from the runs' results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from docs_support import (
    LIMIT15,
    LIMIT16,
    PGBENCH_BAR,
    point_name,
    prose,
    span,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT16
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run


def test_the_exact_plan_pipelined_takes_three_round_trips_a_job() -> None:
    text = prose(PAIR.text())
    phrase = f"A job's round trips and client CPU, on cores of its own: {PAIR.pipeline_costs()}"
    assert phrase in text, phrase
    for run in PAIR.runs:
        for r in PAIR.rows(run, "postgresql", batch=False):
            if r["processes"] == 1:
                # BEGIN with the claim, the archive with the delete, COMMIT; the plain plan's five.
                assert 2.9 < r["pipeline_round_trips_per_job"] < 3.1, (run, r["threads"])
                assert 4.9 < r["library_round_trips_per_job"] < 5.1, (run, r["threads"])
    # limit15's pipelined plan took about four: psycopg's own BEGIN was an exchange of its own.
    for r in LIMIT15.rows(LIMIT15.cores_run, "postgresql", batch=False):
        if r["processes"] == 1:
            assert 3.9 < r["pipeline_round_trips_per_job"] < 4.1


def test_the_exact_plan_pipelined_against_pgbench_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        phrase = f"The exact plan pipelined against pgbench, {reading}: {PAIR.pipeline_beside(run)}"
        assert phrase in text, phrase
    own = PAIR.rows(CORES_RUN, "postgresql", batch=False)
    met = sum(r["pipeline_ratio_pgbench"] >= PGBENCH_BAR for r in own)
    missed = [r for r in own if r["pipeline_ratio_pgbench"] < PGBENCH_BAR]
    missed_at = ", ".join(
        f"{point_name(r, False)}{' missed it' if not i else ''} at {r['pipeline_ratio_pgbench']:.3f}"
        for i, r in enumerate(missed)
    )
    phrase = (
        f"the bar is met at {met} of {len(own)} points with the database on cores of its own ({missed_at})"
    )
    assert phrase in text, phrase
    # Pipelining took an exchange a job away, and next to none of the client's CPU.
    assert all(
        abs(r["pipeline_client_cpu_us_per_job"] / r["library_client_cpu_us_per_job"] - 1) < 0.1 for r in own
    )
    assert "client CPU a job stayed within a tenth of the unpipelined plan's at each point" in text
    library_of_raw = span(r["ratio"] for run in PAIR.runs for r in PAIR.rows(run, "postgresql", batch=False))
    assert f"*library of raw* {library_of_raw} in these runs" in text
    # Sharing the cores no point comes near the bar, pipelined or not.
    shared = PAIR.rows(SHARED_RUN, "postgresql", batch=False)
    assert all(r["pipeline_ratio_pgbench"] < PGBENCH_BAR and r["ratio_pgbench"] < PGBENCH_BAR for r in shared)


def test_the_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()
    phrase = (
        f"Under 0.6, the cores themselves the bound: {PAIR.cpu_bound_points(under=True)}; the others waited"
    )
    assert phrase in prose(PAIR.text()), phrase
