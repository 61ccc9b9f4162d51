"""Command line: `python -m benchmarks run [--quick] [--backends ...] [--out DIR]` and `report`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import DEFAULT_BACKENDS, BackendSpec, BenchmarkFailure, parse_backends
from benchmarks.settings import ALL_BENCHMARKS, PRESETS, Settings

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the benchmarks and write results.json, results.md and charts")
    size = run.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_const", dest="mode", const="quick", help="CI mode, under 2 minutes"
    )
    size.add_argument(
        "--tiny", action="store_const", dest="mode", const="tiny", help="smoke-test sizes (seconds)"
    )
    run.set_defaults(mode="full")
    run.add_argument(
        "--backends",
        default=",".join(DEFAULT_BACKENDS),
        help="comma-separated backend factories, as for the conformance suite (module:callable); "
        f"default: {','.join(DEFAULT_BACKENDS)}",
    )
    run.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument passed to every backend factory (e.g. dsn=postgresql://...); repeatable",
    )
    run.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})"
    )
    run.add_argument(
        "--only", default="", help=f"comma-separated subset of: {', '.join(ALL_BENCHMARKS)} (default: all)"
    )
    run.add_argument("--no-profile", action="store_true", help="skip the cProfile of the per-job paths")
    run.add_argument(
        "--table-suffix", default="", help="appended to the bench_ table names, to keep concurrent runs apart"
    )
    run.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="throughput's interleaved rounds per configuration (default: the mode's)",
    )
    for name, what in (
        ("processes", "consumer processes per system"),
        ("connections", "consumer connections per process"),
        ("jobs", "jobs per drain"),
    ):
        run.add_argument(
            f"--peers-{name}", type=int, default=None, help=f"peers: {what} (default: the mode's)"
        )
    run.add_argument(
        "--limit-points",
        default=None,
        metavar="PxT[xN],...",
        help="throughput: drain only these (processes, threads, jobs a commit) rows, each with its server "
        "limit drain (e.g. 1x4,4x4,1x4x10; N > 1 is batch mode at the mode's batch size)",
    )
    run.add_argument(
        "--server-cores",
        action="store_true",
        help="throughput: the database on cores of its own, as on a host of its own: the clients (drains, "
        "pgbench, mariadb-slap) on the first half of the CPUs, the server side of their connections on "
        "the rest (benchmarks/server_cores.py)",
    )
    run.add_argument(
        "--due-apart-ms",
        type=float,
        default=None,
        help="throughput: how far apart in process_at the queue's due jobs are loaded, in milliseconds "
        "(default 1; on MySQL 1000 gives each job a second of its own)",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bars (for CI logs)")
    report = commands.add_parser("report", help="re-render results.md and the charts from a results.json")
    report.add_argument("results", type=Path)
    report.add_argument("--out", type=Path, default=None, help="output directory (default: beside the JSON)")
    return parser


def limit_points_settings(settings: Settings, text: str) -> Settings:
    """`settings` whose throughput drains only the rows `text` names ("1x4,4x4,1x4x10"), all limit points."""
    points: list[tuple[int, int, int]] = []
    for item in (part.strip() for part in text.split(",")):
        numbers = item.split("x")
        if len(numbers) not in (2, 3) or not all(n.isdigit() and int(n) > 0 for n in numbers):
            raise ValueError(f"{item!r} is not PxT or PxTxN with positive whole numbers")
        processes, threads, *per_commit = (int(n) for n in numbers)
        batch = per_commit[0] if per_commit else 1
        if batch not in (1, settings.batch_size):
            raise ValueError(f"{item!r}: jobs a commit must be 1 or the batch size, {settings.batch_size}")
        points.append((processes, threads, batch))
    return settings.with_(
        limit_points=tuple(points),
        thread_counts=tuple(t for p, t, b in points if p == 1 and b == 1),
        process_configs=tuple((p, t) for p, t, b in points if p > 1 and b == 1),
        batch_configs=tuple((p, t) for p, t, b in points if b > 1),
    )


def main(argv: list[str] | None = None) -> int:
    # Imported here, not above: every spawned drain process imports this module again as its main, and
    # needs neither matplotlib nor rich.
    from benchmarks.progress import Progress, RichProgressDisplay
    from benchmarks.report import write

    args = _parser().parse_args(argv)
    if args.command == "report":
        results = json.loads(args.results.read_text(encoding="utf-8"))
        for path in write(results, args.out or args.results.parent).values():
            print(path)
        return 0
    from benchmarks.runner import run_all

    settings = PRESETS[args.mode]
    only = tuple(n.strip() for n in args.only.split(",") if n.strip())
    unknown = sorted(set(only) - set(ALL_BENCHMARKS))
    if unknown:
        print(f"unknown benchmarks {unknown}; choose from {', '.join(ALL_BENCHMARKS)}", file=sys.stderr)
        return 2
    options = dict(o.split("=", 1) for o in args.option)
    backends = [BackendSpec(b.factory, options) for b in parse_backends(args.backends)]
    settings = settings.with_(
        benchmarks=only or settings.benchmarks,
        profile=settings.profile and not args.no_profile,
        table_suffix=args.table_suffix,
        server_cores=args.server_cores,
    )
    if args.rounds is not None:
        settings = settings.with_(throughput_rounds=max(1, args.rounds))
    if args.due_apart_ms is not None:
        if not args.due_apart_ms > 0:
            print(f"--due-apart-ms: must be more than 0, got {args.due_apart_ms}", file=sys.stderr)
            return 2
        settings = settings.with_(throughput_due_apart_ms=args.due_apart_ms)
    if args.limit_points is not None:
        try:
            settings = limit_points_settings(settings, args.limit_points)
        except ValueError as exc:
            print(f"--limit-points: {exc}", file=sys.stderr)
            return 2
    for name in ("processes", "connections", "jobs"):
        value = getattr(args, f"peers_{name}")
        if value is not None:
            settings = settings.with_(**{f"peers_{name}": max(1, value)})
    progress: Progress = Progress() if args.no_progress else RichProgressDisplay()
    try:
        with progress:
            results = run_all(backends, settings, args.out, progress)
    except BenchmarkFailure as failure:
        print(f"\nFAILED: {failure}\n(results written to {args.out})", file=sys.stderr)
        return 1
    print((args.out / "results.md").read_text(encoding="utf-8"))
    print(f"results: {args.out} ({results['duration_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
