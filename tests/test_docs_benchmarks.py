"""The figures the prose of docs/benchmarks.md and README.md quotes are those of the reference run.

The tables in docs/benchmarks.md are benchmarks/results/reference/results.md pasted; the prose around them
summarises them. These tests recompute each quoted summary from benchmarks/results/reference/results.json, so
a new reference run with stale prose fails here. The run's companions, `benchmarks.versus` (JSON) and
`benchmarks.instructions` (its printed table, saved as instructions.md), are kept beside it and are the
source of the figures quoted from them.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Final

import pytest
from docs_support import section

ROOT: Final = Path(__file__).resolve().parent.parent
REFERENCE: Final = ROOT / "benchmarks" / "results" / "reference"
RESULTS: Final = json.loads((REFERENCE / "results.json").read_text(encoding="utf-8"))
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
README_MD: Final = ROOT / "README.md"
WORKER_MD: Final = ROOT / "docs" / "worker.md"
TOX_INI: Final = ROOT / "tox.ini"


def prose(path: Path) -> str:
    """The text with every run of whitespace (line breaks and list indentation) made one space."""
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def _by_backend(benchmark: str) -> dict[str, Any]:
    return {entry["backend"]: entry for entry in RESULTS["benchmarks"][benchmark]}


def _throughput_rows() -> list[dict[str, Any]]:
    """The rows of Proletarian's mode, one job a transaction (batch mode's rows are quoted apart)."""
    return [
        row
        for entry in RESULTS["benchmarks"]["throughput"]
        for row in entry["rows"]
        if row.get("batch_size", 1) == 1
    ]


def _low_to_high(figures: dict[str, float], names: dict[str, str]) -> str:
    """'0.79 (PostgreSQL) and 0.85 (MySQL)'-style text with the smaller figure first, as prose puts it."""
    (a, x), (b, y) = sorted(figures.items(), key=lambda item: item[1])
    return f"{x:.2f} ({names[a]}) {{}} {y:.2f} ({names[b]})"


def _p99_growth(backend: str, indexed: bool) -> float:
    cells = [c for c in _by_backend("poll_latency")[backend]["cells"] if c["indexed"] is indexed]
    cells.sort(key=lambda c: c["depth"])
    return float(cells[-1]["p99_ms"] / cells[0]["p99_ms"])


@pytest.mark.parametrize("printed", ["results.md", "versus.md", "versus-instructions.md"])
def test_the_reference_run_is_the_one_the_tables_show(printed: str) -> None:
    # The tables are the run's and benchmarks.versus's printed tables pasted, so the prose tests below check
    # what a reader sees.
    tables = (REFERENCE / printed).read_text(encoding="utf-8")
    pasted = BENCHMARKS_MD.read_text(encoding="utf-8")
    for table_line in (line for line in tables.splitlines() if line.startswith("|")):
        assert table_line in pasted


@pytest.mark.parametrize("document", [BENCHMARKS_MD, README_MD], ids=["docs/benchmarks.md", "README.md"])
def test_the_throughput_ratios_quoted_are_the_tables(document: Path) -> None:
    rows = _throughput_rows()
    ratios = [row["ratio"] for row in rows]
    rounds = [r for row in rows for r in row["round_ratios"]]
    spreads = [max(row["round_ratios"]) - min(row["round_ratios"]) for row in rows]
    passed = sum(1 for row in rows if row["pass"])
    text = prose(document)
    assert (
        f"0.9, met in {passed} of {len(rows)}" in text or f"({passed} of {len(rows)} configurations" in text
    )
    assert f"{min(ratios):.2f} to {max(ratios):.2f}" in text
    assert f"from {min(rounds):.2f} to {max(rounds):.2f}" in text
    assert f"differ by {min(spreads):.2f} to {max(spreads):.2f}" in text


@pytest.mark.parametrize("document", [BENCHMARKS_MD, README_MD], ids=["docs/benchmarks.md", "README.md"])
def test_the_ratios_per_kind_of_configuration_quoted_are_the_tables(document: Path) -> None:
    def ratio(backend: str, processes: int, threads: int) -> float:
        entry = _by_backend("throughput")[backend]
        (row,) = [
            r
            for r in entry["rows"]
            if (r["processes"], r["threads"], r.get("batch_size", 1)) == (processes, threads, 1)
        ]
        return float(row["ratio"])

    def several_threads(backend: str) -> str:
        entry = _by_backend("throughput")[backend]
        found = [
            r["ratio"]
            for r in entry["rows"]
            if r["processes"] == 1 and r["threads"] > 1 and r.get("batch_size", 1) == 1
        ]
        return f"{min(found):.2f} to {max(found):.2f}"

    text = prose(document)
    assert (
        f"one thread gave {ratio('postgresql', 1, 1):.2f} (PostgreSQL) and {ratio('mysql', 1, 1):.2f}" in text
    )
    assert f"{several_threads('postgresql')} and {several_threads('mysql')}" in text
    assert f"two processes {ratio('postgresql', 2, 4):.2f} and {ratio('mysql', 2, 4):.2f}" in text


def test_the_index_growth_quoted_is_the_tables() -> None:
    text = prose(BENCHMARKS_MD)
    postgresql, mysql = _p99_growth("postgresql", False), _p99_growth("mysql", False)
    assert f"p99 grows {postgresql:.0f}x on PostgreSQL and {mysql:.0f}x on MariaDB" in text
    assert (
        f"is {_p99_growth('postgresql', True):.1f}x (PostgreSQL) and {_p99_growth('mysql', True):.1f}x"
        in text
    )
    readme = prose(README_MD)
    assert f"| {postgresql:.0f}x (p50:" in readme
    assert f"| {mysql:.0f}x |" in readme


def test_the_latency_and_idle_figures_quoted_are_the_tables() -> None:
    latency = _by_backend("latency")
    p50 = {b: entry["enqueue_to_start"]["p50_ms"] for b, entry in latency.items()}
    p99 = {b: entry["enqueue_to_start"]["p99_ms"] for b, entry in latency.items()}
    cpu = {b: entry["idle"]["client_cpu_percent"] for b, entry in latency.items()}
    readme = prose(README_MD)
    assert f"p50 {p50['postgresql']:.0f} ms on PostgreSQL, {p50['mysql']:.0f} ms on MariaDB" in readme
    assert f"p99 {p99['postgresql']:.0f} and {p99['mysql']:.0f} ms" in readme
    assert f"{cpu['mysql']:.1f}% (MySQL) to {cpu['postgresql']:.1f}% (PostgreSQL) of a core" in prose(
        BENCHMARKS_MD
    )


def test_the_enqueue_ratios_quoted_are_the_tables() -> None:
    rows = {
        (b, row["jobs_per_transaction"]): row["ratio"]
        for b, entry in _by_backend("enqueue_rate").items()
        for row in entry["rows"]
    }
    text = prose(BENCHMARKS_MD)
    names = {"postgresql": "PostgreSQL", "mysql": "MySQL"}
    one = _low_to_high({b: rows[b, 1] for b in names}, names)
    hundred = _low_to_high({b: rows[b, 100] for b in names}, names)
    assert f"runs at {one.format('to')}" in text
    assert f"at {hundred.format('and')}" in text


def test_the_batch_mode_peer_and_wake_up_figures_quoted_are_the_tables() -> None:
    batch = {
        (entry["backend"], row["processes"], row["threads"]): row
        for entry in RESULTS["benchmarks"]["throughput"]
        for row in entry["rows"]
        if row.get("batch_size", 1) > 1
    }
    (peers,) = [e for e in RESULTS["benchmarks"]["peers"] if "systems" in e]
    rate = {s["name"]: s["jobs_per_s"] for s in peers["systems"]}
    (latency,) = [e for e in RESULTS["benchmarks"]["latency"] if e["backend"] == "postgresql"]
    woken = latency["wake_up"][0]["enqueue_to_start"]
    docs, readme = prose(BENCHMARKS_MD), prose(README_MD)
    pg, my = batch["postgresql", 1, 4], batch["mysql", 1, 4]
    assert f"{pg['ratio']:.1f}x (1 x 4)" in docs and f"at {my['ratio']:.1f}x and" in docs
    assert f"runs {pg['ratio']:.1f}x that loop on PostgreSQL and {my['ratio']:.1f}x on MariaDB" in readme
    over = rate["proletarian-ref batch 10"] / rate["pgqueuer"]
    for text in (docs, readme):
        assert f"{rate['proletarian-ref batch 10']:,.0f}" in text and f"{over:.1f}x pgqueuer" in text
        assert f"{rate['pgqueuer']:,.0f}" in text and f"{rate['proletarian-ref']:,.0f}" in text
    assert f"{woken['p50_ms']:.2f} ms at p50 and {woken['p99_ms']:.2f} ms at p99" in readme
    assert f"starts {woken['p50_ms']:.2f} ms (p50) and {woken['p99_ms']:.2f} ms (p99)" in docs


def test_the_run_length_quoted_is_the_runs() -> None:
    assert f"(full mode, {RESULTS['duration_s']:.0f} s)" in prose(BENCHMARKS_MD)
    # README, this page's Running section and tox.ini's bench-full all quote it in minutes.
    minutes = round(RESULTS["duration_s"] / 60)
    for path in (README_MD, BENCHMARKS_MD, TOX_INI):
        assert f"{minutes} minutes in the reference run" in prose(path), f"{path.name}: not {minutes} minutes"
    settings = RESULTS["settings"]
    rounds, warmup, window = (settings[f"throughput_{k}"] for k in ("rounds", "warmup_s", "window_s"))
    assert f"Full mode runs {rounds} rounds ({warmup:g} s warm-up, {window:g} s window)" in prose(
        BENCHMARKS_MD
    )
    assert f"median of {rounds} paired rounds" in prose(README_MD)


def test_the_pgbench_ceiling_quoted_is_the_tables() -> None:
    rows = [row for row in _throughput_rows() if "pgbench_jobs_per_s" in row]
    assert rows, "the reference run has no pgbench ceiling"
    of_pgbench = [row["ratio_pgbench"] for row in rows]
    raw_of_pgbench = [row["raw_jobs_per_s"] / row["pgbench_jobs_per_s"] for row in rows]
    one = [row["pgbench_jobs_per_s"] for row in rows if row["processes"] * row["threads"] == 1]
    several = [row["pgbench_jobs_per_s"] for row in rows if row["processes"] * row["threads"] >= 4]
    text = prose(BENCHMARKS_MD)
    assert f"drained {one[0]:,.0f} jobs a second on one connection" in text
    assert f"and {min(several):,.0f} to {max(several):,.0f} on four to eight" in text
    assert f"reaches {min(raw_of_pgbench):.2f} to {max(raw_of_pgbench):.2f} of that" in text
    assert f"and the library {min(of_pgbench):.2f} to {max(of_pgbench):.2f}" in text


def _versus(name: str) -> dict[str, Any]:
    """benchmarks.versus's JSON of the reference run: the drains in turns, or the instruction counts."""
    loaded: dict[str, Any] = json.loads((REFERENCE / name).read_text(encoding="utf-8"))
    return loaded


