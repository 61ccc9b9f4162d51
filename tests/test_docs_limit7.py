"""The figures docs/benchmarks.md quotes from the two limit7 runs (the chain pipelined, one exchange a job;
the database on cores of its own, and sharing them) are theirs. README quotes limit8 now
(tests/test_docs_limit8.py).

"One exchange a job" pastes both runs' limit and per-job cost tables and a table of the targets met per
point, and quotes in prose what the pipelined chain reached beside the compact plan, its round trips, and
the CPU bound of the points missed sharing the cores; these tests recompute each from the runs'
results.json, so a new run with stale prose fails here.
"""

from __future__ import annotations

import re
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
    best_of_limit,
    cpu_ceiling,
    load_runs,
    missed,
    missed_cpu_bounds,
    over_ceiling,
    point_row,
    prose,
    section,
    targets_table,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
CORES_RUN: Final = "limit7-cores-2026-12-05"
SHARED_RUN: Final = "limit7-shared-2026-12-05"
RUNS: Final = load_runs(CORES_RUN, SHARED_RUN)
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
READINGS: Final = {CORES_RUN: "on cores of its own", SHARED_RUN: "sharing the cores"}


def _section() -> str:
    return section(BENCHMARKS_MD, f"### One exchange a job: `{CORES_RUN}` and `{SHARED_RUN}`", "\n## ")


