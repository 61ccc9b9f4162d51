"""The figures docs/benchmarks.md quotes for the asyncio worker are those of the named run it names.

"The asyncio worker beside the threaded one" pastes the peers table of
benchmarks/results/aio-peers-2026-12-04/results.md and quotes its ratios against issue 24's targets, and
the synchronous_commit figures of sync-commit.json beside it; these tests recompute each from the run's
files, so a new run with stale prose fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from docs_support import assert_pasted, prose, run_named, section

ROOT: Final = Path(__file__).resolve().parent.parent
RUN: Final = ROOT / "benchmarks" / "results" / "aio-peers-2026-12-04"
RESULTS: Final = json.loads((RUN / "results.json").read_text(encoding="utf-8"))
SYNC_COMMIT: Final = json.loads((RUN / "sync-commit.json").read_text(encoding="utf-8"))
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
THREADED: Final = "proletarian-ref"
ASYNC: Final = "proletarian-ref async (psycopg)"
ASYNC_BATCH: Final = "proletarian-ref async batch 10 (psycopg)"


def _section() -> str:
    return section(BENCHMARKS_MD, "## The asyncio worker beside the threaded one", "\n## ")


def _prose() -> str:
    return prose(_section())


def _rate(name: str) -> float:
    (entry,) = RESULTS["benchmarks"]["peers"]
    (system,) = [s for s in entry["systems"] if s["name"] == name]
    assert system["verification"]["ok"], name
    return float(system["jobs_per_s"])


def test_the_table_pasted_is_the_named_runs() -> None:
    assert_pasted(RUN / "results.md", "### Beside", _section(), must=ASYNC_BATCH)


def test_the_run_is_named_with_its_revision_its_shape_and_its_load() -> None:
    text = _prose()
    meta: dict[str, Any] = RESULTS["meta"]
    (entry,) = RESULTS["benchmarks"]["peers"]
    for phrase in run_named(meta):
        assert phrase in text, phrase
    assert (entry["processes"], entry["connections_per_process"]) == (1, 8)
    assert f"{entry['jobs']:,} jobs a drain, 1 process x 8 connections" in text


def test_the_targets_quoted_and_their_verdicts_are_the_runs() -> None:
    text = _prose()
    default = _rate(ASYNC) / _rate(THREADED)
    batch = _rate(ASYNC_BATCH) / _rate("pgqueuer")
    assert f"**{default:.2f}x** ({_rate(ASYNC):,.0f} against {_rate(THREADED):,.0f} jobs/s)" in text
    assert f"**{batch:.2f}x** ({_rate(ASYNC_BATCH):,.0f} against {_rate('pgqueuer'):,.0f} jobs/s)" in text
    default_verdict = "is **met**" if default >= 1.3 else "is **not met**"
    batch_verdict = "is **met**" if batch >= 2 else "is **not met**"
    assert f"the target, at least 1.3x, {default_verdict}" in text
    assert f"the target, at least 2x, {batch_verdict}" in text


def test_the_synchronous_commit_figures_are_the_runs() -> None:
    rates = SYNC_COMMIT["jobs_per_s"]
    quoted = (
        f"**{rates['on']:,.0f} jobs/s with it on, {rates['off']:,.0f} with it off, "
        f"{SYNC_COMMIT['off_over_on']:.2f}x**"
    )
    assert quoted in _prose()
    assert f"{SYNC_COMMIT['jobs']:,} jobs, {SYNC_COMMIT['threads']} threads" in _prose()
