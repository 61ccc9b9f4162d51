"""The figures docs/benchmarks.md quotes from the probe of what one claim reads (`claims-2026-12-06`:
benchmarks.limit_probe with its sampled claims, on MariaDB and PostgreSQL) are its own.

"What one claim reads" pastes the probe's tables and says how many pages a MariaDB claim reads a row at
batch 4 x 4 against batch 1 x 4, what share of the pages a job the claims are, that MariaDB's batch 4 x 4 met
the target again, and that on PostgreSQL the limit's claims read at least as much as any drain's. These
tests recompute each from the probe's JSON, so a new probe with stale prose fails here.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any, Final

from docs_support import (
    BENCHMARKS_MD,
    LIMIT_TARGET,
    RESULTS_DIR,
    assert_quoted,
    probe_medians,
    prose,
    section,
    span,
)

RUN: Final = RESULTS_DIR / "claims-2026-12-06"
HEADING: Final = "### What one claim reads: `claims-2026-12-06`"
WIDE: Final = [4, 4, 10]
NARROW: Final = [1, 4, 10]
PAGES: Final = "Innodb_buffer_pool_read_requests"

PROBES: Final[dict[str, dict[str, Any]]] = {
    database: json.loads((RUN / f"{database}.json").read_text(encoding="utf-8"))
    for database in ("mysql", "postgresql")
}
MYSQL: Final[list[dict[str, Any]]] = PROBES["mysql"]["results"]
POSTGRESQL: Final[list[dict[str, Any]]] = PROBES["postgresql"]["results"]


def _text() -> str:
    return section(BENCHMARKS_MD, HEADING, "\n## ")


def at(results: list[dict[str, Any]], point: list[int]) -> list[dict[str, Any]]:
    return [r for r in results if r["point"] == point]


def medians(results: list[dict[str, Any]], point: list[int], key: str) -> dict[str, float]:
    """Each drain's (and the limit's) median over the rounds of its claims' `key`, as claims_table prints."""
    found: dict[str, list[float]] = {}
    for r in at(results, point):
        found.setdefault(r["factory"], []).append(float(r["claims"][key]))
    return {drain: statistics.median(values) for drain, values in found.items()}


def claims_share(result: dict[str, Any]) -> float:
    """The claims' pages a row over all the pages InnoDB read a job, in one reading."""
    return float(result["claims"]["pages_per_row"]) / float(result["server_status"][PAGES])


def own_share(result: dict[str, Any]) -> float:
    """The probe's own sampled claims' pages over the pages InnoDB read in the window."""
    claims = result["claims"]
    return float(claims["samples"] * claims["pages"] / result["jobs"]) / float(result["server_status"][PAGES])


def figures() -> dict[str, str]:
    wide_rows, narrow_rows = medians(MYSQL, WIDE, "pages_per_row"), medians(MYSQL, NARROW, "pages_per_row")
    wide = at(MYSQL, WIDE)
    limits = [r["jobs_per_s"] for r in wide if r["factory"] == "limit"]
    pages, cpu = [r["server_status"][PAGES] for r in wide], [r["per_job_us"]["server_all_cpu"] for r in wide]
    return {
        "TIMES": f"{min(wide_rows.values()) / max(narrow_rows.values()):.0f} to "
        f"{max(wide_rows.values()) / min(narrow_rows.values()):.0f}",
        "NARROW_CLAIM": f"{min(medians(MYSQL, NARROW, 'pages').values()):.1f} to "
        f"{max(medians(MYSQL, NARROW, 'pages').values()):.1f}",
        "WIDE_CLAIM": f"{min(medians(MYSQL, WIDE, 'pages').values()):.1f} to "
        f"{max(medians(MYSQL, WIDE, 'pages').values()):.1f}",
        "SHARE_WIDE": span(map(claims_share, wide)),
        "SHARE_NARROW": f"{math.ceil(max(map(claims_share, at(MYSQL, NARROW))) * 100) / 100:.2f}",
        "PAGES_NARROW": f"{min(r['server_status'][PAGES] for r in at(MYSQL, NARROW)):.0f} to "
        f"{max(r['server_status'][PAGES] for r in at(MYSQL, NARROW)):.0f}",
        "OWN": f"{max(own_share(r) for r in MYSQL):.3f}",
        "CORR": f"{statistics.correlation(pages, cpu):.2f}",
        "MEDIANS_WIDE": span(probe_medians(MYSQL, WIDE).values()),
        "MEDIANS_NARROW": span(probe_medians(MYSQL, NARROW).values()),
        "LIMITS": f"{min(limits):,.0f} to {max(limits):,.0f}",
        "PG_SHARES": ", ".join(
            f"{probe_medians(POSTGRESQL, p)['postgresql:async_chain']:.2f}" for p in ([1, 8, 1], [4, 4, 1])
        )
        + f" and {probe_medians(POSTGRESQL, [1, 4, 10])['postgresql:async_chain']:.2f}",
    }


