"""The figures docs/benchmarks.md quotes from the two limit6 runs (batch mode's chain; the database on cores
of its own, and sharing them) are theirs, and so are README's figures against the server's limit.

"Chained batches" pastes both runs' limit and per-job cost tables and a table of the targets met per point,
and quotes in prose what the chain gave batch mode, its round trips, and the CPU bound of the points missed
sharing the cores; these tests recompute each from the runs' results.json, so a new run with stale prose
fails here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Final

import pytest
from docs_support import (
    CHAINED_BATCH_DRAINS,
    DATABASES,
    DEFAULT_DRAINS,
    RESULTS_DIR,
    TARGET_DIGITS,
    assert_pasted,
    load_runs,
    missed,
    missed_cpu_bounds,
    over_ceiling,
    prose,
    run_named,
    section,
    targets_table,
    throughput_rows,
)

ROOT: Final = Path(__file__).resolve().parent.parent
CORES_RUN: Final = "limit6-cores-2026-12-05b"
SHARED_RUN: Final = "limit6-shared-2026-12-05c"
RUNS: Final = load_runs(CORES_RUN, SHARED_RUN)
BENCHMARKS_MD: Final = ROOT / "docs" / "benchmarks.md"
READINGS: Final = {CORES_RUN: "on cores of its own", SHARED_RUN: "sharing the cores"}


def _section() -> str:
    return section(BENCHMARKS_MD, f"### Chained batches: `{CORES_RUN}` and `{SHARED_RUN}`", "\n## ")


def _rows(run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return throughput_rows(RUNS[run], backend, batch=batch)


def batch_gains(run: str) -> str:
    """What chained batches gave batch mode at each PostgreSQL batch point of `run`, as the prose says it."""
    return "; ".join(
        f"at {r['processes']} x {r['threads']} the threaded worker went from {r['library_ratio_limit']:.2f} "
        f"to {r['chain_ratio_limit']:.2f} of the limit, the asyncio worker from {r['async_ratio_limit']:.2f} "
        f"to {r['async_chain_ratio_limit']:.2f}"
        for r in _rows(run, "postgresql", batch=True)
    )


def _missed(run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
    return missed(RUNS[run], backend, CHAINED_BATCH_DRAINS if batch else DEFAULT_DRAINS, batch=batch)


@pytest.mark.parametrize("run", [CORES_RUN, SHARED_RUN])
def test_both_runs_tables_are_pasted(run: str) -> None:
    assert_pasted(
        RESULTS_DIR / run / "results.md", "#### Against the server's limit", _section(), must="batch chain"
    )


def test_the_runs_are_named_with_their_revision_machine_and_load() -> None:
    text = prose(_section())
    cores, shared = RUNS[CORES_RUN]["meta"], RUNS[SHARED_RUN]["meta"]
    assert not cores["git"]["dirty"] and not shared["git"]["dirty"]
    assert f"{cores['machine']['logical_cores']}-core {cores['machine']['cpu_model']}" in text
    for phrase in run_named(cores, end="at its end"):
        assert phrase in text, phrase
    assert f"git {shared['git']['commit'][:10]}" in text
    assert (
        f"load average {shared['machine']['load_average'][0]} at its start, "
        f"{shared['machine_at_end']['load_average'][0]} at its end" in text
    )


def test_the_two_revisions_run_the_same_library_and_benchmarks() -> None:
    """The runs are one commit apart, which changed tests only: what they drained is the same code."""
    cores, shared = (RUNS[run]["meta"]["git"]["commit"] for run in (CORES_RUN, SHARED_RUN))
    changed = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "--name-only", cores, shared],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert changed and all(path.startswith("tests/") for path in changed), changed


def test_the_targets_table_is_the_runs() -> None:
    text = _section()
    for line in targets_table(RUNS, READINGS, DATABASES, DEFAULT_DRAINS, CHAINED_BATCH_DRAINS, TARGET_DIGITS):
        assert line in text, line


def test_what_chained_batches_gave_batch_mode_is_the_runs() -> None:
    text = prose(_section())
    for run in RUNS:
        assert batch_gains(run) in text, run


def test_batch_modes_round_trips_are_the_cores_run() -> None:
    (one,) = [r for r in _rows(CORES_RUN, "postgresql", batch=True) if r["processes"] == 1]
    trips = {d: one[f"{d}_round_trips_per_job"] for d in CHAINED_BATCH_DRAINS}
    assert (
        f"{trips['library']:.2f} round trips a job in batch mode ({trips['async']:.2f} on the asyncio "
        f"worker's compact plan), {trips['chain']:.2f} and {trips['async_chain']:.2f} chained"
        in prose(_section())
    )


def test_the_cpu_bound_of_each_point_missed_sharing_the_cores_is_the_shared_run() -> None:
    text = prose(_section())
    bounds = missed_cpu_bounds(RUNS[SHARED_RUN])
    assert bounds, "no point missed sharing the cores: the prose on what bounds them is stale"
    for phrase in bounds:
        assert phrase in text, phrase
    over = over_ceiling(RUNS[SHARED_RUN], DEFAULT_DRAINS, CHAINED_BATCH_DRAINS)
    assert f"Where it is over 0.6 ({over}) the two cores were not kept busy" in text


def test_the_python_client_cost_more_cpu_a_job_here_than_on_limit5s_machine() -> None:
    limit5 = load_runs("limit5-cores-2026-12-05")["limit5-cores-2026-12-05"]
    here = _rows(CORES_RUN, "postgresql", batch=False)
    there = throughput_rows(limit5, "postgresql", batch=False)
    for new, old in zip(here, there, strict=True):
        for drain in DEFAULT_DRAINS:
            key = f"{drain}_client_cpu_us_per_job"
            assert new[key] > old[key], (new["processes"], new["threads"], drain)
    assert "every PostgreSQL drain at one job a commit cost the Python client more CPU a job" in prose(
        _section()
    )
