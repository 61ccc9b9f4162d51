"""The figures docs/benchmarks.md quotes from the probe of MariaDB's server work (`innodb-2026-12-06`:
benchmarks.limit_probe with InnoDB's counters a job) are its own.

"What MariaDB's server spends a job at batch 4 x 4" pastes the probe's two tables and says that at batch
4 x 4 the whole server's CPU a job follows the InnoDB pages read a job, for the limit and every drain alike,
and that those swung between rounds while at batch 1 x 4 they held. These tests recompute each figure from
the probe's JSON, so a new probe with stale prose fails here.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Final

from docs_support import (
    BENCHMARKS_MD,
    LIMIT_TARGET,
    RESULTS_DIR,
    assert_quoted,
    probe_medians,
    probe_shares,
    prose,
    section,
    span,
)

RUN: Final = RESULTS_DIR / "innodb-2026-12-06"
HEADING: Final = "### What MariaDB's server spends a job at batch 4 x 4: `innodb-2026-12-06`"
WIDE: Final = [4, 4, 10]
NARROW: Final = [1, 4, 10]
PAGES: Final = "Innodb_buffer_pool_read_requests"
BACKLOG: Final = "Innodb_history_list_length"

PROBE: Final[dict[str, Any]] = json.loads((RUN / "mysql.json").read_text(encoding="utf-8"))
RESULTS: Final[list[dict[str, Any]]] = PROBE["results"]


def _text() -> str:
    return section(BENCHMARKS_MD, HEADING, "\n### ")


def at(point: list[int], *, limit: bool | None = None) -> list[dict[str, Any]]:
    """The readings at `point`: every one, only the limit's (True) or only the drains' (False)."""
    return [
        r for r in RESULTS if r["point"] == point and (limit is None or (r["factory"] == "limit") == limit)
    ]


def pages(result: dict[str, Any]) -> float:
    return float(result["server_status"][PAGES])


def server_cpu(result: dict[str, Any]) -> float:
    return float(result["per_job_us"]["server_all_cpu"])


def figures() -> dict[str, str]:
    wide = at(WIDE)
    fit = statistics.linear_regression([pages(r) for r in wide], [server_cpu(r) for r in wide])
    backlog_end = [float(r["server_status"][BACKLOG][1]) for r in wide]
    backlogs = [n for r in wide for n in r["server_status"][BACKLOG]]
    narrow_drains = at(NARROW, limit=False)
    return {
        "CORR": f"{statistics.correlation([pages(r) for r in wide], [server_cpu(r) for r in wide]):.2f}",
        "SLOPE": f"{fit.slope:.2f}",
        "PAGES_WIDE": f"{min(map(pages, wide)):.0f} to {max(map(pages, wide)):.0f}",
        "PAGES_LIMIT": f"{min(map(pages, at(WIDE, limit=True))):.0f} to "
        f"{max(map(pages, at(WIDE, limit=True))):.0f}",
        "CPU_WIDE": f"{min(map(server_cpu, wide)):.0f} to {max(map(server_cpu, wide)):.0f}",
        "LIMIT_RATES": f"{min(r['jobs_per_s'] for r in at(WIDE, limit=True)):,.0f} to "
        f"{max(r['jobs_per_s'] for r in at(WIDE, limit=True)):,.0f}",
        "SHARES_WIDE": span(share for _, share in probe_shares(RESULTS, WIDE)),
        "MEDIANS_WIDE": span(probe_medians(RESULTS, WIDE).values()),
        "BACKLOG_CORR": f"{statistics.correlation([pages(r) for r in wide], backlog_end):.2f}",
        "BACKLOGS": f"{min(backlogs)} to {max(backlogs)}",
        "PAGES_NARROW": f"{min(map(pages, at(NARROW))):.0f} to {max(map(pages, at(NARROW))):.0f}",
        "SHARES_NARROW": span(share for _, share in probe_shares(RESULTS, NARROW)),
        "CLIENT_NARROW": f"{min(r['per_job_us']['client_cpu'] for r in narrow_drains):.0f} to "
        f"{max(r['per_job_us']['client_cpu'] for r in narrow_drains):.0f}",
        "CLIENT_LIMIT": f"{max(r['per_job_us']['client_cpu'] for r in at(NARROW, limit=True)):.0f}",
    }


PHRASES: Final = {
    "CORR": "(correlation {} over the point's fifteen readings",
    "SLOPE": "about {} µs of the server's CPU a page",
    "PAGES_WIDE": "read from {} pages a job",
    "PAGES_LIMIT": "the limit's own from {}",
    "CPU_WIDE": "its whole server CPU from {} µs a job",
    "LIMIT_RATES": "the limit ran at {} jobs/s",
    "SHARES_WIDE": "each drain's share of its round's limit ran from {}",
    "MEDIANS_WIDE": "the drains' medians are {} of the limit",
    "BACKLOG_CORR": "correlation {} with the backlog at the window's end",
    "BACKLOGS": "the backlog read at the windows' ends ran from {} transactions",
    "PAGES_NARROW": "the pages a job held at {}",
    "SHARES_NARROW": "the drains reached {} of their round's limit",
    "CLIENT_NARROW": "their client CPU a job, {} µs",
    "CLIENT_LIMIT": "against mariadb-slap's {}",
}


def test_the_probes_tables_pasted_are_what_the_probe_prints() -> None:
    from benchmarks.limit_probe import status_table, table

    printed = status_table(RESULTS)
    assert printed is not None
    text = _text()
    for line in [*table(RESULTS).splitlines(), *printed.splitlines()]:
        assert line in text, line


def test_every_figure_the_prose_quotes_is_the_probes() -> None:
    assert_quoted(prose(_text()), figures(), PHRASES)


def test_the_server_cpu_follows_the_pages_at_batch_4_x_4_and_not_at_batch_1_x_4() -> None:
    # What the section says of the two points, not only its figures: the fit is close at 4 x 4, none at 1 x 4.
    wide, narrow = at(WIDE), at(NARROW)
    assert len(wide) == 15  # "the point's fifteen readings"
    assert statistics.correlation([pages(r) for r in wide], [server_cpu(r) for r in wide]) > 0.85
    assert abs(statistics.correlation([pages(r) for r in narrow], [server_cpu(r) for r in narrow])) < 0.5
    assert max(map(pages, wide)) > 3 * min(map(pages, wide))
    assert max(map(pages, narrow)) < 1.5 * min(map(pages, narrow))


def test_every_drains_median_met_the_target_at_batch_4_x_4_in_this_probe() -> None:
    assert min(probe_medians(RESULTS, WIDE).values()) >= LIMIT_TARGET
    shares = [share for _, share in probe_shares(RESULTS, WIDE)]
    assert min(shares) < LIMIT_TARGET < max(shares)


def test_the_probe_is_named_with_its_revision_machine_and_load() -> None:
    text = prose(_text())
    meta = PROBE["meta"]
    assert not meta["git"]["dirty"]
    assert f"git {meta['git']['commit'][:10]}" in text
    assert f"load average {meta['machine']['load_average'][0]} at the start" in text
    assert f"{meta['machine_at_end']['load_average'][0]} at its end" in text
    assert f"a {meta['machine']['logical_cores']}-core AMD EPYC" in text
    assert "benchmarks/results/innodb-2026-12-06/mysql.json" in text


def test_the_claims_index_is_proletarians_prefix_of_the_queue_text() -> None:
    # The section's reading of the claim's index: Proletarian's DDL, a prefix of the TEXT queue column.
    schema_sql = Path(__file__).resolve().parent.parent / "sql" / "mysql" / "schema.sql"
    schema = schema_sql.read_text(encoding="utf-8")
    assert "INDEX (queue(256), process_at)" in schema and "queue       TEXT" in schema
    assert "`queue(256), process_at`" in _text()


def test_the_readme_and_the_misses_section_point_here() -> None:
    readme = prose((BENCHMARKS_MD.parent.parent / "README.md").read_text(encoding="utf-8"))
    assert "named probes `innodb-2026-12-06` and" in readme
    misses = section(BENCHMARKS_MD, "### What bounds the points missed sharing the cores", "\n### ")
    anchor = "#what-mariadbs-server-spends-a-job-at-batch-4-x-4-innodb-2026-12-06"
    assert f"[`innodb-2026-12-06`]({anchor})" in misses


def test_the_rows_asked_for_a_job_held_and_no_row_lock_was_waited_for() -> None:
    # "the rows asked for a job held within a few hundredths across the rounds ... no row lock was waited for"
    for drain in dict.fromkeys(r["factory"] for r in RESULTS):
        for counter in ("Handler_read_key", "Handler_read_next", "Handler_delete"):
            values = [r["server_status"][counter] for r in RESULTS if r["factory"] == drain]
            assert max(values) - min(values) < 0.05, (drain, counter, values)
    assert all(r["server_status"]["Innodb_row_lock_waits"] == 0 for r in RESULTS)
    assert "held within a few hundredths across the rounds" in prose(_text())
    assert "no row lock was waited for" in prose(_text())
