"""Client instructions per job, library against the raw loop, counted by valgrind: nearly free of noise.

    python -m benchmarks.instructions [--backends module:factory,...] [--jobs 500] [--table-suffix _me]

Throughput on a shared machine moves by 10-20% from one second to the next; the instructions the client
executes per job move by about 1% (Python seeds its string hashing anew in each process). Each path runs
in a child process under `valgrind --tool=callgrind` twice, with a few jobs and with `--jobs` more, so
that start-up cancels out of the difference. The database servers run outside valgrind, so only the
client's own work is counted: the library's Python and the driver's.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys

from benchmarks.common import (
    DEFAULT_BACKENDS,
    BackendSpec,
    analyze,
    bulk_load,
    closing_harness,
    open_harness,
    parse_backends,
    truncate,
)
from benchmarks.profiling import OneJob

BASE_JOBS = 50
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def run_jobs(spec: BackendSpec, mode: str, jobs: int, suffix: str = "") -> None:
    """Claim, run and archive `jobs` jobs one at a time with the library or the raw loop."""
    harness = open_harness(spec, "instr", f"_{mode}{suffix}")
    with closing_harness(harness):
        bulk_load(harness, 0, jobs + 1, "due")
        analyze(harness)
        one_job = OneJob(harness)
        once = one_job.library if mode == "library" else one_job.raw
        try:
            for _ in range(jobs + 1):
                if not once():
                    raise RuntimeError(f"{mode}: ran out of jobs")
        finally:
            one_job.close()
        truncate(harness)


def _count(spec: BackendSpec, mode: str, jobs: int, suffix: str = "") -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "benchmarks.instructions",
        "--child",
        json.dumps(
            {"factory": spec.factory, "options": spec.options, "mode": mode, "jobs": jobs, "suffix": suffix}
        ),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    match = COLLECTED.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"valgrind run of {spec.factory} {mode} failed:\n{done.stderr[-2000:]}")
    return int(match.group(1))


def per_job(spec: BackendSpec, mode: str, jobs: int, suffix: str = "") -> float:
    return (_count(spec, mode, BASE_JOBS + jobs, suffix) - _count(spec, mode, BASE_JOBS, suffix)) / jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    parser.add_argument("--backends", default=",".join(DEFAULT_BACKENDS))
    parser.add_argument("--jobs", type=int, default=500, help="jobs counted per path (default: 500)")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument passed to every backend factory (e.g. dsn=postgresql://...); repeatable",
    )
    parser.add_argument(
        "--table-suffix",
        default="",
        help="appended to the bench tables' names, so concurrent runs never share (or truncate) a table",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        task = json.loads(args.child)
        run_jobs(
            BackendSpec(task["factory"], task["options"]), task["mode"], task["jobs"], task.get("suffix", "")
        )
        return 0
    options = dict(item.split("=", 1) for item in args.option)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind); nothing was counted")
        return 2
    print("| backend | library instructions/job | raw instructions/job | library / raw | raw / library |")
    print("|---|---|---|---|---|")
    for parsed in parse_backends(args.backends):
        spec = BackendSpec(parsed.factory, {**parsed.options, **options})
        library = per_job(spec, "library", args.jobs, args.table_suffix)
        raw = per_job(spec, "raw", args.jobs, args.table_suffix)
        print(f"| {spec.factory} | {library:,.0f} | {raw:,.0f} | {library / raw:.2f} | {raw / library:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