def _instructions() -> dict[str, tuple[int, int]]:
    """benchmarks.instructions's table as saved with the reference run: library and raw loop per factory."""
    return {
        match.group(1): (int(match.group(2).replace(",", "")), int(match.group(3).replace(",", "")))
        for match in re.finditer(
            r"^\| conformance\.builtin:(\w+) \| ([\d,]+) \| ([\d,]+) \|",
            (REFERENCE / "instructions.md").read_text(encoding="utf-8"),
            re.MULTILINE,
        )
    }


def test_the_run_and_its_companions_are_of_the_library_code_quoted() -> None:
    # The benchmark run ran at one commit and the three tools right after it at a later one whose library,
    # SQL and benchmark code are the same (`git diff --stat <run> <tools> -- proletarian_ref sql benchmarks`
    # is empty): docs/benchmarks.md names both.
    run = RESULTS["meta"]["git"]["commit"]
    assert not RESULTS["meta"]["git"]["dirty"]
    tools = {
        _versus(name)["sides"][1].split("-")[0].split(" ")[0]
        for name in ("versus.json", "versus-instructions.json")
    }
    assert len(tools) == 1
    (tool,) = tools
    instructions = (REFERENCE / "instructions.md").read_text(encoding="utf-8")
    assert f"at git {tool}" in instructions
    docs = prose(BENCHMARKS_MD)
    assert f"at git {run[:7]}" in docs and f"at git {tool}" in docs


