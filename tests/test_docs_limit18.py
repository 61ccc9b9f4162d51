"""The figures docs/benchmarks.md quotes from the two limit18 runs (the MySQL backends' bounded claim; the
database on cores of its own, and sharing them) are theirs, and so are docs/worker.md's figures for the
pipelined plan, which quote them (README's against the server's limit quote limit20's, the reference pair
after them: tests/test_docs_limit20.py).

"The bounded claim against the limit" pastes both runs' tables and the targets per point (checked by
tests/test_docs_limit_pairs.py), and quotes in prose MariaDB's server CPU a job under Proletarian's claim and
under the bounded one, its batch point limit17 missed, the bound of the point missed sharing the cores and
the exact plan against pgbench: these tests recompute each from the runs' results.json, so a new run with
stale prose fails here.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Final

from docs_support import (
    BATCH_DRAIN_LABELS,
    CHAINED_BATCH_DRAINS,
    DEFAULT_DRAINS,
    LIMIT17,
    LIMIT18,
    LIMIT_TARGET,
    best_drain,
    best_of_limit,
    cpu_ceiling,
    load_runs,
    missed,
    point_name,
    point_row,
    prose,
    span,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT18
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run


def mariadb_server_cpu(run: str) -> str:
    """At each MariaDB point of `run` one job a commit, the server CPU a job of Proletarian's plan (the
    library, Proletarian's claim) and of the compact plan (the bounded claim), as prose says them."""
    return ", ".join(
        f"{point_name(r, False)} {r['library_server_cpu_us_per_job']:.0f} against "
        f"{r['compact_server_cpu_us_per_job']:.0f} µs"
        for r in PAIR.rows(run, "mysql", batch=False)
    )


def test_proletarians_claim_costs_mariadb_more_server_cpu_a_job_than_the_bounded_one() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        for r in PAIR.rows(run, "mysql", batch=False):
            compact, library = r["compact_server_cpu_us_per_job"], r["library_server_cpu_us_per_job"]
            assert compact < library, (run, r["processes"], r["threads"])
        phrase = (
            "Proletarian's plan against the compact plan, server CPU a job "
            f"{reading}: {mariadb_server_cpu(run)}"
        )
        assert phrase in text, phrase


def test_mariadbs_batch_point_limit17_missed_sharing_the_cores_is_met() -> None:
    drain, share = PAIR.mariadb_batch_shared()
    _, before = LIMIT17.mariadb_batch_shared()
    assert before < LIMIT_TARGET <= share
    phrase = (
        f"MariaDB's batch 4 x 4 sharing the cores, which `limit17` missed at {before:.3f}, reached "
        f"{share:.3f} (*{BATCH_DRAIN_LABELS[drain]}*)"
    )
    assert phrase in prose(PAIR.text()), phrase


def test_the_bound_of_the_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()
    shared = PAIR.runs[SHARED_RUN]
    (row,) = missed(shared, "postgresql", DEFAULT_DRAINS, batch=False)
    assert not missed(shared, "postgresql", CHAINED_BATCH_DRAINS, batch=True)
    drain = best_drain(row, DEFAULT_DRAINS)
    ceiling = cpu_ceiling(shared, row, DEFAULT_DRAINS)
    # Within a few hundredths of what two busy cores allow at its CPU a job: the CPU a job is the bound.
    assert 0 < ceiling - row[f"{drain}_ratio_limit"] < 0.05
    client, server = row[f"{drain}_client_cpu_us_per_job"], row[f"{drain}_server_cpu_us_per_job"]
    # Of what it spent beyond the limit a job, the client's part was the larger.
    assert client - row["limit_client_cpu_us_per_job"] > server - row["limit_server_cpu_us_per_job"]
    phrase = (
        f"the client's {client:.0f} µs a job against pgbench's {row['limit_client_cpu_us_per_job']:.0f}, the "
        f"server's {server:.0f} against the limit's {row['limit_server_cpu_us_per_job']:.0f}"
    )
    assert phrase in prose(PAIR.text()), phrase


def test_the_exact_plan_against_pgbench_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        beside = PAIR.async_pipeline_beside(run)
        phrase = f"The exact plan on the asyncio worker against pgbench, {reading}: {beside}"
        assert phrase in text, phrase


