"""The figures docs/benchmarks.md, docs/worker.md and README.md quote from the two limit20 runs are theirs.

limit20 is the reference pair against the server's limit from limit20 on: PostgreSQL, MariaDB on PyMySQL and
on mysqlclient, the asyncio chain on uvloop's event loop beside asyncio's; the database on cores of its own,
then sharing them. "The asyncio chain on uvloop against the limit" pastes both runs' tables and the targets
per point (tests/test_docs_limit_pairs.py checks them, LIMIT20 counting the uvloop drain and mysqlclient's
rows); these tests recompute what its prose, README's paragraph against the limit and worker.md's "Event
loop" quote, so a new run with stale prose fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from docs_support import (
    DATABASES,
    LIMIT18,
    LIMIT20,
    LIMIT_TARGET,
    PGBENCH_BAR,
    best_drain,
    best_of_limit,
    missed,
    point_name,
    point_row,
    prose,
    span,
)

ROOT: Final = Path(__file__).resolve().parent.parent
PAIR: Final = LIMIT20
CORES_RUN: Final = PAIR.cores_run
SHARED_RUN: Final = PAIR.shared_run
# The asyncio worker's databases: mysqlclient's rows drain no asyncio worker (it runs aiomysql either way).
ASYNC_DATABASES: Final = DATABASES


def _rows(run: str, backend: str) -> list[tuple[dict[str, Any], bool]]:
    return [(r, batch) for batch in (False, True) for r in PAIR.rows(run, backend, batch=batch)]


def _both(backend: str) -> list[dict[str, Any]]:
    """Every point of `backend` in both runs, one job a commit and batch mode."""
    return [r for run in PAIR.runs for r, _ in _rows(run, backend)]


def uvloop_beside(run: str, backend: str) -> str:
    """At each point of `backend` in `run`, the asyncio chain on uvloop over the same on asyncio's loop (the
    median of the rounds' paired ratios), and each one's client CPU a job, as prose says them."""
    return ", ".join(
        f"{point_name(r, batch)} {r['uvloop_ratio']:.2f} "
        f"({r['async_chain_uvloop_client_cpu_us_per_job']:.0f} "
        f"against {r['async_chain_client_cpu_us_per_job']:.0f} µs)"
        for r, batch in _rows(run, backend)
    )


def less_cpu(backend: str) -> str:
    """At how many points of both runs uvloop's chain spent less client CPU a job than asyncio's."""
    rows = _both(backend)
    fewer = sum(
        r["async_chain_uvloop_client_cpu_us_per_job"] < r["async_chain_client_cpu_us_per_job"] for r in rows
    )
    return f"{fewer} of {len(rows)}"


def less_cpu_both() -> str:
    return (
        f"uvloop's chain spent less client CPU a job than asyncio's at {less_cpu('postgresql')} PostgreSQL "
        f"points and {less_cpu('mysql')} MariaDB points"
    )


def _cut(r: dict[str, Any]) -> float:
    """How much less client CPU a job uvloop's chain spent than asyncio's at the row's point."""
    return float(1 - r["async_chain_uvloop_client_cpu_us_per_job"] / r["async_chain_client_cpu_us_per_job"])


def _assert_quoted(text: str, phrases: list[str]) -> None:
    for phrase in phrases:
        assert phrase in text, phrase


def test_the_asyncio_chain_on_uvloop_beside_asyncios_loop_is_the_runs() -> None:
    _assert_quoted(
        prose(PAIR.text()),
        [
            f"The asyncio chain on uvloop over asyncio's loop, {name} {reading} (the paired median, then "
            f"each one's client CPU a job): {uvloop_beside(run, backend)}"
            for run, reading in PAIR.readings.items()
            for backend, name in ASYNC_DATABASES.items()
        ],
    )


def test_what_uvloop_was_worth_is_the_runs() -> None:
    def ratios(backend: str) -> str:
        return span(r["uvloop_ratio"] for r in _both(backend))

    _assert_quoted(
        prose(PAIR.text()),
        [
            f"Over both runs {less_cpu_both()}, and the paired ratio ranged {ratios('postgresql')} on "
            f"PostgreSQL and {ratios('mysql')} on MariaDB",
            f"at most PostgreSQL points, by up to {max(_cut(r) for r in _both('postgresql')):.0%}",
        ],
    )


