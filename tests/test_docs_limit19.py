"""The figures docs/benchmarks.md and docs/mysql.md quote from limit19's four runs (MariaDB on PyMySQL and on
mysqlclient, jobs a millisecond and a second apart, the database on cores of its own and sharing them) are the
runs' own: the section's table is rebuilt from the JSON here, and each figure its prose quotes recomputed.
"""

from __future__ import annotations

from typing import Any, Final

import pytest
from docs_support import (
    BENCHMARKS_MD,
    LIMIT_TARGET,
    RESULTS_DIR,
    load_runs,
    prose,
    run_named,
    section,
    throughput_rows,
)

RUNS: Final = {
    "limit19-cores-2026-12-07": "a millisecond apart, on cores of its own",
    "limit19-apart-cores-2026-12-07": "a second apart, on cores of its own",
    "limit19-shared-2026-12-07": "a millisecond apart, sharing the cores",
    "limit19-apart-shared-2026-12-07": "a second apart, sharing the cores",
}
DRIVERS: Final = {"mysql": "PyMySQL", "mysqlclient": "mysqlclient"}
# The drains whose driver the run chose: the threaded worker's (the asyncio worker is on aiomysql either way).
THREADED: Final = ("library", "compact", "chain")
HEADING: Final = (
    "### MySQL's two drivers against the limit: `limit19-cores-2026-12-07`, "
    "`limit19-apart-cores-2026-12-07`, `limit19-shared-2026-12-07` and `limit19-apart-shared-2026-12-07`"
)
LOADED: Final = load_runs(*RUNS)


def _text() -> str:
    return section(BENCHMARKS_MD, HEADING, "\n## ")


def _best(row: dict[str, Any]) -> float:
    return max(float(row[f"{d}_ratio_limit"]) for d in THREADED if f"{d}_ratio_limit" in row)


