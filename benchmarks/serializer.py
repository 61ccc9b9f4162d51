"""Serializer speed: encode and decode of ordinary payloads of a few sizes, and of deeply nested ones.

    python -m benchmarks.serializer [--seconds 0.2] [--json]

It is also a section of ``python -m benchmarks run`` (once per run, whatever the backends; quick mode
times each call for 0.02 s rather than 0.2 s).

Prints, for each payload, the microseconds of CPU one call takes (best of three timings, each at least
--seconds of CPU): ``encode`` (the default serializer), ``decode`` (plain, the default) and ``decode
exact``. A version that refuses a payload (older ones stop at about 1,000 levels) shows "refused".
``python -m benchmarks.versus REV --serializer`` runs this for REV and the working tree in turns.
The deep payloads' texts are built by string construction, so each version decodes the same text even
where it cannot encode the value.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from benchmarks.common import BackendSpec
    from benchmarks.progress import Progress
    from benchmarks.settings import Settings

REPO: Final = Path(__file__).resolve().parents[1]
OPERATIONS: Final = ("encode", "decode", "decode exact")
REPEATS: Final = 3


def _ordinary(count: int) -> dict[str, Any]:
    """A job payload of the usual shape: a map of scalars and a list of `count` small maps."""
    return {
        "account-id": 918273,
        "email": "someone@example.com",
        "active": True,
        "score": 0.75,
        "items": [{"sku": f"SKU-{n:05}", "quantity": n % 7 + 1, "price": 9.99} for n in range(count)],
    }


def _tagged() -> dict[str, Any]:
    """An ordinary payload with values that take Transit's tags (the general encoder, exact decoding)."""
    from transit.transit_types import Keyword

    return {
        "id": uuid.UUID("5a2cbea3-e8c6-428b-b525-21239370dd55"),
        "at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "status": Keyword("shipped"),
        "tags": {"a", "b"},
        "lines": [{"sku": f"SKU-{n:05}", "quantity": n} for n in range(10)],
    }


def _vectors(levels: int) -> tuple[Any, str]:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value, "[" * levels + "1" + "]" * levels


def _maps(levels: int) -> tuple[Any, str]:
    value: Any = 1
    for _ in range(levels):
        value = {"c": value}
    return value, '["^ ","~:c",' * levels + "1" + "]" * levels


def _sets(levels: int) -> tuple[Any, str]:
    value: Any = 1
    for _ in range(levels):
        value = frozenset({value})
    return value, '["~#set",[' + '["^0",[' * (levels - 1) + "1" + "]]" * levels


def payloads() -> list[tuple[str, Any, str | None]]:
    """(name, value, its text or None to take the encoder's) of every payload measured."""
    ordinary = [
        ("map of 5 scalars", {"account-id": 918273, "email": "someone@example.com", "active": True}, None),
        ("map + 20 maps", _ordinary(20), None),
        ("map + 500 maps", _ordinary(500), None),
        ("tagged values", _tagged(), None),
    ]
    deep = [
        (f"{name} x{levels:,}", *build(levels))
        for name, build, levels in (
            ("vectors", _vectors, 200),
            ("vectors", _vectors, 1_000),
            ("vectors", _vectors, 10_000),
            ("maps", _maps, 1_000),
            ("maps", _maps, 10_000),
            ("sets", _sets, 1_000),
            ("sets", _sets, 10_000),
        )
    ]
    return [*ordinary, *deep]


def _time(call: Callable[[], Any], seconds: float) -> float:
    """Microseconds of CPU a call takes: the best of REPEATS timings of at least `seconds` each.

    CPU time of this process (time.process_time), not wall time: the work is single-threaded, and other
    processes on a shared machine disturb it far less.
    """
    timer = timeit.Timer(call, timer=time.process_time)
    number = 1
    while True:
        elapsed = timer.timeit(number)
        if elapsed >= seconds:
            break
        number = max(number * 2, int(number * seconds / max(elapsed, 1e-9)))
    best = min([elapsed, *timer.repeat(repeat=REPEATS - 1, number=number)])
    return best / number * 1e6


def _bound(function: Callable[[Any], Any], argument: Any) -> Callable[[], Any]:
    return lambda: function(argument)


def measure(seconds: float) -> dict[str, dict[str, float | None]]:
    """For each payload, the microseconds of each operation, None where this version refuses it."""
    from proletarian_ref.errors import ProletarianError
    from proletarian_ref.serializers import TransitSerializer

    plain, exact = TransitSerializer(), TransitSerializer(exact=True)
    results: dict[str, dict[str, float | None]] = {}
    for name, value, given in payloads():
        row: dict[str, float | None] = {}
        text = given
        if text is None:
            text = plain.encode(value)
        calls: dict[str, Callable[[], Any]] = {
            "encode": _bound(plain.encode, value),
            "decode": _bound(plain.decode, text),
            "decode exact": _bound(exact.decode, text),
        }
        for operation, call in calls.items():
            try:
                call()
            except ProletarianError:
                row[operation] = None
                continue
            row[operation] = _time(call, seconds)
        results[name] = row
    return results


