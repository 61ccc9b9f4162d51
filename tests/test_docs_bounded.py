"""The figures the docs quote from `bounded-2026-12-07` (benchmarks.delete_marked with the bounded claim, and
benchmarks.limit_probe of the chained plan with and without it on MariaDB) are the run's own.

docs/benchmarks.md's "The bounded claim on MariaDB" pastes the tables and says what each claim read past
unpurged entries and how each drain fared against the limit; docs/mysql.md, docs/scaling.md and README.md
quote some of the same. These tests recompute each from the JSON, so a new run with stale prose fails here.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any, Final

from docs_support import (
    BENCHMARKS_MD,
    RESULTS_DIR,
    assert_quoted,
    probe_medians,
    probe_shares,
    prose,
    section,
)

HEADING: Final = "### The bounded claim on MariaDB: `bounded-2026-12-07`"
RUN: Final = RESULTS_DIR / "bounded-2026-12-07"
PROBE: Final[dict[str, Any]] = json.loads((RUN / "mysql.json").read_text(encoding="utf-8"))
MARKED: Final[dict[str, Any]] = json.loads((RUN / "marked.json").read_text(encoding="utf-8"))
BATCH: Final = [4, 4, 10]
ONE: Final = [4, 4, 1]
BOUNDED, ASYNC, CLASSIC = "mysql_chain", "mysql:async_chain", "mysql_chain_classic"
PAGES: Final = "Innodb_buffer_pool_read_requests"
COMMITTED: Final = "READ COMMITTED"


def _text() -> str:
    return section(BENCHMARKS_MD, HEADING, "\n## ")


def marked(claim: str) -> dict[int, float]:
    """Pages a claim of ten read at each count of delete-marked entries, at READ COMMITTED."""
    return {
        r["marked"]: float(r["pages"])
        for r in MARKED["results"]
        if r["claim"] == claim and r["isolation"] == COMMITTED
    }


def added(claim: str) -> list[float]:
    pages = marked(claim)
    return [(p - pages[0]) / count for count, p in pages.items() if count]


def median(point: list[int], drain: str, value: Any) -> float:
    results = PROBE["results"]
    return float(
        statistics.median(value(r) for r in results if r["point"] == point and r["factory"] == drain)
    )


def pages(point: list[int], drain: str) -> str:
    return f"{median(point, drain, lambda r: r['server_status'][PAGES]):.0f}"


def claim_pages(point: list[int], drain: str) -> str:
    return f"{median(point, drain, lambda r: r['claims']['pages']):,.0f}"


def cpu(point: list[int], drain: str) -> str:
    def whole(r: dict[str, Any]) -> float:
        return float(r["per_job_us"]["client_cpu"] + r["per_job_us"]["server_all_cpu"])

    return f"{median(point, drain, whole):,.0f}"


def share(point: list[int], drain: str) -> str:
    return f"{probe_medians(PROBE['results'], point)[drain]:.2f}"


def rounds(point: list[int], drain: str) -> str:
    found = [s for d, s in probe_shares(PROBE["results"], point) if d == drain]
    return f"{min(found):.2f} to {max(found):.2f}"


def figures() -> dict[str, str]:
    classic, bounded = marked("classic"), marked("bounded")
    b, a, c = BOUNDED, ASYNC, CLASSIC
    client = [median(ONE, d, lambda r: r["per_job_us"]["client_cpu"]) for d in (b, a, c)]
    return {
        "CLASSIC_ADDED": f"{statistics.median(added('classic')):.2f}",
        "CLASSIC_PAGES": f"{classic[0]:,.0f} pages with none, {classic[8000]:,.0f} with 8,000",
        "BOUNDED_ADDED": f"{math.ceil(max(added('bounded')) * 1000) / 1000:.3f}",
        "BOUNDED_PAGES": f"{bounded[0]:,.0f} pages with none, {bounded[8000]:,.0f} with 8,000",
        "BATCH_BOUNDED": f"{share(BATCH, b)} (its rounds {rounds(BATCH, b)})",
        "BATCH_ASYNC": f"{share(BATCH, a)} ({rounds(BATCH, a)})",
        "BATCH_CLASSIC": f"{share(BATCH, c)} ({rounds(BATCH, c)})",
        "BATCH_PAGES": f"{pages(BATCH, b)} and {pages(BATCH, a)} pages a job under the bounded drains, "
        f"{pages(BATCH, c)} under the classic one and {pages(BATCH, 'limit')} under the limit",
        "BATCH_CLAIMS": f"{claim_pages(BATCH, b)} pages bounded and {claim_pages(BATCH, c)} classic",
        "ONE_PAGES": f"{pages(ONE, b)} and {pages(ONE, a)} against {pages(ONE, c)}, the limit "
        f"{pages(ONE, 'limit')}",
        "ONE_SHARES": f"the bounded chain at {share(ONE, b)} of the limit, the asyncio chain at "
        f"{share(ONE, a)}, the classic chain at {share(ONE, c)}",
        "ONE_CPU": f"{cpu(ONE, b)} and {cpu(ONE, a)} µs a job against the limit's {cpu(ONE, 'limit')}",
        "ONE_CLIENT": f"{min(client):.0f} to {max(client):.0f} µs a job",
        "HELD_CLAIMS": f"{claim_pages(BATCH, b)} pages its sampled bounded claims read (the limit's own read "
        f"{claim_pages(BATCH, 'limit')})",
    }


PHRASES: Final = {
    "CLASSIC_ADDED": "Proletarian's claim of ten read {} pages for each",
    "CLASSIC_PAGES": "delete-marked entry ahead of it ({})",
    "BOUNDED_ADDED": "the bounded claim read at most {}",
    "BOUNDED_PAGES": "({}): one index descent more",
    "BATCH_BOUNDED": "the bounded chain drained at {}",
    "BATCH_ASYNC": "the asyncio worker's bounded chain at {},",
    "BATCH_CLASSIC": "the same plan with Proletarian's claim at {}.",
    "BATCH_PAGES": "InnoDB read {};",
    "BATCH_CLAIMS": "a sampled claim of ten read {}.",
    "ONE_PAGES": "The bounded claim halved the pages a job ({})",
    "ONE_SHARES": "the rate did not follow: {}.",
    "ONE_CPU": "whole server's CPU came to {}:",
    "ONE_CLIENT": "on two shared cores, the client's ({};",
    "HELD_CLAIMS": "from the rest of the {}.",
}


def test_the_tables_pasted_are_what_the_tools_print() -> None:
    from benchmarks.delete_marked import table as marked_table
    from benchmarks.limit_probe import claims_table, status_table, table

    text = _text()
    results = PROBE["results"]
    printed = [marked_table(MARKED["results"]), table(results), status_table(results), claims_table(results)]
    for line in "\n".join(p or "" for p in printed).splitlines():
        assert line in text, line


def test_every_figure_the_prose_quotes_is_the_runs() -> None:
    assert_quoted(prose(_text()), figures(), PHRASES)


def test_the_server_spent_more_of_the_one_job_points_cpu_than_the_client() -> None:
    for drain in (BOUNDED, ASYNC, CLASSIC):
        client = median(ONE, drain, lambda r: r["per_job_us"]["client_cpu"])
        assert median(ONE, drain, lambda r: r["per_job_us"]["server_all_cpu"]) > client, drain


def test_the_batch_target_is_met_and_the_one_job_point_is_not_as_the_prose_says() -> None:
    text = prose(_text())
    medians = probe_medians(PROBE["results"], BATCH)
    assert min(medians[BOUNDED], medians[ASYNC]) >= 0.6 > medians[CLASSIC], medians
    assert "The 0.6 target for batch mode on MariaDB, sharing the cores, is met in this probe." in text
    assert max(probe_medians(PROBE["results"], ONE).values()) < 0.6
    assert "It misses 0.6 in this probe." in text


def test_the_runs_are_named_with_their_revision_machine_and_load() -> None:
    text = prose(_text())
    for document in (PROBE, MARKED):
        meta = document["meta"]
        assert not meta["git"]["dirty"]
        assert f"both files git {meta['git']['commit'][:10]}" in text
        assert f"load average {meta['machine']['load_average'][0]} at the start, " in text
        assert f"{meta['machine_at_end']['load_average'][0]} at its end" in text
    machine = PROBE["meta"]["machine"]
    assert f"{machine['logical_cores']}-core {machine['cpu_model']}" in text


def test_mysql_md_scaling_md_and_the_readme_quote_the_same_run() -> None:
    docs = BENCHMARKS_MD.parent
    mysql = prose((docs / "mysql.md").read_text(encoding="utf-8"))
    classic, bounded = marked("classic"), marked("bounded")
    every = f"{figures()['CLASSIC_ADDED']} pages an entry, {classic[8000]:,.0f} pages for a claim of ten"
    assert every in mysql
    assert (
        f"read {bounded[8000]:,.0f} pages, with none {bounded[0]:,.0f} (the classic claim {classic[0]:,.0f})"
        in mysql
    )
    under_load = (
        f"read {claim_pages(BATCH, BOUNDED)} pages with the bounded claim and {claim_pages(BATCH, CLASSIC)}"
    )
    assert under_load in mysql
    scaling = prose((docs / "scaling.md").read_text(encoding="utf-8"))
    assert f"a claim of ten read {bounded[8000]:,.0f} pages with 8,000 of them ahead" in scaling
    readme = prose((docs.parent / "README.md").read_text(encoding="utf-8"))
    quoted = f"batch 4 x 4 at {share(BATCH, BOUNDED)} of the limit with it and {share(BATCH, CLASSIC)} with"
    assert quoted in readme