def _rows(run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return throughput_rows(LOADED[run], backend, batch=batch)


def driver_table() -> list[str]:
    """The section's table: per run and driver, the best threaded drain's share of the limit at each point,
    and the chain's client CPU a job there."""
    lines = [
        "| jobs, database | driver | best threaded drain of limit, 1 x 1 / 1 x 4 / 1 x 8 / 4 x 4 "
        "| batch, 1 x 4 / 4 x 4 | chain's client CPU µs/job, same points | batch chain's |",
        "|---|---|---|---|---|---|",
    ]
    for run, reading in RUNS.items():
        for backend, name in DRIVERS.items():
            one, batch = _rows(run, backend, batch=False), _rows(run, backend, batch=True)
            cells = [
                " / ".join(f"{_best(r):.2f}" for r in one),
                " / ".join(f"{_best(r):.2f}" for r in batch),
                " / ".join(f"{r['chain_client_cpu_us_per_job']:,.0f}" for r in one),
                " / ".join(f"{r['chain_client_cpu_us_per_job']:,.0f}" for r in batch),
            ]
            lines.append(f"| {reading} | {name} | {' | '.join(cells)} |")
    return lines


def cut(run: str, drain: str, *, batch: bool) -> list[float]:
    """How much less client CPU a job `drain` spent on mysqlclient than on PyMySQL, point by point."""
    pairs = zip(_rows(run, "mysql", batch=batch), _rows(run, "mysqlclient", batch=batch), strict=True)
    return [
        1 - myc[f"{drain}_client_cpu_us_per_job"] / py[f"{drain}_client_cpu_us_per_job"] for py, myc in pairs
    ]


def met(run: str, backend: str, *, batch: bool) -> int:
    return sum(_best(r) >= LIMIT_TARGET for r in _rows(run, backend, batch=batch))


def better(run: str) -> int:
    """At how many one-job points mysqlclient's best threaded drain got more of the limit than PyMySQL's."""
    pairs = zip(_rows(run, "mysql", batch=False), _rows(run, "mysqlclient", batch=False), strict=True)
    return sum(_best(myc) > _best(py) for py, myc in pairs)


def shares(runs: list[str], backend: str) -> list[float]:
    return [_best(r) for run in runs for r in _rows(run, backend, batch=False)]


def point(run: str, backend: str) -> dict[str, Any]:
    """The 4 x 4 one-job row."""
    (row,) = [r for r in _rows(run, backend, batch=False) if (r["processes"], r["threads"]) == (4, 4)]
    return row


def server_over_limit(run: str, backend: str) -> float:
    row = point(run, backend)
    return float(row["chain_server_cpu_us_per_job"] / row["limit_server_cpu_us_per_job"])


def machine_over_limit18() -> float:
    """This machine's limit server CPU a job at 4 x 4 against limit18's, the same point and layout."""
    (limit18,) = load_runs("limit18-cores-2026-12-07").values()
    (row18,) = [
        r for r in throughput_rows(limit18, "mysql", batch=False) if (r["processes"], r["threads"]) == (4, 4)
    ]
    return float(
        point("limit19-cores-2026-12-07", "mysql")["limit_server_cpu_us_per_job"]
        / row18["limit_server_cpu_us_per_job"]
    )


def core_seconds(run: str, backend: str, side: str) -> float:
    """The chain's `side` ("client" or "server") CPU a job times its jobs a second at 4 x 4: the cores it
    kept busy."""
    row = point(run, backend)
    return float(row[f"chain_{side}_cpu_us_per_job"] * row["chain_jobs_per_s"] / 1e6)


APART_SHARED: Final = "limit19-apart-shared-2026-12-07"
SHARED: Final = ["limit19-shared-2026-12-07", APART_SHARED]
OWN: Final = ["limit19-cores-2026-12-07", "limit19-apart-cores-2026-12-07"]


def test_the_drivers_table_is_the_runs() -> None:
    text = _text()
    missing = [line for line in driver_table() if line not in text]
    assert not missing, missing


def test_what_mysqlclient_saved_the_client_and_where_it_moved_the_limit_is_the_runs() -> None:
    one = [c for run in RUNS for drain in THREADED for c in cut(run, drain, batch=False)]
    one += [c for run in RUNS for drain in ("library", "chain") for c in cut(run, drain, batch=True)]
    chain = [c for run in RUNS for c in cut(run, "chain", batch=False)]
    batch = [c for run in RUNS for c in cut(run, "chain", batch=True)]
    assert min(one) > 0, "mysqlclient spent more client CPU a job somewhere"
    mine, theirs = shares(SHARED, "mysqlclient"), shares(SHARED, "mysql")
    apart = "limit19-apart-cores-2026-12-07"
    found = {
        "chain": f"{min(chain):.0%} to {max(chain):.0%}",
        "batch": f"{min(batch):.0%} to {max(batch):.0%}",
        "better shared": f"{sum(better(run) for run in SHARED)} of {len(mine)}",
        "mine": f"{min(mine):.2f} to {max(mine):.2f}",
        "theirs": f"{min(theirs):.2f} to {max(theirs):.2f}",
        "met": f"{sum(s >= LIMIT_TARGET for s in mine)} of {len(mine)}",
        "met theirs": f"{sum(s >= LIMIT_TARGET for s in theirs)}",
        "better own": f"{sum(better(run) for run in OWN)} of {len(mine)}",
        "apart theirs": f"{met(APART_SHARED, 'mysql', batch=False)}",
        "apart mine": f"{met(APART_SHARED, 'mysqlclient', batch=False)}",
        "share mine": f"{point(apart, 'mysqlclient')['chain_ratio_limit']:.2f}",
        "share theirs": f"{point(apart, 'mysql')['chain_ratio_limit']:.2f}",
        "server mine": f"{server_over_limit(apart, 'mysqlclient'):.2f}",
        "server theirs": f"{server_over_limit(apart, 'mysql'):.2f}",
        "machine": f"{machine_over_limit18():.2f}",
        "pymysql client": f"{core_seconds(apart, 'mysql', 'client'):.2f}",
        "pymysql server": f"{core_seconds(apart, 'mysql', 'server'):.2f}",
        "mysqlclient server": f"{core_seconds(apart, 'mysqlclient', 'server'):.2f}",
        "mysqlclient client": f"{core_seconds(apart, 'mysqlclient', 'client'):.2f}",
    }
    text = prose(_text())
    phrases = {
        "chain": "the chain's client CPU a job {} less on mysqlclient at the one-job points",
        "batch": "in batch mode {} less",
        "better shared": "reached more of the limit on mysqlclient at {} one-job points",
        "mine": "({} of the limit",
        "theirs": "against {} on PyMySQL)",
        "met": "0.6 at {}",
        "met theirs": "against PyMySQL's {}",
        "better own": "the driver changes little: mysqlclient ahead at {} points",
        "apart theirs": "where PyMySQL met 0.6 at {} one-job point of 4",
        "apart mine": "mysqlclient met it at {}.",
        "share mine": "and reached {} of the limit",
        "share theirs": "(PyMySQL {})",
        "server mine": "the chain's {} times the limit's procedure's on mysqlclient",
        "server theirs": "({} on PyMySQL)",
        "machine": "jobs a millisecond apart on cores of its own, {} times limit18's)",
        "pymysql client": "PyMySQL's chain kept its client's core busy ({} core-seconds a second)",
        "pymysql server": "and the server's ({})",
        "mysqlclient server": "mysqlclient's kept the server's as busy ({})",
        "mysqlclient client": "with its client's at {}",
    }
    for name, phrase in phrases.items():
        assert phrase.format(found[name]) in text, (name, phrase.format(found[name]))


@pytest.mark.parametrize("run", list(RUNS))
def test_each_run_is_kept_whole_and_named(run: str) -> None:
    # The whole printed tables stay in the run's results.md; the section names each run's revision and load.
    results_md = (RESULTS_DIR / run / "results.md").read_text(encoding="utf-8")
    assert "| mysqlclient | 4 x 4 | 1 |" in results_md
    text = prose(_text())
    for phrase in run_named(LOADED[run]["meta"]):
        assert phrase in text, phrase


def test_the_runs_drained_each_driver_as_named() -> None:
    for run in RUNS:
        entries = {e["backend"]: e for e in LOADED[run]["benchmarks"]["throughput"]}
        assert entries["mysql"]["chain_factory"] == "conformance.builtin:mysql_chain"
        assert entries["mysqlclient"]["chain_factory"] == "conformance.builtin:mysqlclient_chain"
        apart = 1000.0 if "apart" in run else 1.0
        assert {e["due_apart_ms"] for e in entries.values()} == {apart}
        assert ("server_cores" in entries["mysql"]) == ("cores" in run)
        assert "async_skipped" in entries["mysqlclient"] and "async_skipped" not in entries["mysql"]


def test_docs_mysql_quotes_the_runs_saving() -> None:
    chain = [c for run in RUNS for c in cut(run, "chain", batch=False)]
    text = prose((BENCHMARKS_MD.parent / "mysql.md").read_text(encoding="utf-8"))
    assert f"the chain's client CPU a job {min(chain):.0%} to {max(chain):.0%} less" in text
    assert "limit19" in text