PHRASES: Final = {
    "TIMES": "a claim reads {} times the pages a row at batch 4 x 4",
    "NARROW_CLAIM": "{} pages a claim of ten rows with four connections",
    "WIDE_CLAIM": "{} with sixteen",
    "SHARE_WIDE": "the pages InnoDB read a job was {} at batch 4 x 4",
    "SHARE_NARROW": "at most {} at batch 1 x 4",
    "PAGES_NARROW": "where a job still cost {} pages",
    "OWN": "The probe's own sampled claims were at most {} of the pages a job",
    "CORR": "(correlation {}, against 0.90 there)",
    "MEDIANS_WIDE": "the drains' medians were {} of the limit",
    "MEDIANS_NARROW": "at batch 1 x 4, {}.",
    "LIMITS": "{} in this one",
    "PG_SHARES": "the asyncio chain at {} of the limit",
}


def test_the_probes_tables_pasted_are_what_the_probe_prints() -> None:
    from benchmarks.limit_probe import claims_table, status_table, table

    text = _text()
    for results in (MYSQL, POSTGRESQL):
        printed = [table(results), status_table(results) or "", claims_table(results)]
        assert printed[2] is not None
        for line in "\n".join(p or "" for p in printed).splitlines():
            assert line in text, line


def test_every_figure_the_prose_quotes_is_the_probes() -> None:
    assert_quoted(prose(_text()), figures(), PHRASES)


def test_the_innodb_probes_figures_quoted_here_are_its_own() -> None:
    from test_docs_innodb import figures as innodb

    text = prose(_text())
    assert f"({innodb()['LIMIT_RATES']} jobs/s in the first," in text
    assert f"against {innodb()['CORR']} there" in text


def test_mariadbs_batch_4_x_4_met_the_target_in_both_probes() -> None:
    from test_docs_innodb import RESULTS as INNODB

    for results in (MYSQL, INNODB):
        assert min(probe_medians(results, WIDE).values()) >= LIMIT_TARGET


def test_on_postgresql_the_limits_claims_read_at_least_as_much_a_row_as_any_drains() -> None:
    for point in ([1, 8, 1], [4, 4, 1], [1, 4, 10]):
        rows = medians(POSTGRESQL, point, "pages_per_row")
        limit = rows.pop("limit")
        assert limit >= max(rows.values()), (point, limit, rows)
    assert "at every point the limit's claims read at least as many blocks a row as any drain's" in prose(
        _text()
    )


def test_every_reading_sampled_claims_of_the_points_rows() -> None:
    for r in [*MYSQL, *POSTGRESQL]:
        batch = r["point"][2]
        assert r["claims"]["samples"] >= 20 and r["claims"]["rows"] == batch, r["claims"]


def test_the_probe_is_named_with_its_revision_machine_and_load() -> None:
    text = prose(_text())
    for database, probe in PROBES.items():
        meta = probe["meta"]
        assert not meta["git"]["dirty"]
        assert f"git {meta['git']['commit'][:10]}" in text
        assert f"{meta['machine']['load_average'][0]} at the start" in text
        assert f"{meta['machine_at_end']['load_average'][0]} at its end" in text
        assert f"benchmarks/results/claims-2026-12-06/{database}.json" in text
    assert f"the same {PROBES['mysql']['meta']['machine']['logical_cores']}-core AMD EPYC" in text


def test_the_sampling_interval_quoted_is_the_probes() -> None:
    from benchmarks.limit_probe import CLAIM_EVERY_S

    assert f"every {CLAIM_EVERY_S * 1000:.0f} ms of each window" in prose(_text())
    # The isolation level the sampled claim runs at now (tests/test_benchmarks_limit.py proves it).
    assert "it runs at READ COMMITTED since, as the worker's" in prose(_text())


def test_the_readme_names_both_probes() -> None:
    readme = prose((BENCHMARKS_MD.parent.parent / "README.md").read_text(encoding="utf-8"))
    assert "named probes `innodb-2026-12-06` and `claims-2026-12-06`" in readme
    assert "two later probes met 0.6 there" in readme


def test_the_innodb_section_points_here() -> None:
    innodb = section(BENCHMARKS_MD, "### What MariaDB's server spends a job at batch 4 x 4", "\n### ")
    assert "the claims' own share is read since, by the next probe (`claims-2026-12-06`)" in prose(innodb)
    assert "at most about a third of them" in prose(innodb)
    assert max(map(claims_share, at(MYSQL, WIDE))) < 0.36