def test_the_point_limit18_missed_sharing_the_cores_is_met() -> None:
    """PostgreSQL 4 x 4 one job a commit sharing the cores: missed in limit18, met here, by which drain."""
    before = point_row(LIMIT18.runs[LIMIT18.shared_run], "postgresql", 4, 4)
    after = point_row(PAIR.runs[SHARED_RUN], "postgresql", 4, 4)
    was, now = best_of_limit(before, LIMIT18.default_drains), best_of_limit(after, PAIR.default_drains)
    assert was < LIMIT_TARGET <= now
    drain = best_drain(after, PAIR.default_drains).replace("_", " ")
    own = point_row(PAIR.runs[CORES_RUN], "postgresql", 1, 1)["limit_jobs_per_s"]
    limit18 = point_row(LIMIT18.runs[LIMIT18.cores_run], "postgresql", 1, 1)["limit_jobs_per_s"]
    _assert_quoted(
        prose(PAIR.text()),
        [
            f"PostgreSQL's 4 x 4 one job a commit sharing the cores, which `limit18` missed at {was:.3f}, "
            f"reached {now:.3f} (*{drain}*; the asyncio chain on asyncio's loop "
            f"{after['async_chain_ratio_limit']:.3f})",
            f"PostgreSQL's limit at 1 x 1 on cores of its own: {own:,.0f} jobs/s against limit18's "
            f"{limit18:,.0f}",
        ],
    )


def test_what_the_drains_limit18_counted_met_is_the_runs() -> None:
    def shares(drains: tuple[str, ...], *, batch: bool) -> list[float]:
        return [best_of_limit(r, drains) for r in PAIR.rows(SHARED_RUN, "postgresql", batch=batch)]

    one, batch = shares(LIMIT18.default_drains, batch=False), shares(LIMIT18.batch_drains, batch=True)
    (without,) = [
        r
        for r in PAIR.rows(SHARED_RUN, "postgresql", batch=True)
        if best_of_limit(r, LIMIT18.batch_drains) < LIMIT_TARGET
    ]
    _assert_quoted(
        prose(PAIR.text()),
        [
            "Counting only the drains `limit18` counted (no uvloop), sharing the cores PostgreSQL meets 0.6 "
            "at "
            f"{sum(b >= LIMIT_TARGET for b in one)} of {len(one)} points one job a commit and "
            f"{sum(b >= LIMIT_TARGET for b in batch)} of {len(batch)} in batch mode: "
            f"{point_name(without, True)} reached {best_of_limit(without, LIMIT18.batch_drains):.3f} on "
            f"asyncio's loop and {without['async_chain_uvloop_ratio_limit']:.2f} on uvloop's",
        ],
    )


def _met_sharing(pair: Any) -> int:
    rows = pair.rows(pair.shared_run, "postgresql", batch=False)
    return sum(r["async_pipeline_ratio_pgbench"] >= PGBENCH_BAR for r in rows)


def test_the_exact_plans_bar_is_the_runs() -> None:
    _assert_quoted(
        prose(PAIR.text()),
        [
            "Its client CPU a job on the asyncio worker sharing the cores: "
            f"{PAIR.async_pipeline_costs(SHARED_RUN)}",
            f"as in `limit18`, which met it at {_met_sharing(LIMIT18)} of 4 points sharing the cores",
        ],
    )


def test_mysqlclients_threaded_chain_was_the_best_drain_at_most_of_its_points() -> None:
    bests = [
        best_drain(r, drains)
        for run in PAIR.runs
        for batch, drains in PAIR.targets
        for r in PAIR.rows(run, "mysqlclient", batch=batch)
    ]
    assert bests.count("chain") > len(bests) / 2
    assert "mysqlclient's threaded chain was the best drain at most of its points" in prose(PAIR.text())


