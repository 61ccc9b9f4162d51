"""The figures docs/benchmarks.md quotes from `kernel-2026-12-07` (benchmarks.limit_probe with each side's
kernel share, on both databases) and `marked-2026-12-07` (benchmarks.delete_marked) are their own.

"The kernel's share, and what MariaDB's claims step over" pastes the tables and says how much of each
side's CPU the kernel took, what the asyncio chain's client spent outside it against pgbench's whole CPU,
what a claim reads for each delete-marked entry at either isolation level, and how the MariaDB pages a job
went with the claims, the server's CPU and the purge backlog. These tests recompute each from the JSON, so
a new run with stale prose fails here.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any, Final

from docs_support import BENCHMARKS_MD, RESULTS_DIR, assert_quoted, prose, section, span

HEADING: Final = "### The kernel's share, and what MariaDB's claims step over: `kernel-2026-12-07` and"
PROBE: Final = RESULTS_DIR / "kernel-2026-12-07"
MARKED_FILE: Final = RESULTS_DIR / "marked-2026-12-07" / "mysql.json"
POINTS: Final = ([1, 8, 1], [4, 4, 1], [1, 4, 10])
CHAIN: Final = "postgresql:async_chain"
PAGES: Final = "Innodb_buffer_pool_read_requests"
HISTORY: Final = "Innodb_history_list_length"

DOCUMENTS: Final[dict[str, dict[str, Any]]] = {
    database: json.loads((PROBE / f"{database}.json").read_text(encoding="utf-8"))
    for database in ("postgresql", "mysql")
}
POSTGRESQL: Final[list[dict[str, Any]]] = DOCUMENTS["postgresql"]["results"]
MYSQL: Final[list[dict[str, Any]]] = DOCUMENTS["mysql"]["results"]
MARKED: Final[dict[str, Any]] = json.loads(MARKED_FILE.read_text(encoding="utf-8"))


def _text() -> str:
    return section(BENCHMARKS_MD, HEADING, "\n## ")


def median_of(drain: str, point: list[int], value: Any) -> float:
    """The median over the rounds of `value(reading)` for `drain` at `point` (the tables' medians)."""
    return float(
        statistics.median(value(r) for r in POSTGRESQL if r["point"] == point and r["factory"] == drain)
    )


def share(side: str) -> Any:
    return lambda r: r["kernel_share"][side]


def outside_kernel(r: dict[str, Any]) -> float:
    """The client's CPU a job the kernel did not take."""
    return float(r["per_job_us"]["client_cpu"] * (1 - r["kernel_share"]["client"]))


def marked_pages() -> dict[int, dict[str, float]]:
    found: dict[int, dict[str, float]] = {}
    for r in MARKED["results"]:
        found.setdefault(r["marked"], {})[r["isolation"]] = r["pages"]
    return found


def added(level: str) -> list[float]:
    """Pages each delete-marked entry added to a claim at `level`, at every count but none."""
    pages = marked_pages()
    return [(p[level] - pages[0][level]) / count for count, p in pages.items() if count]


def figures() -> dict[str, str]:
    limit_cpu = [median_of("limit", p, lambda r: r["per_job_us"]["client_cpu"]) for p in POINTS]
    user = [median_of(CHAIN, p, outside_kernel) for p in POINTS]
    committed = added("READ COMMITTED")
    pages = [r["server_status"][PAGES] for r in MYSQL]
    limits = [r for r in MYSQL if r["factory"] == "limit"]
    drains = [r for r in MYSQL if r["factory"] != "limit"]
    history = [r["server_status"][HISTORY][1] for r in MYSQL]
    rates = [r["jobs_per_s"] for r in limits]
    return {
        "KSHARE": span(median_of(CHAIN, p, share("client")) for p in POINTS),
        "LIMIT_KSHARE": span(median_of("limit", p, share("client")) for p in POINTS),
        "USER": f"{user[0]:.0f}, {user[1]:.0f} and {user[2]:.0f}",
        "LIMIT_CPU": f"{limit_cpu[0]:.0f}, {limit_cpu[1]:.0f} and {limit_cpu[2]:.0f}",
        "SERVER_KSHARE": span(median_of(CHAIN, p, share("server")) for p in POINTS),
        "LIMIT_SERVER_KSHARE": span(median_of("limit", p, share("server")) for p in POINTS),
        "ADDED": f"{statistics.median(committed):.2f}",
        "RR": f"{math.ceil(max(added('REPEATABLE READ')) * 1000) / 1000:.3f}",
        "CLAIMS_SHARE": span(r["claims"]["pages_per_row"] / r["server_status"][PAGES] for r in MYSQL),
        "CORR": f"{statistics.correlation(pages, [r['per_job_us']['server_all_cpu'] for r in MYSQL]):.2f}",
        "CLAIMS_CORR": f"{statistics.correlation(pages, [r['claims']['pages_per_row'] for r in MYSQL]):.2f}",
        "HISTORY_CORR": f"{statistics.correlation(pages, history):.2f}",
        "HISTORY_DRAINS": f"{min(r['server_status'][HISTORY][1] for r in drains)} to "
        f"{max(r['server_status'][HISTORY][1] for r in drains)}",
        "HISTORY_LIMIT": f"{max(r['server_status'][HISTORY][1] for r in limits)}",
        "RUNQUEUE": f"{min(r['per_job_us']['server_runqueue'] for r in drains) / 1000:.1f} to "
        f"{max(r['per_job_us']['server_runqueue'] for r in drains) / 1000:.1f}",
        "LIMIT_PAGES": f"{min(r['server_status'][PAGES] for r in limits):.0f} to "
        f"{max(r['server_status'][PAGES] for r in limits):.0f}",
        "LIMIT_RATES": f"{min(rates):,.0f} to {max(rates):,.0f}",
    }


PHRASES: Final = {
    "KSHARE": "The asyncio chain's client spent {} of its CPU in the kernel",
    "LIMIT_KSHARE": "pgbench's {};",
    "USER": "the asyncio chain spent {} µs a job at 1 x 8, 4 x 4 and batch 1 x 4",
    "LIMIT_CPU": "against pgbench's whole CPU of {} µs a job",
    "SERVER_KSHARE": "backends spent {} of their CPU in the kernel under the asyncio chain",
    "LIMIT_SERVER_KSHARE": "and {} under the limit",
    "ADDED": "At READ COMMITTED a claim reads {} pages for each delete-marked entry ahead of it",
    "RR": "at REPEATABLE READ at most {} (the last table)",
    "CLAIMS_SHARE": "the sampled claims read {} of the pages InnoDB read a job",
    "CORR": "followed the pages a job (correlation {}, every drain and round)",
    "CLAIMS_CORR": "the claims' pages a row followed them too (correlation {})",
    "HISTORY_CORR": "the purge backlog at the window's end (correlation {})",
    "HISTORY_DRAINS": "The drains left {} transactions' undo unpurged",
    "HISTORY_LIMIT": "the limit at most {}",
    "RUNQUEUE": "waited {} ms a job for a core",
    "LIMIT_PAGES": "its rounds read {} pages a job",
    "LIMIT_RATES": "its rate ran {} jobs/s",
}


def test_the_tables_pasted_are_what_the_tools_print() -> None:
    from benchmarks.delete_marked import table as marked_table
    from benchmarks.limit_probe import claims_table, status_table, table

    text = _text()
    printed = [marked_table(MARKED["results"])]
    for results in (POSTGRESQL, MYSQL):
        printed += [table(results), status_table(results) or "", claims_table(results) or ""]
    for line in "\n".join(printed).splitlines():
        assert line in text, line


def test_every_figure_the_prose_quotes_is_the_runs() -> None:
    assert_quoted(prose(_text()), figures(), PHRASES)


def test_every_entry_added_the_same_pages_at_read_committed() -> None:
    # The prose quotes one figure for every count: it must hold for each.
    committed = added("READ COMMITTED")
    assert max(committed) - min(committed) < 0.01, committed
    assert all(r["rows"] == r["batch"] for r in MARKED["results"])


def test_the_runs_are_named_with_their_revision_machine_and_load() -> None:
    text = prose(_text())
    for database, document in DOCUMENTS.items():
        meta = document["meta"]
        assert not meta["git"]["dirty"]
        assert f"git {meta['git']['commit'][:10]}" in text
        assert f"{meta['machine']['load_average'][0]} at the start" in text
        assert f"{meta['machine_at_end']['load_average'][0]} at its end" in text
        assert f"benchmarks/results/kernel-2026-12-07/{database}.json" in text
    meta = MARKED["meta"]
    assert not meta["git"]["dirty"]
    assert f"`marked-2026-12-07`, git {meta['git']['commit'][:10]}" in text
    assert f"load average {meta['machine']['load_average'][0]} at the start" in text
    machine = DOCUMENTS["postgresql"]["meta"]["machine"]
    assert f"{machine['logical_cores']}-core {machine['cpu_model']}" in text


def test_the_claims_section_says_its_third_was_at_repeatable_read() -> None:
    claims = prose(section(BENCHMARKS_MD, "### What one claim reads: `claims-2026-12-06`", "\n### "))
    assert "at the worker's READ COMMITTED the claims read about all of them" in claims
    assert "(`kernel-2026-12-07`)" in claims


def test_the_readme_names_both_runs() -> None:
    readme = prose((BENCHMARKS_MD.parent.parent / "README.md").read_text(encoding="utf-8"))
    assert "named runs `kernel-2026-12-07` and `marked-2026-12-07`" in readme
    assert f"a MariaDB claim reads {figures()['ADDED']} pages for each index entry" in readme
    times = [
        median_of(CHAIN, p, outside_kernel) / median_of("limit", p, lambda r: r["per_job_us"]["client_cpu"])
        for p in POINTS
    ]
    quoted = f"{min(times):.1f} to {max(times):.1f} times pgbench's whole CPU a job"
    assert f"the Python client's CPU outside the kernel is {quoted}" in readme


def test_the_capacity_model_quotes_what_an_unpurged_entry_costs_a_claim() -> None:
    scaling = prose((BENCHMARKS_MD.parent / "scaling.md").read_text(encoding="utf-8"))
    assert f"reads {figures()['ADDED']} pages for each such entry ahead of it" in scaling
    assert "(named run `marked-2026-12-07`," in scaling
