"""The figures docs/benchmarks.md quotes for synchronous_commit_off in the library's worker are those of
the named run benchmarks/results/synccommit-2026-12-04/; these tests recompute each from the run's file,
so a new run with stale prose fails here."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
RUN: Final = ROOT / "benchmarks" / "results" / "synccommit-2026-12-04" / "sync-commit-library.json"
LIBRARY: Final = json.loads(RUN.read_text(encoding="utf-8"))
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"


def _prose() -> str:
    text = BENCHMARKS_MD.read_text(encoding="utf-8")
    start = text.index("### `SET LOCAL synchronous_commit = off`")
    return re.sub(r"\s+", " ", text[start : text.index("\n## ", start)])


def test_the_run_is_the_library_worker_with_each_round_paired() -> None:
    assert LIBRARY["loop"] == "library"
    on, off = LIBRARY["rounds_jobs_per_s"]["on"], LIBRARY["rounds_jobs_per_s"]["off"]
    assert len(on) == len(off) == LIBRARY["rounds"]
    paired = [b / a for a, b in zip(on, off, strict=True)]
    assert paired == LIBRARY["off_over_on_rounds"]
    assert statistics.median(paired) == LIBRARY["off_over_on_paired"]


def test_the_quoted_ratio_and_its_range_are_the_runs() -> None:
    paired = LIBRARY["off_over_on_rounds"]
    quoted = (
        f"**the library's worker with the option on ran {LIBRARY['off_over_on_paired']:.2f}x the jobs a "
        f"second of the same worker with it off (median of {LIBRARY['rounds']} rounds' paired ratios, each "
        f"between {min(paired):.2f}x and {max(paired):.2f}x)**"
    )
    assert quoted in _prose()
    assert f"on {LIBRARY['jobs']:,} jobs a drain, {LIBRARY['threads']} worker threads" in _prose()


def test_the_quoted_command_made_the_run() -> None:
    command = (
        f"--loop library --jobs {LIBRARY['jobs']} --threads {LIBRARY['threads']} "
        f"--rounds {LIBRARY['rounds']} "
        "--table-suffix _synccommit --out benchmarks/results/synccommit-2026-12-04/sync-commit-library.json"
    )
    assert command in _prose().replace("\\ ", "")
