"""The figures docs/benchmarks.md quotes from the two limit14 runs (MySQL's chain checked by SET; the database
on cores of its own, and sharing them) are theirs.

"MySQL's chain checked by SET" pastes both runs' tables and the targets per point (checked by
tests/test_docs_limit_pairs.py), and quotes in prose the best PostgreSQL drains, the chain beside the
unchained plan at each MariaDB point, its client CPU a job beside limit13's (the same machine, the check a
SELECT there), MariaDB's 1 x 1 on cores of its own, and the bound of each point missed sharing the cores:
these tests recompute each from the runs' results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from docs_support import (
    BATCH_DRAIN_LABELS,
    CHAINED_BATCH_DRAINS,
    DATABASES,
    DEFAULT_DRAINS,
    DRAIN_LABELS,
    LIMIT13,
    LIMIT14,
    LIMIT_TARGET,
    best_drain,
    best_of_limit,
    cpu_bound,
    cpu_ceiling,
    missed,
    one_connections_bound,
    point_name,
    point_row,
    prose,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT14
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run


def pg_best_drains() -> str:
    """Where the asyncio chain was the best PostgreSQL drain, each run's exceptions named with their drain."""
    parts: list[str] = []
    for run, reading in PAIR.readings.items():
        others = [
            f"{point_name(r, batch)} (*{labels[best_drain(r, drains)]}*)"
            for batch, drains, labels in (
                (False, DEFAULT_DRAINS, DRAIN_LABELS),
                (True, CHAINED_BATCH_DRAINS, BATCH_DRAIN_LABELS),
            )
            for r in PAIR.rows(run, "postgresql", batch=batch)
            if best_drain(r, drains) != "async_chain"
        ]
        parts.append(
            ("" if not parts else "at every one ") + reading + (f" but {', '.join(others)}" if others else "")
        )
    return ", and ".join(parts)


def chain_client_cpu_beside_limit13() -> str:
    """MySQL's chain's client CPU a job at each MariaDB point beside limit13's (the same machine and points,
    the check a SELECT there), for each reading, as the prose says it."""
    parts = []
    for run, reading in PAIR.readings.items():
        before = LIMIT13.runs[run.replace("limit14", "limit13")]
        pairs = [
            (point_name(r, batch), r["chain_client_cpu_us_per_job"], b["chain_client_cpu_us_per_job"])
            for batch in (False, True)
            for r, b in zip(
                PAIR.rows(run, "mysql", batch=batch),
                throughput_rows(before, "mysql", batch=batch),
                strict=True,
            )
        ]
        lower = sum(now < then for _, now, then in pairs)
        where = (
            "at every MariaDB point" if lower == len(pairs) else f"at {lower} of {len(pairs)} MariaDB points"
        )
        figures = "; ".join(f"{point} {now:.0f} µs ({then:.0f} µs)" for point, now, then in pairs)
        parts.append(
            f"{reading[0].upper() + reading[1:]}, the chain's client CPU a job was lower than in `limit13` "
            f"{where}: {figures}"
        )
    return ". ".join(parts)


def mariadb_missed_batch_bound() -> str:
    """The CPU bound of each MariaDB batch point missed sharing the cores."""
    shared = PAIR.runs[SHARED_RUN]
    rows = missed(shared, "mysql", CHAINED_BATCH_DRAINS, batch=True)
    return "; ".join(cpu_bound(shared, r, CHAINED_BATCH_DRAINS, BATCH_DRAIN_LABELS) for r in rows)


def test_the_best_postgresql_drains_are_the_runs() -> None:
    phrase = f"The asyncio chain was the best drain at every PostgreSQL point {pg_best_drains()}"
    assert phrase in prose(PAIR.text()), phrase


def test_mariadbs_chain_beside_the_unchained_plan_and_limit13_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        for phrase in (
            f"MariaDB, {reading}: {PAIR.chain_beside_unchained(run)}",
            f"the best of MariaDB's drains {reading} at {PAIR.chain_best_points(run)}",
        ):
            assert phrase in text, phrase
    phrase = chain_client_cpu_beside_limit13()
    assert phrase in text, phrase


def test_mariadbs_1_x_1_on_cores_of_its_own_is_met_as_the_run_says() -> None:
    row = point_row(PAIR.runs[CORES_RUN], "mysql", 1, 1)
    before = point_row(LIMIT13.runs[LIMIT13.cores_run], "mysql", 1, 1)
    assert best_drain(row, DEFAULT_DRAINS) == "chain" and best_of_limit(row, DEFAULT_DRAINS) >= LIMIT_TARGET
    # The sum of the client's and the server's CPU a job is no hard bound: the chain went past it here.
    assert row["chain_ratio_limit"] > one_connections_bound(row)
    client, server = row["chain_client_cpu_us_per_job"], row["chain_server_cpu_us_per_job"]
    phrases = [
        f"{row['chain_ratio_limit']:.3f} chained where the compact plan reached "
        f"{row['compact_ratio_limit']:.3f} ({before['chain_ratio_limit']:.3f} chained in `limit13`)",
        f"The chain took {row['chain_round_trips_per_job']:.2f} round trips a job counted at the driver, "
        f"against the compact plan's {row['compact_round_trips_per_job']:.2f}, and {client:.0f} µs of client "
        f"CPU a job, against the compact plan's {row['compact_client_cpu_us_per_job']:.0f} µs",
        f"{client:.0f} µs of client CPU and {server:.0f} µs of server CPU a job, one after the other, would "
        f"allow {one_connections_bound(row):.3f} of the limit's {row['limit_jobs_per_s']:,.0f} jobs/s; it "
        f"reached {row['chain_ratio_limit']:.3f}",
        f"(`limit13`'s chain reached {before['chain_ratio_limit']:.3f} there)",
    ]
    text = prose(PAIR.text())
    for phrase in phrases:
        assert phrase in text, phrase


def test_the_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()
    PAIR.assert_every_missed_shared_point_waited()
    shared = PAIR.runs[SHARED_RUN]
    rows = missed(shared, "mysql", CHAINED_BATCH_DRAINS, batch=True)
    assert rows and all(cpu_ceiling(shared, r, CHAINED_BATCH_DRAINS) >= LIMIT_TARGET for r in rows)
    assert not missed(shared, "mysql", DEFAULT_DRAINS, batch=False)
    phrase = f"MariaDB in batch mode {mariadb_missed_batch_bound()}"
    assert phrase in prose(PAIR.text()), phrase


def test_every_point_is_met_with_the_database_on_cores_of_its_own() -> None:
    text = prose(PAIR.text())
    for backend in DATABASES:
        for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS)):
            assert not missed(PAIR.runs[CORES_RUN], backend, drains, batch=batch), (backend, batch)
    assert "With the database on cores of its own every point is met on both databases" in text
