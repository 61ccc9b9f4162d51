"""The figures docs/benchmarks.md quotes from the two limit12 runs (the limit's own costs a job measured too;
the database on cores of its own, and sharing them) are theirs, and so are README's figures against the
server's limit (until limit13) and docs/worker.md's word on the asyncio chain's speed.

"The limit's own costs a job" pastes both runs' limit and per-job cost tables and a table of the targets met
per point, and quotes in prose, at each point, the limit's server and client CPU a job beside the best
drain's; these tests recompute each from the runs' results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from docs_support import (
    BATCH_DRAIN_LABELS,
    CHAINED_BATCH_DRAINS,
    DATABASES,
    DEFAULT_DRAINS,
    DRAIN_LABELS,
    LIMIT11,
    LIMIT12,
    LIMIT_TARGET,
    best_drain,
    best_of_limit,
    missed,
    point_row,
    prose,
    span,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT12
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run
TOOLS: Final = {"postgresql": "pgbench", "mysql": "mariadb-slap"}


def _drains(*, batch: bool) -> tuple[tuple[str, ...], dict[str, str]]:
    """Issue 31's drains for the target one job a commit or in batch mode, and their names in the tables
    (MariaDB has no chained ones: best_drain passes over what a row lacks)."""
    return (CHAINED_BATCH_DRAINS, BATCH_DRAIN_LABELS) if batch else (DEFAULT_DRAINS, DRAIN_LABELS)


def server_over_limit(row: dict[str, Any], drain: str) -> float:
    """A drain's server CPU a job over the limit's, at one point."""
    return float(row[f"{drain}_server_cpu_us_per_job"] / row["limit_server_cpu_us_per_job"])


def what_the_limit_costs(run: str, backend: str) -> str:
    """At each point of `run` on `backend`: the limit's server CPU a job and its tool's client CPU, and the
    best drain's (which reached the largest share of the limit there), as the prose says it."""
    phrases = []
    for batch in (False, True):
        drains, labels = _drains(batch=batch)
        for r in PAIR.rows(run, backend, batch=batch):
            drain = best_drain(r, drains)
            phrases.append(
                f"at {r['processes']} x {r['threads']}{' in batch mode' if batch else ''} the limit's "
                f"{r['limit_server_cpu_us_per_job']:.0f} µs of server CPU and {TOOLS[backend]}'s "
                f"{r['limit_client_cpu_us_per_job']:.0f} µs of client CPU, the best drain's "
                f"(*{labels[drain]}*) {r[f'{drain}_server_cpu_us_per_job']:.0f} µs "
                f"({server_over_limit(r, drain):.2f} of the limit's) and "
                f"{r[f'{drain}_client_cpu_us_per_job']:.0f} µs"
            )
    return "; ".join(phrases)


def server_share_span(backend: str) -> str:
    """The best drains' server CPU a job over the limit's, lowest to highest over both runs' points."""
    values = []
    for run in PAIR.runs:
        for batch in (False, True):
            drains, _labels = _drains(batch=batch)
            for r in PAIR.rows(run, backend, batch=batch):
                values.append(server_over_limit(r, best_drain(r, drains)))
    return span(values)


def beside_limit11() -> str:
    """Each PostgreSQL point of the shared run, its best share of the limit beside limit11's, as the prose
    says it: the same library code on another machine."""
    return "; ".join(
        f"{point} {best_of_limit(r, _drains(batch='batch' in point)[0]):.3f} "
        f"({best_of_limit(b, _drains(batch='batch' in point)[0]):.3f} in `limit11`)"
        for point, r, b in PAIR.beside(SHARED_RUN, LIMIT11.runs[LIMIT11.shared_run])
    )


def limit_rates_beside_limit11() -> str:
    """The server's limit at every point of both runs and both databases over limit11's at the same point,
    lowest to highest: how much slower or faster this machine's server was."""
    ratios = []
    for run in PAIR.runs:
        before = LIMIT11.runs[run.replace("limit12", "limit11")]
        for backend in DATABASES:
            for batch in (False, True):
                rows = PAIR.rows(run, backend, batch=batch)
                for r, b in zip(rows, throughput_rows(before, backend, batch=batch), strict=True):
                    assert (r["processes"], r["threads"]) == (b["processes"], b["threads"])
                    ratios.append(r["limit_jobs_per_s"] / b["limit_jobs_per_s"])
    return span(ratios)


def largest_move_beside_limit11() -> float:
    """The largest change of the best share of the limit at a PostgreSQL point of the shared run, against
    limit11's at the same point."""
    return max(
        abs(
            best_of_limit(r, _drains(batch="batch" in point)[0])
            - best_of_limit(b, _drains(batch="batch" in point)[0])
        )
        for point, r, b in PAIR.beside(SHARED_RUN, LIMIT11.runs[LIMIT11.shared_run])
    )


