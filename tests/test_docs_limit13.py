"""The figures docs/benchmarks.md quotes from the two limit13 runs (MySQL's chain drained on MariaDB too; the
database on cores of its own, and sharing them) are theirs, and so are README's figures against the server's
limit.

"MySQL's chain" pastes both runs' tables and the targets per point (tests/test_docs_limit_pairs.py checks
those), and quotes in prose, at each MariaDB point, the chain's share of the limit beside the unchained
plan's, the one connection's bound at MariaDB's 1 x 1, and the bound of each PostgreSQL point missed sharing
the cores: these tests recompute each from the runs' results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from docs_support import (
    CHAINED_BATCH_DRAINS,
    DEFAULT_DRAINS,
    LIMIT12,
    LIMIT13,
    LIMIT_TARGET,
    best_drain,
    best_of_limit,
    one_connections_bound,
    point_row,
    prose,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT13
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run


def test_mariadbs_chain_beside_the_unchained_plan_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        for phrase in (
            f"MariaDB, {reading}: {PAIR.chain_beside_unchained(run)}",
            f"the best of MariaDB's drains {reading} at {PAIR.chain_best_points(run)}",
        ):
            assert phrase in text, phrase


def test_where_the_chain_gains_on_mariadb_is_the_runs() -> None:
    for run in PAIR.runs.values():
        one = point_row(run, "mysql", 1, 1)
        assert one["chain_ratio_limit"] > one["compact_ratio_limit"]
    phrase = f"it is within {PAIR.largest_chain_gap_elsewhere():.2f} of the compact plan either way"
    assert phrase in prose(PAIR.text()), phrase


def test_the_best_postgresql_drain_at_each_point_is_the_runs() -> None:
    for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS)):
        for r in PAIR.rows(CORES_RUN, "postgresql", batch=batch):
            assert best_drain(r, drains) == "async_chain"
        for r in PAIR.rows(SHARED_RUN, "postgresql", batch=batch):
            one = (r["processes"], r["threads"], batch) == (1, 1, False)
            assert best_drain(r, drains) == ("chain" if one else "async_chain")
    phrase = (
        "With the database on cores of its own the asyncio chain was the best drain at every PostgreSQL "
        "point; sharing them, at every one but 1 x 1, where the threaded chain was"
    )
    assert phrase in prose(PAIR.text()), phrase


def test_mariadbs_1_x_1_on_cores_of_its_own_and_its_bound_are_the_run() -> None:
    row = point_row(PAIR.runs[CORES_RUN], "mysql", 1, 1)
    assert best_drain(row, DEFAULT_DRAINS) == "chain" and best_of_limit(row, DEFAULT_DRAINS) < LIMIT_TARGET
    # The chain's one query a job, against the compact plan's three, counted at the driver.
    assert round(row["compact_round_trips_per_job"] / row["chain_round_trips_per_job"]) == 3
    client, server = row["chain_client_cpu_us_per_job"], row["chain_server_cpu_us_per_job"]
    phrases = [
        f"The chain took {row['chain_round_trips_per_job']:.2f} round trips a job counted at the driver, "
        f"against the compact plan's {row['compact_round_trips_per_job']:.2f}, and {client:.0f} µs of client "
        f"CPU a job, against the compact plan's {row['compact_client_cpu_us_per_job']:.0f} µs",
        f"{client:.0f} µs of client CPU and {server:.0f} µs of server CPU a job, one after the other, "
        f"would allow {one_connections_bound(row):.3f} of the limit's {row['limit_jobs_per_s']:,.0f} "
        f"jobs/s (it reached {row['chain_ratio_limit']:.3f})",
        f"{server / row['limit_server_cpu_us_per_job']:.2f} of the limit's server CPU a job and "
        f"{client / row['limit_client_cpu_us_per_job']:.0f} times mariadb-slap's client CPU",
    ]
    before = point_row(LIMIT12.runs[LIMIT12.cores_run], "mysql", 1, 1)
    phrases.append(
        f"{row['chain_ratio_limit']:.3f} chained where the compact plan reached "
        f"{row['compact_ratio_limit']:.3f} in this run "
        f"({best_of_limit(before, ('compact', 'async')):.3f} in `limit12`, on another machine)"
    )
    text = prose(PAIR.text())
    for phrase in phrases:
        assert phrase in text, phrase


def test_the_cpu_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()
    PAIR.assert_every_missed_shared_point_waited()
