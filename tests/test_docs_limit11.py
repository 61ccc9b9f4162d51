"""The figures docs/benchmarks.md quotes from the two limit11 runs (BEGIN and COMMIT prepared by the asyncio
chain's backend; the database on cores of its own, and sharing them) are theirs.

"BEGIN and COMMIT prepared" pastes both runs' limit and per-job cost tables and a table of the targets met
per point, and quotes in prose the asyncio chain's share of the limit and its server CPU a job as a share of
the threaded chain's beside limit10's, what moved against limit10, and the CPU bound of the points missed
sharing the cores; these tests recompute each from the runs' results.json, so a new run with stale prose
fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from docs_support import (
    CHAINED_BATCH_DRAINS,
    DEFAULT_DRAINS,
    LIMIT10,
    LIMIT11,
    LIMIT_TARGET,
    best_drain,
    best_of_limit,
    cores_runs,
    load_runs,
    point_row,
    prose,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT11
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run
RUNS: Final = PAIR.runs
BEFORE: Final = LIMIT10.runs
MYSQL_DEFAULT_DRAINS: Final = ("compact", "async")


def _before(run: str) -> dict[str, Any]:
    return BEFORE[run.replace("limit11", "limit10")]


def _server_share(row: dict[str, Any]) -> float:
    """The asyncio chain's server CPU a job as a share of the threaded chain's, at one point of one run."""
    return float(row["async_chain_server_cpu_us_per_job"] / row["chain_server_cpu_us_per_job"])


def what_preparing_changed(run: str) -> str:
    """At each PostgreSQL point of `run`: the asyncio chain's share of the limit and its server CPU a job as
    a share of the threaded chain's, each beside limit10's, as the prose says it."""
    return "; ".join(
        f"at {point} {r['async_chain_ratio_limit']:.2f} of the limit ({b['async_chain_ratio_limit']:.2f} in "
        f"limit10), {_server_share(r):.2f} of the threaded chain's server CPU a job ({_server_share(b):.2f})"
        for point, r, b in PAIR.beside(run, _before(run))
    )


def test_the_best_drain_sharing_the_cores_is_the_asyncio_chain_but_at_1_x_1_the_threaded_chain() -> None:
    best = [
        best_drain(r, drains)
        for batch, drains in ((False, DEFAULT_DRAINS), (True, CHAINED_BATCH_DRAINS))
        for r in PAIR.rows(SHARED_RUN, "postgresql", batch=batch)
    ]
    assert best == ["chain"] + ["async_chain"] * 5
    one = point_row(RUNS[SHARED_RUN], "postgresql", 1, 1)
    text = prose(PAIR.text())
    assert (
        "Sharing the cores the asyncio chain was the best drain at every PostgreSQL point but 1 x 1, where "
        f"the threaded chain was ({one['chain_ratio_limit']:.2f} of the limit against "
        f"{one['async_chain_ratio_limit']:.2f})" in text
    )
    assert (
        f"the best drain at every point of the shared run but 1 x 1, where the threaded chain led it by "
        f"{one['chain_ratio_limit'] - one['async_chain_ratio_limit']:.2f}" in text
    )


def test_what_moved_against_limit10_is_the_runs() -> None:
    shared, before = (
        throughput_rows(r, "postgresql", batch=True) for r in (RUNS[SHARED_RUN], _before(SHARED_RUN))
    )
    assert [(r["processes"], r["threads"]) for r in shared] == [(1, 4), (4, 4)]
    now = [best_of_limit(r, CHAINED_BATCH_DRAINS) for r in shared]
    then = [best_of_limit(r, CHAINED_BATCH_DRAINS) for r in before]
    assert now[1] >= LIMIT_TARGET > then[1] and then[0] > now[0] and now[0] < LIMIT_TARGET
    mysql, mysql_before = (point_row(r, "mysql", 1, 1) for r in (RUNS[CORES_RUN], _before(CORES_RUN)))
    assert (
        best_of_limit(mysql, MYSQL_DEFAULT_DRAINS)
        < LIMIT_TARGET
        <= best_of_limit(mysql_before, MYSQL_DEFAULT_DRAINS)
    )
    text = prose(PAIR.text())
    for phrase in (
        f"4 x 4 in batch mode is met ({now[1]:.3f}; {then[1]:.3f} in `limit10`) and 1 x 4 in batch mode is "
        f"missed by a little more ({now[0]:.3f}; {then[0]:.3f} in `limit10`)",
        f"MariaDB's 1 x 1 is missed ({best_of_limit(mysql, MYSQL_DEFAULT_DRAINS):.3f}; "
        f"{best_of_limit(mysql_before, MYSQL_DEFAULT_DRAINS):.3f} in `limit10`)",
        f"reached {mysql['raw_ratio_limit']:.2f} of the limit there too "
        f"({mysql_before['raw_ratio_limit']:.2f} in `limit10`)",
    ):
        assert phrase in text, phrase


def test_mariadbs_1_x_1_on_cores_of_its_own_over_every_such_run_is_the_spread_quoted() -> None:
    # The runs up to this one: the section speaks of those.
    names = cores_runs(before=12)
    runs = load_runs(*names)
    ones = {
        name: best_of_limit(point_row(run, "mysql", 1, 1), MYSQL_DEFAULT_DRAINS) for name, run in runs.items()
    }
    assert names[0] == "limit4-cores-2026-12-05" and names[-1] == CORES_RUN and len(names) == 8
    # Met in every such run before this one.
    assert [name for name, value in ones.items() if value < LIMIT_TARGET] == [CORES_RUN]
    low, high = min(ones.values()), max(ones.values())
    assert (
        f"over the {len(names)} runs with the database on cores of its own, from `limit4` on, that point "
        f"ranged {low:.3f} to {high:.3f}" in prose(PAIR.text())
    )


def test_what_preparing_begin_and_commit_changed_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run in RUNS:
        assert what_preparing_changed(run) in text, run
    pairs = [(r, b) for run in RUNS for _point, r, b in PAIR.beside(run, _before(run))]
    higher = sum(r["async_chain_ratio_limit"] > b["async_chain_ratio_limit"] for r, b in pairs)
    lower = sum(_server_share(r) < _server_share(b) for r, b in pairs)
    assert (
        f"share of the limit is higher than in `limit10` at {higher} of {len(pairs)} points, its server CPU "
        f"a job as a share of the threaded chain's lower at {lower} of {len(pairs)}" in text
    )
    four = point_row(RUNS[CORES_RUN], "postgresql", 4, 4)
    four_before = point_row(_before(CORES_RUN), "postgresql", 4, 4)
    assert _server_share(four) > _server_share(four_before)
    assert (
        f"at 4 x 4 with the database on cores of its own it went from {_server_share(four_before):.2f} to "
        f"{_server_share(four):.2f}, the wrong way" in text
    )


def test_the_cpu_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()


def test_no_missed_shared_point_is_under_its_cpu_bound_and_4_x_4s_server_cpu_is_under_the_limits() -> None:
    PAIR.assert_every_missed_shared_point_waited()
    shared = RUNS[SHARED_RUN]
    cores = int(shared["meta"]["machine"]["logical_cores"])

    def job_us(results: dict[str, Any]) -> tuple[float, float]:
        row = point_row(results, "postgresql", 4, 4)
        return float(row["async_chain_server_cpu_us_per_job"]), cores * 1e6 / row["limit_jobs_per_s"]

    server, limit = job_us(shared)
    before_server, before_limit = job_us(_before(SHARED_RUN))
    assert server < limit and before_server > before_limit
    assert (
        f"At 4 x 4 the server's CPU a job for the asyncio chain's four statements ({server:.0f} µs) is now "
        f"under the limit's whole job ({limit:.0f} µs of the two cores); in `limit10` it was above"
        in prose(PAIR.text())
    )
