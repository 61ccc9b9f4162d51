"""Command line: `python -m benchmarks run [--quick] [--backends ...] [--out DIR]` and `report`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.common import DEFAULT_BACKENDS, BackendSpec, BenchmarkFailure, parse_backends
from benchmarks.settings import ALL_BENCHMARKS, PRESETS

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
    run.add_argument("--no-progress", action="store_true", help="no progress bars (for CI logs)")
    report = commands.add_parser("report", help="re-render results.md and the charts from a results.json")
    report.add_argument("results", type=Path)
    report.add_argument("--out", type=Path, default=None, help="output directory (default: beside the JSON)")
    return parser


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
    )
    if args.rounds is not None:
        settings = settings.with_(throughput_rounds=max(1, args.rounds))
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
