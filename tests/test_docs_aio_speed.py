"""The figures docs/benchmarks.md quotes on why the asyncio default mode is slower are the named run's.

"Why the asyncio default mode is slower" pastes the peers table of
benchmarks/results/aio-speed-2026-12-04/results.md, the variants of its aio-speed.json
(python -m benchmarks.aio_speed) and the shares of its aio-profile.json (--profile); these tests recompute
each from the run's files, so a new run with stale prose fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from docs_support import assert_pasted, prose, run_named, section

ROOT: Final = Path(__file__).resolve().parent.parent
RUN: Final = ROOT / "benchmarks" / "results" / "aio-speed-2026-12-04"
RESULTS: Final = json.loads((RUN / "results.json").read_text(encoding="utf-8"))
SPEED: Final = json.loads((RUN / "aio-speed.json").read_text(encoding="utf-8"))
PROFILE: Final = json.loads((RUN / "aio-profile.json").read_text(encoding="utf-8"))
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"


def _section() -> str:
    return section(
        BENCHMARKS_MD, "### Why the asyncio default mode is slower: `aio-speed-2026-12-04`", "\n### "
    )


def _prose() -> str:
    return prose(_section())


def _rate(name: str) -> float:
    (entry,) = RESULTS["benchmarks"]["peers"]
    (system,) = [s for s in entry["systems"] if s["name"] == name]
    assert system["verification"]["ok"], name
    return float(system["jobs_per_s"])


def _variant(name: str) -> dict[str, Any]:
    found: dict[str, Any] = SPEED["variants"][name]
    return found


def test_the_peers_table_pasted_is_the_named_runs() -> None:
    assert_pasted(RUN / "results.md", "### Beside", _section(), must="proletarian-ref async (psycopg)")


def test_the_run_is_named_with_its_revision_and_its_load() -> None:
    text = _prose()
    meta: dict[str, Any] = RESULTS["meta"]
    (entry,) = RESULTS["benchmarks"]["peers"]
    for phrase in run_named(meta):
        assert phrase in text, phrase
    assert (entry["processes"], entry["connections_per_process"]) == (1, 8)
    assert f"{entry['jobs']:,} jobs a drain, 1 process x 8 connections" in text
    assert f"load average {SPEED['load_average'][0]:.2f} at its end" in text


def test_the_default_mode_target_and_its_verdict_are_the_runs() -> None:
    threaded, asyncio = _rate("proletarian-ref"), _rate("proletarian-ref async (psycopg)")
    ratio = asyncio / threaded
    verdict = "is again **met**" if ratio >= 1.3 else "is again **not met**"
    quoted = (
        f"**{ratio:.2f}x** ({asyncio:,.0f} against {threaded:,.0f} jobs/s); "
        f"the target, at least 1.3x, {verdict}"
    )
    assert quoted in _prose()


def test_each_variant_row_is_the_speed_runs() -> None:
    threaded = _variant("threaded")
    assert SPEED["connections"] == 8
    section = _section()
    for name, v in SPEED["variants"].items():
        rounds = " ".join(str(r) for r in v["rounds_jobs_per_s"])
        row = (
            f"| {name} | {v['jobs_per_s']:,.0f} | {rounds} | "
            f"{v['jobs_per_s'] / threaded['jobs_per_s']:.2f} | "
            f"{v['cpu_us_per_job']:.0f} | {v['cpu_us_per_job'] / threaded['cpu_us_per_job']:.2f} | "
            f"{v['waits_per_job']:.2f} |"
        )
        assert row in section


def test_the_cpu_ratios_and_the_claims_on_them_are_the_speed_runs() -> None:
    text = _prose()
    base = float(_variant("threaded")["cpu_us_per_job"])

    def over(name: str) -> float:
        return float(_variant(name)["cpu_us_per_job"]) / base

    assert f"spends {over('asyncio'):.2f}x the threaded one's" in text
    assert f"cuts the CPU per job to {over('asyncio compact'):.2f}x" in text
    assert f"to {over('asyncio uvloop'):.2f}x; both together to {over('asyncio compact uvloop'):.2f}x" in text
    # "The two workers wait on the server the same number of times a job"; compact waits once less.
    assert _variant("threaded")["waits_per_job"] == _variant("asyncio")["waits_per_job"]
    assert round(_variant("asyncio")["waits_per_job"] - _variant("asyncio compact")["waits_per_job"]) == 1
    # "Even then the asyncio worker costs no less CPU a job than the threaded one".
    assert min(over(name) for name in SPEED["variants"] if name != "threaded") >= 1.0
    assert "Even then the asyncio worker costs no less CPU a job than the threaded one" in text


def test_the_profile_shares_are_the_profile_runs() -> None:
    text = _prose()
    shares = PROFILE["share_percent"]
    assert f"{PROFILE['profiled_cpu_us_per_job']:,} µs a job" in text
    assert (
        f"the asyncio event loop {shares['asyncio event loop']}%, psycopg {shares['psycopg']}%, "
        f"built-ins {shares['built-ins']}%"
    ) in text
    assert f"proletarian_ref {shares['proletarian_ref']}%" in text
    # "The library's own per-job path ... is the smallest part" of the three named.
    assert shares["proletarian_ref"] < min(
        shares["asyncio event loop"], shares["psycopg"], shares["built-ins"]
    )
