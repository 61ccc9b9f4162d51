"""Jobs per second, no-op handler, 1..8 threads and several processes, against the raw-loop ceiling."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from benchmarks.async_drain import (
    ASYNC_CHAIN_BACKENDS,
    ASYNC_PIPELINE_BACKEND,
    async_skip_reason,
    uvloop_skip_reason,
)
from benchmarks.common import (
    DUE_APART,
    DUE_WITHIN,
    BackendSpec,
    BenchmarkFailure,
    analyze,
    bulk_load,
    closing_harness,
    count_rows,
    open_harness,
    require_sql,
    sql_dialect,
    truncate,
)
from benchmarks.costs import RoundTrips, ServerCpu, client_cpu_s, server_cpu_reason
from benchmarks.profiling import profile_paths
from benchmarks.progress import Progress
from benchmarks.server_ceiling import pgbench_rate, pgbench_skip_reason
from benchmarks.server_cores import server_cores
from benchmarks.server_limit import limit_rate, limit_skip_reason
from benchmarks.settings import Settings
from benchmarks.workers import DrainRun, Mode, measure_rate, processes_skip_reason, raw_skip_reason
from conformance.harness import Harness

# The target: our worker reaches this fraction of the raw driver's loop at the same concurrency.
TARGET_RATIO = 0.9
# Jobs a second no server reaches with one job a transaction (this machine: about 3,500 at 8 connections).
PGBENCH_JOBS_PER_S_BOUND = 30_000


class QueueFiller:
    """Keeps enough due jobs in the queue so no measurement window can run it dry, reloading only when low."""

    def __init__(self, harness: Harness, size: int, apart: timedelta = DUE_APART) -> None:
        self.harness = harness
        self.size = size
        self._apart = apart
        self._next = 0

    def top_up(self, at_least: int = 0) -> None:
        """Reload the queue below half full (or below `at_least`); leave it vacuumed for the next drain."""
        remaining = count_rows(self.harness)
        target = max(self.size, at_least)
        if remaining < max(self.size // 2, at_least):
            stop = self._next + target - remaining
            if stop * self._apart >= DUE_WITHIN:
                # Rows past it would be due only in the future: drains of them would measure waiting.
                raise BenchmarkFailure(
                    f"{stop:,} rows {self._apart} apart reach past the {DUE_WITHIN.days} days bulk_load's "
                    "due rows start before now: load them closer together (--due-apart-ms)"
                )
            bulk_load(self.harness, self._next, stop, "due", apart=self._apart)
            self._next = stop
        analyze(self.harness, vacuum=True)


def paired_ratios(row: dict[str, Any], mode: str = "library", over: str = "raw") -> list[float]:
    """`mode` over `over` jobs per second, round by round (empty without rounds of both): by default
    the library over the raw loop."""
    pairs = zip(row.get(f"{mode}_rounds", []), row.get(f"{over}_rounds", []), strict=False)
    return [lib["jobs_per_s"] / raw["jobs_per_s"] for lib, raw in pairs if raw["jobs_per_s"] > 0]


def drain_order(modes: list[str], round_: int) -> list[str]:
    """The order of a round's drains: `modes` (the library right after compact), reversed every other
    round so that drift in a shared machine's load (other tests, the disk's fsync queue) falls on both sides
    alike. With the library in the middle, each paired ratio (library / raw, compact / library) is of two
    drains back to back, whichever way the round runs."""
    return list(modes) if round_ % 2 == 0 else list(modes[::-1])


# The built-in factories whose compact and chained twins are named <factory>_compact and <factory>_chain (on
# PostgreSQL <factory>_pipeline_chain): MySQL's on either driver, PyMySQL or mysqlclient.
_BUILTIN_SQL: Final = (
    "conformance.builtin:postgresql",
    "conformance.builtin:mysql",
    "conformance.builtin:mysqlclient",
)


def compact_spec(spec: BackendSpec) -> BackendSpec | None:
    """The built-in backend on its compact statement plan (conformance.builtin:<name>_compact), else None."""
    if spec.factory in _BUILTIN_SQL:
        return BackendSpec(f"{spec.factory}_compact", spec.options)
    return None


def pipeline_spec(spec: BackendSpec) -> BackendSpec | None:
    """The built-in PostgreSQL backend on Proletarian's exact plan pipelined (conformance.builtin:
    postgresql_pipeline: the same five statements, BEGIN with the claim and the archive with the delete,
    three exchanges a job), measured against pgbench of those statements (issue 31's 0.95 bar), else None."""
    if spec.factory == "conformance.builtin:postgresql":
        return BackendSpec(f"{spec.factory}_pipeline", spec.options)
    return None


def _row_modes(
    modes: list[str],
    *,
    compact: bool,
    chain: bool,
    asyncio: bool,
    async_chain: bool,
    pipeline: bool = False,
    async_pipeline: bool = False,
    async_chain_uvloop: bool = False,
) -> list[str]:
    """A row's drains in round order (drain_order): the library between compact and raw, each pair of
    drains back to back; chain first, the exact plan pipelined after raw, the asyncio ones last, the
    asyncio chain on uvloop's loop right after it on asyncio's."""
    return [
        *(["chain"] if chain else []),
        *(["compact"] if compact else []),
        *modes,
        *(["pipeline"] if pipeline else []),
        *(["async"] if asyncio else []),
        *(["async_chain"] if async_chain else []),
        *(["async_chain_uvloop"] if async_chain_uvloop else []),
        *(["async_pipeline"] if async_pipeline else []),
    ]


def chain_spec(spec: BackendSpec) -> BackendSpec | None:
    """The built-in backend on the compact plan with chained claims, one round trip a job, else None: on
    PostgreSQL pipelined (conformance.builtin:postgresql_pipeline_chain: a finished job's archive, its
    COMMIT, the next BEGIN and the next claim in one exchange), on MySQL as one multi-statement query
    (conformance.builtin:mysql_chain: the archive and delete, each checked, COMMIT and the next claim; on
    mysqlclient, mysqlclient_chain)."""
    if spec.factory == "conformance.builtin:postgresql":
        return BackendSpec(f"{spec.factory}_pipeline_chain", spec.options)
    if spec.factory in _BUILTIN_SQL:
        return BackendSpec(f"{spec.factory}_chain", spec.options)
    return None


def pgbench_ratios(row: dict[str, Any]) -> list[float]:
    """Library over pgbench jobs per second, round by round (empty without pgbench rounds)."""
    pairs = zip(row.get("library_rounds", []), row.get("pgbench_rounds", []), strict=False)
    return [lib["jobs_per_s"] / bench["jobs_per_s"] for lib, bench in pairs if bench["jobs_per_s"] > 0]


def pgbench_drain(filler: QueueFiller, connections: int, settings: Settings) -> dict[str, Any]:
    """pgbench's rate for Proletarian's transaction at `connections`, on the (topped-up) same queue."""
    # pgbench counts whole seconds; its first second has no warm-up to discard, as it prepares once.
    seconds = max(1, round(settings.throughput_window_s))
    # A pgbench client whose claim finds no row aborts the run, and pgbench cannot stop at a count the way
    # the drains do: the queue holds more than the fastest server here could drain in that time.
    filler.top_up(at_least=PGBENCH_JOBS_PER_S_BOUND * seconds)
    return pgbench_rate(require_sql(filler.harness)[0], connections, seconds)


# A first guess at the server's limit, jobs a second, to size the queue before it was measured once.
LIMIT_FIRST_GUESS_JOBS_PER_S = {1: 15_000, 10: 60_000}


def limit_drain(
    filler: QueueFiller, connections: int, per_commit: int, settings: Settings, last: dict[int, float]
) -> dict[str, Any]:
    """The server's own limit for the whole job at `connections`, `per_commit` jobs a transaction, on the
    (topped-up) same queue; `last` keeps each per_commit's latest rate to size the next queue and calls."""
    seconds = max(1.0, round(settings.throughput_window_s))
    if per_commit not in last and sql_dialect(filler.harness) == "mysql":
        # mysqlslap runs a fixed number of calls, not a time: a short first drain (ten calls a
        # connection) sizes the measured one, which a guess could make last a minute on a slow server.
        filler.top_up()
        last[per_commit] = max(
            limit_rate(filler.harness, connections, per_commit, seconds, 0)["jobs_per_s"], 1.0
        )
    for _attempt in range(3):
        guess = last.get(per_commit) or LIMIT_FIRST_GUESS_JOBS_PER_S.get(per_commit, 60_000)
        filler.top_up(at_least=int(2 * guess * seconds) + 1000)
        result = limit_rate(filler.harness, connections, per_commit, seconds, guess)
        last[per_commit] = max(result["jobs_per_s"], 1.0)
        if not result["ran_dry"]:
            return result
        # The queue ran out before the time did: this rate is the load's; again with twice the rows.
        last[per_commit] = 2 * guess
    raise RuntimeError(f"the server's limit ran its queue dry three times at {connections} connections")


def server_drains(
    row: dict[str, Any],
    filler: QueueFiller,
    settings: Settings,
    *,
    limit: dict[int, float] | bool,
    pgbench: bool,
    tick: Callable[[str], None],
    done: Callable[[], None],
) -> None:
    """A round's drains without Python: the server's limit (when `limit` is the latest-rate memo) at the
    row's jobs a commit, and pgbench of Proletarian's statements (when `pgbench`)."""
    connections, per_commit = row["concurrency"], row.get("batch_size", 1)
    if isinstance(limit, dict):
        tick(f"{connections} server limit x{per_commit}")
        row.setdefault("limit_rounds", []).append(
            limit_drain(filler, connections, per_commit, settings, limit)
        )
        done()
    if pgbench:
        tick(f"{connections} pgbench")
        row.setdefault("pgbench_rounds", []).append(pgbench_drain(filler, connections, settings))
        done()


def drain_rate(
    filler: QueueFiller,
    spec: BackendSpec,
    mode: Mode,
    processes: int,
    threads: int,
    settings: Settings,
    batch_size: int = 1,
    harness: Harness | None = None,
) -> dict[str, Any]:
    """Drain the (topped-up) queue with `processes` x `threads` and return the measured window.

    `batch_size` > 1 runs the library's worker (threaded or asyncio) in batch mode; the raw loop is one job
    a transaction always.
    `harness` (with `spec` its factory) is another harness of the filler's tables to drain them with.
    """
    filler.top_up()
    run = DrainRun(
        harness or filler.harness,
        spec,
        mode,
        processes,
        threads,
        settings.polling_interval_ms,
        batch_size=batch_size if mode != "raw" else 1,
    )
    drained = harness or filler.harness
    trips = RoundTrips()
    server: list[ServerCpu] = []
    reads = 0

    def costs() -> dict[str, float]:
        nonlocal reads
        # Read at the first job and at the window's edges (measure_rate). The drain's connections are looked
        # for at the first two readings: by the window's start every thread has claimed, and its connection
        # is counted from there at the latest, as when it was first looked for there.
        found = {"client_cpu_us": client_cpu_s(run.pids) * 1e6}
        if not server and server_cpu_reason(drained) is None:
            server.append(ServerCpu(drained, run.pids))
        elif server and reads == 1:
            server[0].find()
        reads += 1
        if server and server[0].reason is None:
            found["server_cpu_us"] = server[0].seconds() * 1e6
        if processes == 1:
            found["round_trips"] = float(trips.count)
        return found

    try:
        with trips.installed() if processes == 1 else contextlib.nullcontext(trips):
            return measure_rate(
                run,
                count_rows(filler.harness),
                settings.throughput_warmup_s,
                settings.throughput_window_s,
                costs,
            )
    finally:
        run.stop()


def summarize(row: dict[str, Any], modes: list[str]) -> None:
    """Add a measured row's medians and paired ratios to it."""
    for mode in modes:
        row[f"{mode}_jobs_per_s"] = statistics.median(r["jobs_per_s"] for r in row[f"{mode}_rounds"])
    compact_ratios = paired_ratios(row, "compact", "library")
    if compact_ratios:
        # Compact over plain, each round's two drains back to back, as library over raw.
        row["compact_round_ratios"] = [round(r, 3) for r in compact_ratios]
        row["compact_ratio"] = statistics.median(compact_ratios)
    ratios = paired_ratios(row)
    if ratios:
        # Each round's library drain ran next to its raw drain, so their ratio is free of the drift
        # between rounds that a shared machine's load brings; the median of those is the figure.
        row["round_ratios"] = [round(r, 3) for r in ratios]
        row["ratio"] = statistics.median(ratios)
        row["pass"] = row["ratio"] >= TARGET_RATIO
    if row.get("limit_rounds"):
        row["limit_jobs_per_s"] = statistics.median(r["jobs_per_s"] for r in row["limit_rounds"])
        for mode in modes:
            ratios = paired_ratios(row, mode, "limit")
            if ratios:
                # Library rows in batch mode run against the limit at the same jobs a commit.
                row[f"{mode}_ratio_limit"] = statistics.median(ratios)
        if row.get("pgbench_rounds"):
            row["pgbench_ratio_limit"] = statistics.median(paired_ratios(row, "pgbench", "limit"))
    # The limit's tool (pgbench, mariadb-slap) and the server serving it are measured as a drain is.
    for mode in (*modes, *(["limit"] if row.get("limit_rounds") else [])):
        per_job = [r["per_job"] for r in row[f"{mode}_rounds"] if "per_job" in r]
        for key in sorted({k for p in per_job for k in p}):
            row[f"{mode}_{key}_per_job"] = statistics.median(p[key] for p in per_job if key in p)
    if row.get("pgbench_rounds"):
        row["pgbench_jobs_per_s"] = statistics.median(r["jobs_per_s"] for r in row["pgbench_rounds"])
        row["ratio_pgbench"] = statistics.median(pgbench_ratios(row))
        # The exact plan pipelined, threaded and asyncio, against pgbench of the same statements, round by
        # round.
        for mode in ("pipeline", "async_pipeline"):
            if row.get(f"{mode}_rounds"):
                row[f"{mode}_ratio_pgbench"] = statistics.median(paired_ratios(row, mode, "pgbench"))
    if row.get("async_chain_uvloop_rounds") and row.get("async_chain_rounds"):
        # The same worker and plan on uvloop's loop over asyncio's, the two drains back to back each round.
        row["uvloop_ratio"] = statistics.median(paired_ratios(row, "async_chain_uvloop", "async_chain"))


def drain_plans(
    spec: BackendSpec,
    harness: Harness,
    compact: BackendSpec | None,
    stack: contextlib.ExitStack,
    chain: BackendSpec | None = None,
    pipeline: BackendSpec | None = None,
) -> dict[str, tuple[Mode, BackendSpec, Harness]]:
    """Each drain a row may run: its mode, the factory a child process rebuilds, the harness it drains."""
    plans: dict[str, tuple[Mode, BackendSpec, Harness]] = {
        "library": ("library", spec, harness),
        "raw": ("raw", spec, harness),
        # The asyncio worker makes its own backend (async_drain.async_backend) from the harness's DSN.
        "async": ("async", spec, harness),
        "async_chain": ("async_chain", spec, harness),
        "async_chain_uvloop": ("async_chain_uvloop", spec, harness),
        "async_pipeline": ("async_pipeline", spec, harness),
    }
    # The library again on another plan, at one job a transaction: the same tables under the built-in
    # factory's twin (_compact: compact=True; _chain: compact=True, chain=True; _pipeline: pipeline=True),
    # so child processes can rebuild it.
    for name, twin in (("compact", compact), ("chain", chain), ("pipeline", pipeline)):
        if twin is not None:
            twin_harness = twin.load(harness.job_table, harness.archived_job_table)
            stack.callback(twin_harness.close)
            plans[name] = ("library", twin, twin_harness)
    return plans


def _result(
    harness: Harness,
    spec: BackendSpec,
    rows: list[dict[str, Any]],
    skipped: dict[str, str | None],
    cores: dict[str, Any] | None,
    chain: BackendSpec | None,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "backend": harness.name,
        "factory": spec.factory,
        "target_ratio": TARGET_RATIO,
        "rows": rows,
    }
    if chain is not None:
        # What the chain drains ran on: the report says so (a run before this key drained unpipelined, one
        # before async_chain_backend drained the asyncio chain on asyncpg, and before limit15 MySQL's
        # entry named PostgreSQL's and drained no asyncio chain).
        result["chain_factory"] = chain.factory
        result["async_chain_backend"] = ASYNC_CHAIN_BACKENDS[harness.dialect]
    if any("async_pipeline_rounds" in row for row in rows):
        result["async_pipeline_backend"] = ASYNC_PIPELINE_BACKEND
    if cores is not None:
        result["server_cores"] = cores
    result.update((key, reason) for key, reason in skipped.items() if reason)
    return result


def _limit_drain_points(
    settings: Settings,
    limit_reason: str | None,
    async_reason: str | None,
    *,
    chain: bool,
    pipeline: bool,
    uvloop_reason: str | None = None,
) -> dict[str, set[tuple[int, int, int]]]:
    """The (processes, threads, jobs a commit) points each extra drain runs at, by drain."""
    # The server's limit for the whole job (claim, archive, delete inside the server), at the
    # configurations of settings.limit_points, the row's jobs a commit.
    limit = set() if limit_reason else set(settings.limit_points)
    # The asyncio worker (asyncpg or aiomysql, compact plan) drains each limit point too, when enabled.
    asyncio = limit if settings.throughput_async and not async_reason else set()
    # Chained claims, threaded and asyncio, drain the limit points: one job a commit, and batch mode's
    # chained batches (ChainedBatchClaim) at the batch points.
    chained = set(limit) if chain else set()
    # Proletarian's exact plan pipelined, beside pgbench of its statements: one job a commit.
    pipelined = {point for point in limit if point[2] == 1} if pipeline else set()
    return {
        "limit": limit,
        "async": asyncio,
        "chain": chained,
        "async_chain": chained & asyncio,
        # The asyncio chain again on uvloop's event loop (`worker --loop uvloop`), where it is installed.
        "async_chain_uvloop": set() if uvloop_reason else chained & asyncio,
        "pipeline": pipelined,
        # The same plan on the asyncio worker (the backend's own exchanges), beside the same pgbench.
        "async_pipeline": pipelined & asyncio,
    }


def _async_reasons(harness: Harness, settings: Settings) -> tuple[str | None, str | None]:
    """Why the asyncio drains cannot run on `harness` (None when they can, or are not asked for), and why
    they cannot run on uvloop's loop too."""
    if not settings.throughput_async:
        return None, None
    async_reason = async_skip_reason(harness)
    return async_reason, None if async_reason else uvloop_skip_reason()


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    harness = open_harness(spec, "tput", settings.table_suffix)
    with closing_harness(harness), contextlib.ExitStack() as stack:
        # Filled in as the block ends (how many backends or threads moved), before the result is read.
        cores = stack.enter_context(server_cores(harness)) if settings.server_cores else None
        # (processes, threads, batch_size): Proletarian's one job a transaction, then batch mode's rows,
        # whose ratio compares batch mode with the raw loop's one job a transaction at that concurrency.
        configs = [(1, t, 1) for t in settings.thread_counts] + [
            (p, t, 1) for p, t in settings.process_configs
        ]
        configs += [(p, t, settings.batch_size) for p, t in settings.batch_configs]
        raw_reason = raw_skip_reason(harness)
        proc_reason = processes_skip_reason(harness)
        modes: list[str] = ["library"] if raw_reason else ["library", "raw"]
        compact = compact_spec(spec)
        chain = chain_spec(spec)
        # The server's ceiling (PostgreSQL): pgbench at the same connections, one job a transaction only.
        pgbench_reason = pgbench_skip_reason(harness)
        pipeline = None if pgbench_reason else pipeline_spec(spec)
        plans = drain_plans(spec, harness, compact, stack, chain, pipeline)
        limit_reason = limit_skip_reason(harness)
        async_reason, uvloop_reason = _async_reasons(harness, settings)
        points = _limit_drain_points(
            settings,
            limit_reason,
            async_reason,
            chain=chain is not None,
            pipeline=pipeline is not None,
            uvloop_reason=uvloop_reason,
        )
        limit_points = points["limit"]
        last_limit: dict[int, float] = {}
        single = sum(1 for *_, batch in configs if batch == 1)
        drains = len(configs) * len(modes) + (0 if pgbench_reason else single)
        drains += (single if compact is not None else 0) + sum(
            config in drained for config in configs for drained in points.values()
        )
        task = progress.task(f"{harness.name}: throughput", drains * settings.throughput_rounds)
        filler = QueueFiller(
            harness, settings.throughput_preload, timedelta(milliseconds=settings.throughput_due_apart_ms)
        )
        rows: list[dict[str, Any]] = []
        for processes, threads, batch_size in configs:
            row: dict[str, Any] = {
                "processes": processes,
                "threads": threads,
                "concurrency": processes * threads,
            }
            if batch_size > 1:
                row["batch_size"] = batch_size
            config = (processes, threads, batch_size)
            row_modes = _row_modes(
                modes,
                compact=compact is not None and batch_size == 1,
                chain=config in points["chain"],
                asyncio=config in points["async"],
                async_chain=config in points["async_chain"],
                async_chain_uvloop=config in points["async_chain_uvloop"],
                pipeline=config in points["pipeline"],
                async_pipeline=config in points["async_pipeline"],
            )
            if processes > 1 and proc_reason:
                row["skipped"] = proc_reason
                progress.advance(task, len(row_modes) * settings.throughput_rounds)
                rows.append(row)
                continue
            for round_ in range(settings.throughput_rounds):
                for mode in drain_order(row_modes, round_):
                    progress.describe(
                        task, f"{harness.name}: throughput, {processes}x{threads} {mode} #{round_ + 1}"
                    )
                    drain_mode, drain_spec, drain_harness = plans[mode]
                    row.setdefault(f"{mode}_rounds", []).append(
                        drain_rate(
                            filler,
                            drain_spec,
                            drain_mode,
                            processes,
                            threads,
                            settings,
                            batch_size,
                            drain_harness,
                        )
                    )
                    progress.advance(task)
                server_drains(
                    row,
                    filler,
                    settings,
                    limit=(processes, threads, batch_size) in limit_points and last_limit,
                    pgbench=batch_size == 1 and not pgbench_reason,
                    tick=lambda what: progress.describe(task, f"{harness.name}: throughput, {what}"),
                    done=lambda: progress.advance(task),
                )
            summarize(row, row_modes)
            rows.append(row)
        progress.done(task)
        skipped = {
            "raw_skipped": raw_reason,
            "pgbench_skipped": pgbench_reason,
            "limit_skipped": limit_reason,
            "server_cpu_skipped": server_cpu_reason(harness),
            "async_skipped": async_reason,
            "uvloop_skipped": uvloop_reason,
        }
        result = _result(harness, spec, rows, skipped, cores, chain)
        result["due_apart_ms"] = settings.throughput_due_apart_ms
        if settings.profile and not raw_reason:
            ptask = progress.task(f"{harness.name}: profile", 1)
            truncate(harness)
            result["profile"] = profile_paths(harness, settings.profile_jobs)
            progress.done(ptask)
        return result
