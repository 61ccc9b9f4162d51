"""The figures docs/scaling.md shows are those of the runs kept in benchmarks/scale/reference.

The scale-out runs' table is `python -m benchmarks.scale.chart`'s, the Patroni run's table is
benchmarks.scale.patroni.table's, both recomputed here from the runs' JSON, so a new run with stale docs
fails here; so do the Patroni settings and the loss without a watchdog that the prose quotes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

from benchmarks.scale import chart
from benchmarks.scale.patroni import table

ROOT: Final = Path(__file__).resolve().parent.parent
REFERENCE: Final = ROOT / "benchmarks" / "scale" / "reference"
SCALING_MD: Final = ROOT / "docs" / "scaling.md"
PATRONI_RUN: Final = REFERENCE / "patroni.json"
UNFENCED_RUN: Final = REFERENCE / "patroni_faults_agent-kill-unfenced.json"


def _run(path: Path) -> dict[str, Any]:
    run: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return run


def _prose() -> str:
    return re.sub(r"\s+", " ", SCALING_MD.read_text(encoding="utf-8"))


def _missing_lines(printed: str) -> list[str]:
    text = SCALING_MD.read_text(encoding="utf-8")
    return [line for line in printed.splitlines() if line not in text]


def test_the_scale_out_table_is_the_reference_runs() -> None:
    assert _missing_lines(chart.table(REFERENCE)) == []


def test_the_patroni_table_is_the_reference_run() -> None:
    run = _run(PATRONI_RUN)
    assert run["problems"] == []
    assert f"`{run['command']}`" in _prose()
    assert _missing_lines(table(run)) == []


def test_the_patroni_settings_quoted_are_the_runs() -> None:
    settings = _run(PATRONI_RUN)["settings"]
    text = _prose()
    for key in ("ttl", "loop_wait", "retry_timeout"):
        assert f"`{key}: {settings[key]}`" in text
    assert settings["haproxy_check"] in text
    assert settings["load_per_path"] in text


def test_the_loss_without_a_watchdog_quoted_is_the_runs() -> None:
    run = _run(UNFENCED_RUN)
    (lost,) = [p for p in run["problems"] if "committed jobs never archived" in p]
    count = int(lost.split(": ", 1)[1].split()[0])
    assert f"`{run['command']}`" in _prose()
    assert f"**{count} enqueues whose COMMIT had returned were lost**" in _prose()


def test_the_patroni_prose_figures_are_the_runs() -> None:
    run = _run(PATRONI_RUN)
    rounds = {done["fault"]: done for done in run["rounds"]}
    promote = _run(REFERENCE / "pgfailover_jobs_10000.json")
    text = _prose()
    load = rounds["postmaster-kill"]["paths"]["dsn"]["load_average_at_start"][0]
    assert f"load average {load:.0f} on the shared 2-core machine" in text
    assert f"({promote['fault_to_progress_s']} s from the crash to the next commit)" in text
    etcd_lead = re.search(r"led (\d+\.\d) s later", rounds["etcd-cut"]["steps"][0])
    assert etcd_lead is not None
    assert f"with the leader cut off etcd {float(etcd_lead[1]):.0f} s" in text
    switchover = [path["stall_after_fault_s"] for path in rounds["switchover"]["paths"].values()]
    assert f"A planned switchover costs {min(switchover):.0f}\N{EN DASH}{max(switchover):.0f} s" in text