def _rows(run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return throughput_rows(RUNS[run], backend, batch=batch)


def _missed(run: str, *, batch: bool) -> list[dict[str, Any]]:
    return missed(RUNS[run], "postgresql", CHAINED_BATCH_DRAINS if batch else DEFAULT_DRAINS, batch=batch)


def _missed_mysql(run: str) -> list[dict[str, Any]]:
    return [
        r
        for batch, drains in ((False, ("compact", "async")), (True, ("library", "async")))
        for r in missed(RUNS[run], "mysql", drains, batch=batch)
    ]


def what_the_chain_reached(run: str) -> str:
    """The pipelined chain beside the compact plan (one job a commit) and beside unchained batch mode, at
    each PostgreSQL point of `run`, as the prose says it."""
    default = [
        f"at {r['processes']} x {r['threads']} the pipelined chain reached {r['chain_ratio_limit']:.2f} of "
        f"the limit, the compact plan {r['compact_ratio_limit']:.2f}"
        for r in _rows(run, "postgresql", batch=False)
    ]
    batch = [
        f"at {r['processes']} x {r['threads']} in batch mode {r['chain_ratio_limit']:.2f}, unchained "
        f"{r['library_ratio_limit']:.2f}"
        for r in _rows(run, "postgresql", batch=True)
    ]
    return "; ".join(default + batch)


@pytest.mark.parametrize("run", [CORES_RUN, SHARED_RUN])
def test_both_runs_tables_are_pasted(run: str) -> None:
    assert_pasted(
        RESULTS_DIR / run / "results.md", "#### Against the server's limit", _section(), must="batch chain"
    )


def test_the_runs_are_named_with_their_revision_machine_and_load() -> None:
    assert_pair_named(RUNS[CORES_RUN]["meta"], RUNS[SHARED_RUN]["meta"], prose(_section()))


def test_the_chain_drained_pipelined_in_both_runs() -> None:
    for run in RUNS.values():
        (pg,) = [e for e in run["benchmarks"]["throughput"] if e["backend"] == "postgresql"]
        assert pg["chain_factory"] == "conformance.builtin:postgresql_pipeline_chain"


def test_the_targets_table_is_the_runs() -> None:
    text = _section()
    for line in targets_table(RUNS, READINGS, DATABASES, DEFAULT_DRAINS, CHAINED_BATCH_DRAINS, TARGET_DIGITS):
        assert line in text, line


def test_what_the_pipelined_chain_reached_is_the_runs() -> None:
    text = prose(_section())
    for run in RUNS:
        assert what_the_chain_reached(run) in text, run


def test_the_chains_exchanges_a_job_are_the_cores_runs() -> None:
    (one,) = [r for r in _rows(CORES_RUN, "postgresql", batch=False) if r["threads"] == 1]
    (batch,) = [r for r in _rows(CORES_RUN, "postgresql", batch=True) if r["processes"] == 1]
    trips = {
        key: row[f"{drain}_round_trips_per_job"]
        for key, row, drain in (
            ("chain", one, "chain"),
            ("compact", one, "compact"),
            ("batch chain", batch, "chain"),
            ("batch", batch, "library"),
        )
    }
    assert (
        f"At 1 x 1 the pipelined chain took {trips['chain']:.2f} round trips a job, the compact plan "
        f"{trips['compact']:.2f}; in batch mode at 1 x 4 {trips['batch chain']:.2f} a job, "
        f"{trips['batch']:.2f} unchained" in prose(_section())
    )


def test_what_one_exchange_saved_and_the_sizing_advice_are_the_cores_run() -> None:
    (one,) = [r for r in _rows(CORES_RUN, "postgresql", batch=False) if r["threads"] == 1]
    cpu = {
        (drain, side): one[f"{drain}_{side}_cpu_us_per_job"]
        for drain in ("chain", "compact")
        for side in ("client", "server")
    }
    text = prose(_section())
    assert (
        f"at 1 x 1, {cpu['chain', 'client']:.0f} µs of client CPU and {cpu['chain', 'server']:.0f} µs of "
        f"server CPU against the compact plan's {cpu['compact', 'client']:.0f} and "
        f"{cpu['compact', 'server']:.0f}" in text
    )
    reached = one["chain_ratio_limit"]
    assert f"one connection already reached {reached:.2f} of the database's limit here" in text


def test_the_cpu_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    text = prose(_section())
    phrases = missed_cpu_bounds(RUNS[SHARED_RUN])
    assert phrases, "no point missed sharing the cores: the prose on what bounds them is stale"
    for phrase in phrases:
        assert phrase in text, phrase
    over = over_ceiling(RUNS[SHARED_RUN], DEFAULT_DRAINS, CHAINED_BATCH_DRAINS)
    assert f"Over 0.6: {over}." in text
    under = " and ".join(
        f"{r['processes']} x {r['threads']}"
        for r in _missed(SHARED_RUN, batch=False)
        if cpu_ceiling(RUNS[SHARED_RUN], r, DEFAULT_DRAINS) < LIMIT_TARGET
    )
    assert f"Under 0.6 (at {under}) CPU is the bound" in text
    met = [
        f"{r['processes']} x {r['threads']}"
        for r in _rows(SHARED_RUN, "postgresql", batch=False)
        if best_of_limit(r, DEFAULT_DRAINS) >= LIMIT_TARGET
    ]
    assert met == ["1 x 1"] and len(_missed(SHARED_RUN, batch=True)) == len(
        _rows(SHARED_RUN, "postgresql", batch=True)
    )
    assert "Sharing the cores, PostgreSQL meets the target at 1 x 1 only; MariaDB meets it everywhere" in text
    assert not _missed_mysql(SHARED_RUN)


def test_what_sharing_the_cores_cost_each_chain_a_job_is_the_runs() -> None:
    cores, shared = (point_row(RUNS[run], "postgresql", 1, 4) for run in (CORES_RUN, SHARED_RUN))
    threaded, aio = (
        {run: row[f"{drain}_client_cpu_us_per_job"] for run, row in (("cores", cores), ("shared", shared))}
        for drain in ("chain", "async_chain")
    )
    assert (
        f"At 1 x 4 the threaded pipelined chain's client CPU a job rose from {threaded['cores']:.0f} µs with "
        f"the database on its own core to {threaded['shared']:.0f} µs sharing the cores, the asyncio chain's "
        f"from {aio['cores']:.0f} to {aio['shared']:.0f}" in prose(_section())
    )
    assert shared["async_chain_ratio_limit"] > shared["chain_ratio_limit"]


_ONES: Final = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS: Final = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _in_words(n: int) -> str:
    """`n` (under a hundred) as the docs spell a count opening a sentence: "Thirty-nine"."""
    assert 0 <= n < 100
    words = _ONES[n] if n < 20 else _TENS[n // 10 - 2] + (f"-{_ONES[n % 10]}" if n % 10 else "")
    return words.capitalize()


def test_the_count_of_named_runs_against_the_limit_is_the_headings() -> None:
    text = section(BENCHMARKS_MD, "## Against the server's limit", "\n## ")
    headings = "\n".join(line for line in text.splitlines() if line.startswith("### "))
    runs = set(re.findall(r"`(limit[\w-]+)`", headings))
    assert f"{_in_words(len(runs))} named runs follow" in prose(text)
