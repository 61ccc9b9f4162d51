"""`python -m benchmarks.scale SCENARIO [--jobs N]`: the measured scale-out runs of docs/scaling.md.

Each scenario starts its own engines (the tests' fixtures in tests/fix_cluster.py, so the checkout and
the `test` extra are needed), runs enqueuers and workers with tests' checks, and prints its figures as
JSON with the command that made them. It exits 1 if a promise failed (a job lost or archived twice).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from benchmarks.scale.patroni import FAULTS as PATRONI_FAULTS
from benchmarks.scale.patroni import UNFENCED
from benchmarks.scale.scenario import Outcome, run_load

TESTS_DIR = Path(__file__).resolve().parents[2] / "tests"
# patroni: jobs per access path and per fault (each fault is a round of its own).
PATRONI_JOBS = 800


def _fixtures() -> Any:
    """tests/fix_cluster.py and tests/fix_throwaway.py, imported as the tests import them."""
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    import fix_cluster
    import fix_throwaway

    return fix_cluster, fix_throwaway


def _harness(factory: str, dsn: str, name: str) -> Any:
    from conformance.harness import load_harness

    table = f"proletarian.scale_bench_{name}" if factory.endswith("mysql") else f"scale_bench_{name}"
    harness = load_harness(factory, dsn=dsn, job_table=f"{table}_job", archived_job_table=f"{table}_archived")
    harness.install()
    harness.clear()
    return harness


def pg_failover(args: argparse.Namespace) -> Outcome:
    from proletarian_ref.backends.dsn import connection_factory

    fix_cluster, _ = _fixtures()
    with fix_cluster.started_pg_pair() as pair:
        harness = _harness("conformance.builtin:postgresql", pair.dsn, "failover")
        source = connection_factory(pair.dsn)

        def fail_over() -> None:
            pair.primary.stop("immediate")
            pair.standby.promote()

        return run_load(
            harness,
            jobs=args.jobs,
            worker_sources=[source] * args.workers,
            threads=args.threads,
            enqueue_connects=[source] * args.enqueuers,
            fault=fail_over,
            timeout_s=args.timeout,
        )


def _galera(args: argparse.Namespace, *, spread: bool) -> Outcome:
    from proletarian_ref.backends.dsn import connection_factory, failover_connection_factory

    fix_cluster, _ = _fixtures()
    with fix_cluster.started_galera() as cluster:
        dsns = cluster.dsns
        if spread:
            harness = _harness("conformance.builtin:mysql", dsns[0], "spread")
            sources = [connection_factory(dsn) for dsn in dsns]
            return run_load(
                harness,
                jobs=args.jobs,
                worker_sources=[sources[w % len(sources)] for w in range(args.workers)],
                threads=args.threads,
                enqueue_connects=[sources[e % len(sources)] for e in range(args.enqueuers)],
                timeout_s=args.timeout,
            )
        harness = _harness("conformance.builtin:mysql", dsns[1], "one_writer")
        source = failover_connection_factory(dsns, connect_timeout=2)
        return run_load(
            harness,
            jobs=args.jobs,
            worker_sources=[source] * args.workers,
            threads=args.threads,
            enqueue_connects=[source] * args.enqueuers,
            fault=None if args.no_fault else (lambda: cluster.nodes[0].stop("immediate")),
            timeout_s=args.timeout,
        )


def pgbouncer(args: argparse.Namespace) -> Outcome:
    from proletarian_ref.backends.dsn import connection_factory

    fix_cluster, fix_throwaway = _fixtures()
    bindir = fix_throwaway._pg_bindir()
    if bindir is None:
        raise fix_cluster.MissingTool("PostgreSQL server binaries")
    root = Path(tempfile.mkdtemp(prefix="scale_bench_pg_"))
    server = fix_throwaway.ThrowawayPostgres(root, fix_throwaway.free_port(), bindir)
    try:
        server.start()
        manager: AbstractContextManager[Any] = fix_cluster.started_pgbouncer(server)
        with manager as bouncer:
            dsn = (bouncer.dsn if not args.direct else server.dsn) + "?prepare_threshold=none"
            harness = _harness("conformance.builtin:postgresql", dsn, "pgbouncer")
            source = connection_factory(dsn)
            return run_load(
                harness,
                jobs=args.jobs,
                worker_sources=[source] * args.workers,
                threads=args.threads,
                enqueue_connects=[source] * args.enqueuers,
                timeout_s=args.timeout,
            )
    finally:
        server.destroy()


def hosts(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.scale.hosts import make_hosts, run_hosts
    from proletarian_ref.backends.dsn import connection_factory

    fix_cluster, _ = _fixtures()
    with (
        make_hosts(args.hosts) as made,
        fix_cluster.started_network_pg(made.server_addresses) as server,
        tempfile.TemporaryDirectory() as work,
    ):
        harness = _harness("conformance.builtin:postgresql", server.dsn, "hosts")
        enqueue = connection_factory(server.dsn)
        result = run_hosts(
            harness,
            made,
            dsn_for=lambda host: f"postgresql://postgres@{host.server_address}:{server.port}/postgres",
            server_dsn=server.dsn,
            jobs=args.jobs,
            processes=args.workers,
            threads=args.threads,
            enqueue_connects=[enqueue] * args.enqueuers,
            work_dir=Path(work),
            timeout_s=args.timeout,
        )
        figures: dict[str, Any] = result.figures()
        return figures


def patroni(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.scale.patroni import run_rounds

    _fixtures()
    import fix_patroni

    with fix_patroni.started_patroni() as cluster:
        figures: dict[str, Any] = run_rounds(
            cluster, args.faults.split(","), jobs=args.jobs, timeout_s=args.timeout
        )
        return figures


SCENARIOS: dict[str, Callable[[argparse.Namespace], Outcome]] = {
    "pg-failover": pg_failover,
    "galera-one-writer": lambda args: _galera(args, spread=False),
    "galera-spread": lambda args: _galera(args, spread=True),
    "pgbouncer": pgbouncer,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("scenario", choices=sorted([*SCENARIOS, "hosts", "patroni"]))
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=f"jobs (default 10,000; patroni: {PATRONI_JOBS} per path and fault)",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="queue workers (in this process; hosts: processes per host)"
    )
    parser.add_argument("--hosts", type=int, default=4, help="hosts: network namespaces")
    parser.add_argument("--threads", type=int, default=3, help="threads per worker")
    parser.add_argument("--enqueuers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-fault", action="store_true", help="galera-one-writer: kill no node")
    parser.add_argument("--direct", action="store_true", help="pgbouncer: the same run without the bouncer")
    parser.add_argument(
        "--faults",
        default=",".join(PATRONI_FAULTS),
        help=f"patroni: faults in turn, of {', '.join((*PATRONI_FAULTS, UNFENCED))} (its load per path is "
        "fixed: --workers, --threads and --enqueuers do not apply)",
    )
    args = parser.parse_args(argv)
    unknown = [f for f in args.faults.split(",") if f not in (*PATRONI_FAULTS, UNFENCED)]
    if args.scenario == "patroni" and unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}")
    if args.jobs is None:
        args.jobs = PATRONI_JOBS if args.scenario == "patroni" else 10_000
    whole: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {"hosts": hosts, "patroni": patroni}
    if args.scenario in whole:
        figures = whole[args.scenario](args)
    else:
        figures = SCENARIOS[args.scenario](args).figures()
    command = "python -m benchmarks.scale " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(json.dumps({"command": command, **figures}, indent=2))
    return 0 if not figures["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
