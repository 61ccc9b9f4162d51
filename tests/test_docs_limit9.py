"""The figures docs/benchmarks.md quotes from the two limit9 runs (the asyncio chain's exchanges sent by the
backend itself, pg_exchange; the database on cores of its own, and sharing them) are theirs (README's
figures against the server's limit and docs/worker.md's word on the asyncio chain's speed are limit10's,
tests/test_docs_limit10.py).

"The asyncio exchange of its own" pastes both runs' limit and per-job cost tables and a table of the targets
met per point, and quotes in prose what the asyncio chain reached beside limit8's and its client CPU a job
beside the threaded chain's, its round trips, and the CPU bound of the points missed sharing the cores;
these tests recompute each from the runs' results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from docs_support import (
    CHAINED_BATCH_DRAINS,
    DEFAULT_DRAINS,
    LIMIT9,
    LIMIT_TARGET,
    best_of_limit,
    cpu_ceiling,
    load_runs,
    prose,
    span,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT9
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run
RUNS: Final = PAIR.runs
BEFORE: Final = load_runs("limit8-cores-2026-12-05", "limit8-shared-2026-12-05")


def what_the_exchange_changed(run: str) -> str:
    """At each PostgreSQL point of `run`: the asyncio chain's share of the limit beside limit8's same
    reading, and its client CPU a job beside the threaded chain's in the same run, as the prose says it."""
    return "; ".join(
        f"at {point} {r['async_chain_ratio_limit']:.2f} of the limit "
        f"({b['async_chain_ratio_limit']:.2f} in limit8), "
        f"{r['async_chain_client_cpu_us_per_job']:.0f} µs of client CPU a job against the threaded "
        f"chain's {r['chain_client_cpu_us_per_job']:.0f}"
        for point, r, b in PAIR.beside(run, BEFORE[run.replace("limit9", "limit8")])
    )


def test_what_the_exchange_changed_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run in RUNS:
        assert what_the_exchange_changed(run) in text, run


def test_the_cpu_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()


def test_the_best_drain_sharing_the_cores_is_the_asyncio_chain() -> None:
    PAIR.assert_async_chain_best_sharing_the_cores()


def _met_points(results: dict[str, Any], backend: str) -> list[str]:
    return [
        f"{r['processes']} x {r['threads']}{' in batch mode' if batch else ''}"
        for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS))
        for r in throughput_rows(results, backend, batch=batch)
        if best_of_limit(r, drains) >= LIMIT_TARGET
    ]


def test_what_sharing_the_cores_meets_now_and_met_in_limit8_is_the_runs() -> None:
    assert _met_points(RUNS[SHARED_RUN], "postgresql") == ["1 x 1", "4 x 4 in batch mode"]
    assert _met_points(BEFORE["limit8-shared-2026-12-05"], "postgresql") == []
    assert (
        "Sharing the cores, PostgreSQL meets 0.6 at 1 x 1 and at 4 x 4 in batch mode, where `limit8` met it "
        "nowhere." in prose(PAIR.text())
    )


def test_the_asyncio_chains_client_cpu_against_the_threaded_chains_is_the_runs() -> None:
    def above(results: dict[str, Any]) -> list[bool]:
        return [
            r["async_chain_client_cpu_us_per_job"] > r["chain_client_cpu_us_per_job"]
            for batch in (False, True)
            for r in throughput_rows(results, "postgresql", batch=batch)
        ]

    # "more ... at every point" in limit8 on cores of its own; "less at every point but 4 x 4 in batch mode".
    assert all(above(BEFORE["limit8-cores-2026-12-05"]))
    assert above(RUNS[CORES_RUN]) == [False, False, False, False, False, True]
    assert not any(above(RUNS[SHARED_RUN]))
    text = prose(PAIR.text())
    assert "here it costs less at every point but 4 x 4 in batch mode" in text
    chain9 = span(r["chain_ratio_limit"] for r in PAIR.rows(CORES_RUN, "postgresql", batch=False))
    chain8 = span(
        r["chain_ratio_limit"]
        for r in throughput_rows(BEFORE["limit8-cores-2026-12-05"], "postgresql", batch=False)
    )
    assert f"as the asyncio chain's did ({chain9} here, {chain8} there)" in text
    for r, b in zip(
        PAIR.rows(CORES_RUN, "postgresql", batch=False),
        throughput_rows(BEFORE["limit8-cores-2026-12-05"], "postgresql", batch=False),
        strict=True,
    ):
        assert r["chain_ratio_limit"] < b["chain_ratio_limit"]
        assert r["async_chain_ratio_limit"] < b["async_chain_ratio_limit"]


def test_the_point_under_its_cpu_bound_is_4_x_4_whose_server_cpu_alone_is_over_the_limits_job() -> None:
    shared = RUNS[SHARED_RUN]
    cores = int(shared["meta"]["machine"]["logical_cores"])
    under = [
        (r, batch)
        for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS))
        for r in throughput_rows(shared, "postgresql", batch=batch)
        if best_of_limit(r, drains) < LIMIT_TARGET and cpu_ceiling(shared, r, drains) < LIMIT_TARGET
    ]
    assert [(r["processes"], r["threads"], batch) for r, batch in under] == [(4, 4, False)]
    ((row, _batch),) = under
    assert row["async_chain_server_cpu_us_per_job"] > cores * 1e6 / row["limit_jobs_per_s"]
    assert "Under 0.6 (at 4 x 4) CPU is the bound" in prose(PAIR.text())
