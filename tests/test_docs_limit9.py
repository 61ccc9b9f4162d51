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
    missed_cpu_bounds,
    over_ceiling,
    point_row,
    prose,
    section,
    span,
    targets_table,
    throughput_rows,
)

from benchmarks.async_drain import ASYNC_CHAIN_BACKEND

ROOT: Final = Path(__file__).resolve().parent.parent
CORES_RUN: Final = "limit9-cores-2026-12-05"
SHARED_RUN: Final = "limit9-shared-2026-12-05"
RUNS: Final = load_runs(CORES_RUN, SHARED_RUN)
BEFORE: Final = load_runs("limit8-cores-2026-12-05", "limit8-shared-2026-12-05")
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
READINGS: Final = {CORES_RUN: "on cores of its own", SHARED_RUN: "sharing the cores"}


def _section() -> str:
    return section(
        BENCHMARKS_MD,
        f"### The asyncio exchange of its own: `{CORES_RUN}` and `{SHARED_RUN}`",
        "\n## ",
    )


def _rows(run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return throughput_rows(RUNS[run], backend, batch=batch)


def _met(run: str, backend: str, *, batch: bool) -> str:
    rows = _rows(run, backend, batch=batch)
    drains = CHAINED_BATCH_DRAINS if batch else DEFAULT_DRAINS
    return f"{sum(best_of_limit(r, drains) >= LIMIT_TARGET for r in rows)} of {len(rows)}"


def what_the_exchange_changed(run: str) -> str:
    """At each PostgreSQL point of `run`: the asyncio chain's share of the limit beside limit8's same
    reading, and its client CPU a job beside the threaded chain's in the same run, as the prose says it."""
    before_run = run.replace("limit9", "limit8")
    phrases = []
    for batch in (False, True):
        before = throughput_rows(BEFORE[before_run], "postgresql", batch=batch)
        for r, b in zip(_rows(run, "postgresql", batch=batch), before, strict=True):
            assert (r["processes"], r["threads"]) == (b["processes"], b["threads"])
            point = f"{r['processes']} x {r['threads']}{' in batch mode' if batch else ''}"
            phrases.append(
                f"at {point} {r['async_chain_ratio_limit']:.2f} of the limit "
                f"({b['async_chain_ratio_limit']:.2f} in limit8), "
                f"{r['async_chain_client_cpu_us_per_job']:.0f} µs of client CPU a job against the threaded "
                f"chain's {r['chain_client_cpu_us_per_job']:.0f}"
            )
    return "; ".join(phrases)


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


def test_the_asyncio_chain_drained_on_the_backends_own_exchange_one_a_job() -> None:
    for run in RUNS.values():
        (pg,) = [e for e in run["benchmarks"]["throughput"] if e["backend"] == "postgresql"]
        assert pg["async_chain_backend"] == ASYNC_CHAIN_BACKEND
        # The exchanges are counted (pg_exchange.read_results): one a job, as in limit8.
        one = point_row(run, "postgresql", 1, 1)
        assert round(one["async_chain_round_trips_per_job"]) == 1
    one = point_row(RUNS[CORES_RUN], "postgresql", 1, 1)
    assert f"At 1 x 1 it took {one['async_chain_round_trips_per_job']:.2f} round trips a job" in prose(
        _section()
    )


def test_the_targets_table_is_the_runs() -> None:
    text = _section()
    for line in targets_table(RUNS, READINGS, DATABASES, DEFAULT_DRAINS, CHAINED_BATCH_DRAINS, TARGET_DIGITS):
        assert line in text, line


def test_what_the_exchange_changed_is_the_runs() -> None:
    text = prose(_section())
    for run in RUNS:
        assert what_the_exchange_changed(run) in text, run


def test_where_the_targets_stand_is_the_runs() -> None:
    text = prose(_section())
    for run, reading in READINGS.items():
        for backend, name in DATABASES.items():
            phrase = (
                f"{reading}, {name} meets 0.6 at {_met(run, backend, batch=False)} points one job a commit "
                f"and {_met(run, backend, batch=True)} in batch mode"
            )
            assert phrase in text or phrase[0].upper() + phrase[1:] in text, phrase


def test_the_cpu_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    text = prose(_section())
    shared = RUNS[SHARED_RUN]
    for phrase in missed_cpu_bounds(shared):
        assert phrase in text, phrase
    assert f"Over 0.6: {over_ceiling(shared, DEFAULT_DRAINS, CHAINED_BATCH_DRAINS)}." in text


def test_the_best_drain_sharing_the_cores_is_the_asyncio_chain() -> None:
    for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS)):
        for r in _rows(SHARED_RUN, "postgresql", batch=batch):
            assert best_drain(r, drains) == "async_chain", (r["processes"], r["threads"], batch)
    assert "Sharing the cores the asyncio chain was the best drain at every PostgreSQL point" in prose(
        _section()
    )


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
        "nowhere." in prose(_section())
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
    text = prose(_section())
    assert "here it costs less at every point but 4 x 4 in batch mode" in text
    chain9 = span(r["chain_ratio_limit"] for r in _rows(CORES_RUN, "postgresql", batch=False))
    chain8 = span(
        r["chain_ratio_limit"]
        for r in throughput_rows(BEFORE["limit8-cores-2026-12-05"], "postgresql", batch=False)
    )
    assert f"as the asyncio chain's did ({chain9} here, {chain8} there)" in text
    for r, b in zip(
        _rows(CORES_RUN, "postgresql", batch=False),
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
    assert "Under 0.6 (at 4 x 4) CPU is the bound" in prose(_section())
