"""The figures docs/benchmarks.md quotes from the two limit17 runs (Proletarian's exact plan pipelined on the
asyncio worker, beside the threaded worker's and pgbench; the database on cores of its own, and sharing them)
are theirs.

"The exact plan on the asyncio worker" pastes both runs' tables and the targets per point (checked by
tests/test_docs_limit_pairs.py), and quotes in prose the exact plan on each worker against pgbench at each
PostgreSQL point, what it cost a job, and the bound of each point missed sharing the cores: these tests
recompute each from the runs' results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from typing import Final

from docs_support import (
    LIMIT16,
    LIMIT17,
    LIMIT_TARGET,
    PGBENCH_BAR,
    LimitPair,
    prose,
)

PAIR: Final = LIMIT17
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run


def test_the_exact_plan_on_the_asyncio_worker_takes_three_round_trips_a_job() -> None:
    for run in PAIR.runs:
        for r in PAIR.rows(run, "postgresql", batch=False):
            if r["processes"] == 1:
                # BEGIN with the claim, the archive with the delete, COMMIT: each the backend's own exchange.
                assert 2.9 < r["async_pipeline_round_trips_per_job"] < 3.1, (run, r["threads"])
                assert 2.9 < r["pipeline_round_trips_per_job"] < 3.1, (run, r["threads"])


def test_the_exact_plan_on_the_asyncio_worker_against_pgbench_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        beside = PAIR.async_pipeline_beside(run)
        phrase = f"The exact plan on the asyncio worker against pgbench, {reading}: {beside}"
        assert phrase in text, phrase
        phrase = f"Its client CPU a job, {reading}: {PAIR.async_pipeline_costs(run)}"
        assert phrase in text, phrase


def test_the_asyncio_worker_meets_the_exact_plans_bar_at_every_point_on_cores_of_its_own() -> None:
    text = prose(PAIR.text())
    for run in PAIR.runs:
        for r in PAIR.rows(run, "postgresql", batch=False):
            # Less client CPU a job than the threaded pipeline at every point of more than one connection.
            less = r["async_pipeline_client_cpu_us_per_job"] < r["pipeline_client_cpu_us_per_job"]
            assert less == ((r["processes"], r["threads"]) != (1, 1)), (run, r["processes"], r["threads"])
            if run == CORES_RUN:
                assert r["async_pipeline_ratio_pgbench"] >= PGBENCH_BAR
            else:
                assert (
                    r["async_pipeline_ratio_pgbench"] < PGBENCH_BAR
                    and r["pipeline_ratio_pgbench"] < PGBENCH_BAR
                )
    phrases = [
        "So on the asyncio worker Proletarian's exact plan meets the bar at every point with the database "
        "on cores of its own; its exchanges cost less client CPU a job than the threaded worker's pipeline "
        "at every point but 1 x 1, on either reading",
        "Sharing the cores it is missed by far on either worker",
    ]
    for phrase in phrases:
        assert phrase in text, phrase


def test_mariadbs_point_missed_sharing_the_cores_is_the_runs() -> None:
    def four_by_four(pair: LimitPair) -> float:
        return pair.mariadb_batch_shared()[1]

    assert PAIR.met(SHARED_RUN, "mysql", batch=True) == "1 of 2"
    assert four_by_four(PAIR) < LIMIT_TARGET <= four_by_four(LIMIT16)
    phrase = (
        f"MariaDB sharing the cores missed 4 x 4 in batch mode at {four_by_four(PAIR):.3f}, the best of its "
        f"drains; in `limit16`, on the same machine, it reached {four_by_four(LIMIT16):.3f} there"
    )
    assert phrase in prose(PAIR.text()), phrase


def test_the_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()
    phrase = (
        f"Under 0.6, the cores themselves the bound: {PAIR.cpu_bound_points(under=True)}; the others waited"
    )
    assert phrase in prose(PAIR.text()), phrase