@pytest.mark.parametrize(
    "document",
    [BENCHMARKS_MD, README_MD, WORKER_MD],
    ids=["docs/benchmarks.md", "README.md", "docs/worker.md"],
)
def test_the_compact_plan_ratios_quoted_are_the_tables(document: Path) -> None:
    compact = {
        entry["backend"]: [row["compact_ratio"] for row in entry["rows"] if row.get("batch_size", 1) == 1]
        for entry in RESULTS["benchmarks"]["throughput"]
    }
    assert (
        f"{min(compact['postgresql']):.2f} to {max(compact['postgresql']):.2f} times the plain plan's rate "
        f"on PostgreSQL and {min(compact['mysql']):.2f} to {max(compact['mysql']):.2f} on MariaDB"
    ) in prose(document)


@pytest.mark.parametrize("document", [BENCHMARKS_MD, README_MD], ids=["docs/benchmarks.md", "README.md"])
def test_the_enqueue_many_and_raw_loop_bounds_quoted_are_the_tables(document: Path) -> None:
    many = {entry["backend"]: entry["many"] for entry in RESULTS["benchmarks"]["enqueue_rate"]}
    lowest = min(row["ratio"] for row in _throughput_rows())
    text = prose(document)
    assert f"{many['postgresql']['ratio']:.2f}x a raw `COPY`" in text
    assert f"{many['postgresql']['ratio_executemany']:.2f}x psycopg's" in text
    assert f"{many['mysql']['ratio']:.2f}x PyMySQL's" in text
    assert f"at most {1 / lowest:.2f}x the library's rate here (1 / {lowest:.2f}" in text