def missed_shares() -> str:
    """At each PostgreSQL point missed sharing the cores, the best drain's server CPU a job over the limit's
    and its client CPU over pgbench's, as the prose says it."""
    shared = PAIR.runs[SHARED_RUN]
    phrases = []
    for batch in (False, True):
        drains, _labels = _drains(batch=batch)
        for r in missed(shared, "postgresql", drains, batch=batch):
            drain = best_drain(r, drains)
            client = r[f"{drain}_client_cpu_us_per_job"] / r["limit_client_cpu_us_per_job"]
            phrases.append(
                f"at {r['processes']} x {r['threads']}{' in batch mode' if batch else ''} "
                f"{server_over_limit(r, drain):.2f} of the limit's server CPU and {client:.1f} times "
                "pgbench's client CPU"
            )
    return "; ".join(phrases)


def test_what_the_limit_costs_a_job_beside_the_best_drain_is_the_runs() -> None:
    text = prose(PAIR.text())
    for run, reading in PAIR.readings.items():
        for backend, name in DATABASES.items():
            phrase = f"{name}, {reading}: {what_the_limit_costs(run, backend)}"
            assert phrase in text, phrase
    phrase = (
        f"the best drain's server CPU a job was {server_share_span('postgresql')} of the limit's on "
        f"PostgreSQL and {server_share_span('mysql')} on MariaDB"
    )
    assert phrase in text, phrase


def test_the_shared_points_beside_limit11_and_what_the_missed_ones_cost_are_the_runs() -> None:
    text = prose(PAIR.text())
    for phrase in (
        beside_limit11(),
        missed_shares(),
        f"the server's limit here ran at {limit_rates_beside_limit11()} of `limit11`'s at the same points",
        f"a point within about {largest_move_beside_limit11():.2f} of 0.6 is met or missed by the run",
    ):
        assert phrase and phrase in text, phrase


def test_mariadbs_1_x_1_on_cores_of_its_own_is_missed_and_its_costs_are_the_runs() -> None:
    row = point_row(PAIR.runs[CORES_RUN], "mysql", 1, 1)
    assert best_drain(row, DEFAULT_DRAINS) == "compact" and best_of_limit(row, DEFAULT_DRAINS) < LIMIT_TARGET
    client, tool = row["compact_client_cpu_us_per_job"], row["limit_client_cpu_us_per_job"]
    server, limit = row["compact_server_cpu_us_per_job"], row["limit_server_cpu_us_per_job"]
    phrase = (
        f"the compact plan's client CPU a job ({client:.0f} µs) is {client / tool:.0f} times mariadb-slap's "
        f"({tool:.0f} µs), and its server CPU ({server:.0f} µs) {server / limit:.2f} of the limit's "
        f"({limit:.0f} µs)"
    )
    before = best_of_limit(point_row(LIMIT11.runs[LIMIT11.cores_run], "mysql", 1, 1), DEFAULT_DRAINS)
    assert before < LIMIT_TARGET
    text = prose(PAIR.text())
    for quoted in (phrase, f"MariaDB's 1 x 1 is missed again ({before:.3f} in `limit11`)"):
        assert quoted in text, quoted


def test_the_cpu_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    PAIR.assert_missed_cpu_bounds()
    PAIR.assert_every_missed_shared_point_waited()


def test_the_asyncio_chain_is_the_best_drain_at_every_postgresql_point_sharing_the_cores() -> None:
    PAIR.assert_async_chain_best_sharing_the_cores()


def test_worker_mds_word_on_the_pipelined_asyncio_chain_is_the_runs() -> None:
    text = prose((ROOT / "docs" / "worker.md").read_text(encoding="utf-8"))
    for phrase in (
        "then it drained faster than asyncpg's compact plan at every point of the named runs `limit12` "
        "against the server's limit, and sharing the database's cores it was the fastest drain at every "
        "point",
        "cost less client CPU a job than the threaded chain in psycopg's pipeline mode at every point of the "
        "named runs `limit12` against the server's limit, with the database on cores of its own and sharing "
        "them, and sharing the database's cores it was the fastest drain at every point",
    ):
        assert phrase in text, phrase
    PAIR.assert_async_chain_best_sharing_the_cores()
    for run in PAIR.runs.values():
        for batch in (False, True):
            for r in throughput_rows(run, "postgresql", batch=batch):
                assert r["async_chain_ratio_limit"] > r["async_ratio_limit"]
                assert r["async_chain_client_cpu_us_per_job"] < r["chain_client_cpu_us_per_job"]