def test_worker_mds_figures_for_the_pipelined_plan_are_the_runs() -> None:
    text = prose((ROOT / "docs" / "worker.md").read_text(encoding="utf-8"))
    own = PAIR.rows(CORES_RUN, "postgresql", batch=False)
    phrase = (
        "In the named runs `limit18`, with the database on cores of its own on the same host, Proletarian's "
        f"statements ran at {span(r['ratio_pgbench'] for r in own)} of pgbench running them on the plain "
        "plan, "
        f"{span(r['pipeline_ratio_pgbench'] for r in own)} pipelined on the threaded worker and "
        f"{span(r['async_pipeline_ratio_pgbench'] for r in own)} pipelined on the asyncio worker, whose "
        "exchanges cost less client CPU a job at every point, with the database on cores of its own and "
        "sharing them"
    )
    assert phrase in text, phrase
    for run in PAIR.runs:
        for r in PAIR.rows(run, "postgresql", batch=False):
            assert r["async_pipeline_client_cpu_us_per_job"] < r["pipeline_client_cpu_us_per_job"], run


def test_the_docs_say_how_far_apart_the_benchmarks_load_their_jobs() -> None:
    from benchmarks.common import DUE_APART
    from benchmarks.delete_marked import APART

    assert timedelta(milliseconds=1) == DUE_APART and timedelta(seconds=1) == APART
    mysql = prose((ROOT / "docs" / "mysql.md").read_text(encoding="utf-8"))
    for phrase in (
        "`benchmarks.delete_marked` loads its jobs a second apart",
        "The throughput benchmark loads its queue a millisecond apart (`benchmarks.common.DUE_APART`)",
    ):
        assert phrase in mysql, phrase
    assert "the queue's rows are loaded a millisecond apart (`benchmarks.common.bulk_load`, `DUE_APART`)" in (
        prose(PAIR.text())
    )


TRY_RUN: Final = "limit18-try-cores-2026-12-07"


def a_second_apart() -> str:
    """MariaDB's one-job points in the first try (jobs a second apart) beside limit18-cores' (a millisecond
    apart): the limit's rate in each and the best drain's share of the first try's, as prose says them."""
    (tried,) = load_runs(TRY_RUN).values()
    own = PAIR.runs[CORES_RUN]
    return "; ".join(
        f"{point_name(r, False)} limit {r['limit_jobs_per_s']:,.0f} jobs/s against "
        f"{point_row(own, 'mysql', r['processes'], r['threads'])['limit_jobs_per_s']:,.0f}, the best drain "
        f"{best_of_limit(r, DEFAULT_DRAINS):.3f}"
        for r in throughput_rows(tried, "mysql", batch=False)
    )


def test_mariadbs_jobs_a_second_apart_are_the_first_trys() -> None:
    (tried,) = load_runs(TRY_RUN).values()
    # The first try ran before the loader changed, on the same machine, clean.
    assert tried["meta"]["git"]["commit"].startswith("1c2b28abdd") and not tried["meta"]["git"]["dirty"]
    assert tried["meta"]["machine"]["cpu_model"] == PAIR.runs[CORES_RUN]["meta"]["machine"]["cpu_model"]
    rows = throughput_rows(tried, "mysql", batch=False)
    # Jobs a second apart, the limit ran faster at every point one job a commit, and only 4 x 4 missed.
    for r in rows:
        own = point_row(PAIR.runs[CORES_RUN], "mysql", r["processes"], r["threads"])
        assert r["limit_jobs_per_s"] > own["limit_jobs_per_s"]
    assert [best_of_limit(r, DEFAULT_DRAINS) >= LIMIT_TARGET for r in rows] == [True, True, True, False]
    limits, drains = [], []
    for r in rows:
        own = point_row(PAIR.runs[CORES_RUN], "mysql", r["processes"], r["threads"])
        limits.append(r["limit_jobs_per_s"] / own["limit_jobs_per_s"])
        best = best_drain(r, DEFAULT_DRAINS)
        drains.append(r[f"{best}_jobs_per_s"] / own[f"{best}_jobs_per_s"])
    # The layout moved the limit more than the best drain at every point.
    assert all(d < lim for d, lim in zip(drains, limits, strict=True))
    (four,) = [r for r in rows if r["processes"] == 4]
    drain = best_drain(four, DEFAULT_DRAINS)
    # Its client's one core nearly full: the rate its client CPU a job allows on one core, nearly reached.
    assert four[f"{drain}_jobs_per_s"] > 0.8 * 1e6 / four[f"{drain}_client_cpu_us_per_job"]
    text = prose(PAIR.text())
    assert f"jobs a second apart against a millisecond: {a_second_apart()}" in text
    assert f"the limit ran {span(limits)} times as fast" in text