def test_readmes_figures_against_the_limit_are_the_runs() -> None:
    def best(run: str, backend: str, *, batch: bool) -> str:
        drains = PAIR.batch_drains if batch else PAIR.default_drains
        return span(best_of_limit(r, drains) for r in PAIR.rows(run, backend, batch=batch))

    # "every point meets issue 31's 0.6, on both databases and on both MariaDB drivers"
    for run, results in PAIR.runs.items():
        for backend in PAIR.databases:
            assert not missed(results, backend, PAIR.default_drains, batch=False), (run, backend)
            assert not missed(results, backend, PAIR.batch_drains, batch=True), (run, backend)
    own = PAIR.rows(CORES_RUN, "postgresql", batch=False)
    phrases = [
        f"named runs `{CORES_RUN}` and `{SHARED_RUN}`",
        "every point meets issue 31's 0.6, on both databases and on both MariaDB drivers",
        *(
            f"{reading}, {name} {best(run, backend, batch=False)} one job a commit "
            f"({PAIR.met(run, backend, batch=False)} points met) and {best(run, backend, batch=True)} in "
            f"batch mode ({PAIR.met(run, backend, batch=True)})"
            for run, reading in PAIR.readings.items()
            for backend, name in PAIR.databases.items()
        ),
        "Proletarian's exact statements, pipelined on the asyncio worker "
        "(`AsyncPostgresBackend(pipeline=True)`), ran at "
        f"{span(r['async_pipeline_ratio_pgbench'] for r in own)} of pgbench running the same statements in "
        f"`{CORES_RUN}` (0.95 met at {sum(r['async_pipeline_ratio_pgbench'] >= PGBENCH_BAR for r in own)} of "
        f"{len(own)} points; sharing the cores at {_met_sharing(PAIR) or 'none'}",
    ]
    _assert_quoted(prose((ROOT / "README.md").read_text(encoding="utf-8")), phrases)


def test_worker_mds_event_loop_figures_are_the_runs() -> None:
    shared = point_row(PAIR.runs[SHARED_RUN], "postgresql", 4, 4)
    _assert_quoted(
        prose((ROOT / "docs" / "worker.md").read_text(encoding="utf-8")),
        [
            less_cpu_both(),
            f"at PostgreSQL's 4 x 4 sharing the cores it drained {shared['uvloop_ratio']:.2f} times as fast "
            f"({shared['async_chain_uvloop_ratio_limit']:.2f} of the server's limit against "
            f"{shared['async_chain_ratio_limit']:.2f})",
        ],
    )


def _busy(run: str, *, many: bool) -> list[tuple[float, float]]:
    """Each point's best drain (of the targets' drains) in `run`, at more than one connection (`many`) or at
    one: the core-seconds a second its server connections and its client kept busy (CPU a job x rate)."""
    found = []
    for backend in PAIR.databases:
        for batch, drains in PAIR.targets:
            for r in PAIR.rows(run, backend, batch=batch):
                if (r["concurrency"] > 1) != many:
                    continue
                drain = best_drain(r, drains)
                rate = r[f"{drain}_jobs_per_s"]
                found.append(
                    (
                        rate * r[f"{drain}_server_cpu_us_per_job"] / 1e6,
                        rate * r[f"{drain}_client_cpu_us_per_job"] / 1e6,
                    )
                )
    return found


def test_what_bounds_the_drains_is_the_runs() -> None:
    own, own_one = _busy(CORES_RUN, many=True), _busy(CORES_RUN, many=False)
    shared, shared_one = _busy(SHARED_RUN, many=True), _busy(SHARED_RUN, many=False)
    _assert_quoted(
        prose(PAIR.text()),
        [
            "at every point of more than one connection it kept the server's connections "
            f"{span(server for server, _ in own)} core-seconds a second busy: the server's one core is the "
            "bound",
            f"At 1 x 1 the server's {span(server for server, _ in own_one)} and the client's "
            f"{span(client for _, client in own_one)}",
            "its client and server together kept "
            f"{span(server + client for server, client in shared)} core-seconds a second busy of the two "
            "cores",
            f"(at 1 x 1, {span(server + client for server, client in shared_one)})",
        ],
    )