@pytest.mark.parametrize("document", [BENCHMARKS_MD, README_MD], ids=["docs/benchmarks.md", "README.md"])
def test_the_default_mode_against_the_filing_commit_quoted_is_benchmarks_versus(document: Path) -> None:
    versus = _versus("versus.json")
    then, now, on_compact = versus["sides"]
    pg, my = versus["postgresql"], versus["mysql"]
    text = prose(document)
    assert f"{pg[now]['ratio_median']:.2f}x (PostgreSQL) and {my[now]['ratio_median']:.2f}x (MariaDB)" in text
    assert (
        f"compact plan at {pg[on_compact]['ratio_median']:.2f}x and {my[on_compact]['ratio_median']:.2f}x"
        in text
    )
    if document == BENCHMARKS_MD:
        singles = [r[now] / r[then] for dialect in (pg, my) for r in dialect["rounds"]]
        assert f"(single rounds {min(singles):.2f} to {max(singles):.2f})" in text
        counted = _versus("versus-instructions.json")
        pg_i, my_i = counted["postgresql"]["instructions"], counted["mysql"]["instructions"]
        assert f"{pg_i[then] / pg_i[now]:.2f}x fewer a job than the filing commit's on PostgreSQL" in text
        assert f"({pg_i[now]:,.0f} against {pg_i[then]:,.0f}) and {my_i[then] / my_i[now]:.2f}x fewer" in text
        assert (
            f"the compact plan {pg_i[then] / pg_i[on_compact]:.2f}x and {my_i[then] / my_i[on_compact]:.2f}x"
            in text
        )


def test_the_instruction_counts_quoted_are_benchmarks_instructions() -> None:
    counted = _instructions()
    ratio = {name: library / raw for name, (library, raw) in counted.items()}
    docs, readme, worker = prose(BENCHMARKS_MD), prose(README_MD), prose(WORKER_MD)
    plans = {
        "postgresql": "PostgreSQL, Proletarian's plan",
        "postgresql_compact": "PostgreSQL, compact plan",
        "mysql": "MariaDB, Proletarian's plan",
        "mysql_compact": "MariaDB, compact plan",
    }
    for name, label in plans.items():
        library, raw = counted[name]
        assert f"| {label} | {library:,} | {raw:,} | {ratio[name]:.2f} |" in docs
    assert (
        f"**{ratio['postgresql']:.2f}x the raw loop's instructions per job on PostgreSQL** and "
        f"{ratio['mysql']:.2f}x on MariaDB" in readme
    )
    library, raw = counted["postgresql_compact"]
    assert (
        f"{ratio['postgresql_compact']:.2f}x the raw loop's work a job on PostgreSQL "
        f"({library:,} against {raw:,})" in readme
    )
    excess = {name: round((library - raw) / 1000) for name, (library, raw) in counted.items()}
    assert (
        f"now {excess['postgresql']}k instructions a job on PostgreSQL and {excess['mysql']}k on MariaDB"
        in docs
    )
    thousands = {name: round(library / 1000) for name, (library, _) in counted.items()}
    assert f"from {thousands['postgresql']}k to {thousands['postgresql_compact']}k on PostgreSQL" in worker
    assert f"from {thousands['mysql']}k to {thousands['mysql_compact']}k on MariaDB" in worker


def test_the_peers_run_length_quoted_is_the_runs() -> None:
    [peers] = [e for e in RESULTS["benchmarks"]["peers"] if e["backend"] == "postgresql"]
    assert f"full mode: {peers['duration_s']:.0f} s in the reference run" in prose(TOX_INI)


def test_every_option_of_benchmarks_run_is_in_the_docs_options_table() -> None:
    from benchmarks.__main__ import _parser

    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    run = commands.choices["run"]
    table = section(BENCHMARKS_MD, "| `--quick` / `--tiny` |", "\n\n")
    missing = [
        option
        for action in run._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help" and f"`{option}" not in table
    ]
    assert not missing, f"docs/benchmarks.md's options table lacks {missing}"
