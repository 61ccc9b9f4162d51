"""`python -m benchmarks.scale.chart [DIR]`: the scale-out runs on one chart (docs/scaling.png) and a table.

Reads the JSON each `python -m benchmarks.scale ...` run printed (benchmarks/scale/reference/*.json),
and draws jobs/s against the worker connections of the run, beside the capacity model of
docs/scaling.md: one connection does at most 1 / (handler time + transaction time) jobs a second,
and the database at most its commit rate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
# The Agg backend must be chosen before pyplot loads, so no display is ever needed.
import matplotlib.pyplot as plt

REFERENCE = Path(__file__).resolve().parent / "reference"
DOCS_CHART = Path(__file__).resolve().parents[2] / "docs" / "scaling.png"
# The capacity model's two numbers, measured on this machine (docs/scaling.md, "Capacity model").
TRANSACTION_S = 0.0018
COMMIT_RATE = 1600.0
HANDLER_TIMES_S = (0.0005, 0.01, 0.1)


def _connections(command: str) -> int:
    words = command.split()

    def option(name: str, default: int) -> int:
        return int(words[words.index(name) + 1]) if name in words else default

    per_process = option("--threads", 3) * option("--workers", 2)
    return per_process * option("--hosts", 4) if " hosts " in f" {command} " else per_process


def _runs(directory: Path) -> list[dict[str, Any]]:
    """The runs of one load each: the Patroni runs have a table of their own (benchmarks.scale.patroni)."""
    runs = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(directory.glob("*.json"))]
    return [run for run in runs if "rounds" not in run]


def draw(directory: Path, out: Path) -> Path:
    runs = _runs(directory)
    fig, (rate_ax, gap_ax) = plt.subplots(1, 2, figsize=(12, 4.8), width_ratios=[3, 2])
    connections = range(1, 65)
    for handler_s in HANDLER_TIMES_S:
        model = [min(n / (handler_s + TRANSACTION_S), COMMIT_RATE) for n in connections]
        rate_ax.plot(
            connections, model, linestyle="--", linewidth=1, label=f"model, handler {handler_s * 1000:g} ms"
        )
    gaps: list[tuple[str, float]] = []
    for i, run in enumerate(runs):
        if not run.get("command"):
            continue
        words = run["command"].removeprefix("python -m benchmarks.scale ").split()
        label = words[0] + (" direct" if "--direct" in words else "")
        x = _connections(run["command"])
        if words[0] == "hosts":
            label += f" ({x} connections)"
        # Points of equal connections sit close together: markers and a legend, not labels, tell them apart.
        rate_ax.scatter([x], [run["jobs_per_s"]], zorder=3, marker="osD^vP*X"[i % 8], s=40, label=label)
        if run.get("fault_to_progress_s") is not None:
            gaps.append((words[0], run["fault_to_progress_s"]))
    rate_ax.set(
        xlabel="worker connections (threads over all processes and hosts)",
        ylabel="jobs/s archived",
        yscale="log",
        title="Runs (handler 0.5 ms, shared machine) and the model",
    )
    rate_ax.legend(fontsize=7, loc="lower right")
    if gaps:
        gap_ax.barh([name for name, _ in gaps], [gap for _, gap in gaps])
    gap_ax.set(xlabel="seconds", title="From the crash to the next commit")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def table(directory: Path) -> str:
    """The runs as the Markdown table of docs/scaling.md."""
    lines = [
        "| command | load average | jobs/s | crash to next commit (s) | jobs run twice | archived once |",
        "|---|---|---|---|---|---|",
    ]
    for run in _runs(directory):
        fault = run.get("fault_to_progress_s")
        once = not run["problems"] and run["archived"] == run["jobs_committed"]
        cells = [
            f"`{run['command']}`",
            f"{run['load_average_at_start'][0]:g}",
            f"{run['jobs_per_s']:g}",
            "" if fault is None else f"{fault:g}",
            f"{run['jobs_run_twice']} of {run['jobs_committed']:,}",
            "yes" if once else "NO",
        ]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else REFERENCE
    print(draw(directory, DOCS_CHART))
    print(table(directory))