def table(results: dict[str, dict[str, float | None]]) -> str:
    lines = ["| payload | " + " | ".join(f"{op} (µs)" for op in OPERATIONS) + " |"]
    lines.append("|---|" + "---:|" * len(OPERATIONS))
    for name, row in results.items():
        cells = ("refused" if row[op] is None else f"{row[op]:,.1f}" for op in OPERATIONS)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    """The section of `python -m benchmarks run`: this version's timings, once per run (no database)."""
    task = progress.task("serializer", 1)
    payload_times = measure(settings.serializer_seconds)
    progress.advance(task)
    progress.done(task)
    return {
        "factory": spec.factory,
        "backend": "no database",
        "seconds": settings.serializer_seconds,
        "repeats": REPEATS,
        "payloads": payload_times,
    }


# --- one version against another (python -m benchmarks.versus REV --serializer) ---------------------


def run_side(tree: Path, seconds: float) -> dict[str, dict[str, float | None]]:
    """This benchmark in a child process that imports the `proletarian_ref` of `tree`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO)]), "PYTHONHASHSEED": "0"}
    # cwd: `python -m` puts the current folder first on sys.path, so `tree`'s package is the one imported.
    command = [sys.executable, "-m", "benchmarks.serializer", "--json", "--seconds", str(seconds)]
    command += ["--expect-tree", str(tree)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"serializer benchmark of {tree} failed: {done.stderr[-2000:]}")
    results: dict[str, dict[str, float | None]] = json.loads(done.stdout)
    return results


def compare(sides: Sequence[tuple[str, Path]], rounds: int, seconds: float) -> dict[str, Any]:
    """Each side's timings, round by round in turns, their medians, and each later side's paired ratio
    of time to the first side's (below 1: faster)."""
    runs: list[dict[str, dict[str, dict[str, float | None]]]] = []
    for n in range(rounds):
        runs.append({label: run_side(tree, seconds) for label, tree in sides})
        print(f"serializer round {n + 1} of {rounds} done", file=sys.stderr, flush=True)
    then = sides[0][0]
    summary: dict[str, Any] = {"rounds": runs, "seconds": seconds, "sides": [label for label, _ in sides]}
    medians: dict[str, dict[str, dict[str, float | None]]] = {}
    ratios: dict[str, dict[str, dict[str, float | None]]] = {}
    for label, _ in sides:
        medians[label], ratios[label] = {}, {}
        for name in runs[0][label]:
            medians[label][name], ratios[label][name] = {}, {}
            for op in OPERATIONS:
                times = [run[label][name][op] for run in runs]
                base = [run[then][name][op] for run in runs]
                medians[label][name][op] = None if None in times else statistics.median(times)  # type: ignore[type-var]
                pairs = [t / b for t, b in zip(times, base, strict=True) if t is not None and b is not None]
                ratios[label][name][op] = statistics.median(pairs) if pairs else None
    summary["medians"], summary["ratios"] = medians, ratios
    return summary


def compare_table(summary: dict[str, Any]) -> str:
    then, *later = summary["sides"]
    lines = [
        f"Serializer, µs of CPU a call (median of {len(summary['rounds'])} rounds in turns, each the best of "
        f"{REPEATS} timings of at least {summary['seconds']} s); ratio = time / {then}'s (below 1: faster)",
        "",
        "| payload | operation | "
        + " | ".join(summary["sides"])
        + " | "
        + " | ".join(f"ratio {label}" for label in later)
        + " |",
        "|---|---|" + "---:|" * (1 + 2 * len(later)),
    ]
    for name in summary["medians"][then]:
        for op in OPERATIONS:
            cells = []
            for label in summary["sides"]:
                time_us = summary["medians"][label][name][op]
                cells.append("refused" if time_us is None else f"{time_us:,.1f}")
            for label in later:
                ratio = summary["ratios"][label][name][op]
                cells.append("" if ratio is None else f"{ratio:.2f}")
            lines.append(f"| {name} | {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serializer", description=__doc__)
    parser.add_argument("--seconds", type=float, default=0.2, help="least duration of one timing")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--expect-tree", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import proletarian_ref

    if args.expect_tree is not None and not proletarian_ref.__file__.startswith(str(args.expect_tree)):
        print(f"imported {proletarian_ref.__file__}, not the package in {args.expect_tree}", file=sys.stderr)
        return 2
    results = measure(args.seconds)
    print(json.dumps(results) if args.json else table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
