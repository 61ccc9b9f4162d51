"""proletarian-ref beside pgqueuer and procrastinate: the same no-op jobs drained on the same PostgreSQL.

Rounds interleave the systems (A B C A B C ...). In each, a system empties its own tables, enqueues N
jobs (the first ones one per call, timed, for the enqueue rate; the rest in its batch call), vacuums, and
drains them with the same number of consumer connections as the others, spread over the same processes.
The drain is timed whole, from the go signal to the moment the system's own completion record shows every
job done, and then every job is checked done exactly once. The peers run in spawned processes, each in a
schema of its own, so neither their event loops, imports, tables nor settings meet ours.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing as mp
import os
import queue
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from importlib import metadata
from types import ModuleType
from typing import Any, Final, Protocol

import psycopg
from psycopg.conninfo import make_conninfo

from benchmarks import latency, peer_aio, peer_ours, peer_pgqueuer, peer_procrastinate
from benchmarks.common import (
    BackendSpec,
    analyze,
    bulk_load,
    closing_harness,
    open_harness,
    skipped,
    sql_dialect,
    summarize_ms,
    truncate,
    wait_until,
)
from benchmarks.enqueue_rate import library_enqueue
from benchmarks.peer_child import Signals
from benchmarks.progress import Progress
from benchmarks.settings import CHILD_START_TIMEOUT_S, Settings
from conformance.builtin import DEFAULT_PG_DSN, PG_ENV
from conformance.harness import Harness

OURS: Final = "proletarian-ref"
PEERS: Final = (peer_pgqueuer, peer_procrastinate)
OURS_PROMISE: Final = (
    "claims one job per transaction (SELECT ... FOR UPDATE SKIP LOCKED) and keeps that transaction open "
    "while the handler runs; archive, delete and COMMIT close it: 1 commit a job; a crash rolls the "
    "transaction back and the job is due again at once: at least once, never marked done unless run"
)
OURS_BATCH_PROMISE: Final = (
    "batch mode (batch_size={k}): claims up to {k} jobs in one transaction (SKIP LOCKED) and runs their "
    "handlers one after another inside it, a failed job's retry or archive in a savepoint; archives and "
    "deletes the finished ones in one statement each and commits once: 1 commit per batch; a crash or a "
    "failed commit rolls the whole batch back, so up to {k} jobs run again: at least once, never marked "
    "done unless run"
)


def missing_peers() -> list[str]:
    """The peers' packages that are not installed (pip install -e '.[bench-peers]')."""
    return [m.PACKAGE for m in PEERS if importlib.util.find_spec(m.PACKAGE) is None]


def server_dsn(spec: BackendSpec) -> str:
    return str(spec.options.get("dsn") or os.environ.get(PG_ENV) or DEFAULT_PG_DSN)


def recreate_schema(dsn: str, name: str) -> str:
    """Drop and create schema `name` in the database of `dsn`; a DSN whose search_path is that schema."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{name}"')
    return make_conninfo(dsn, options=f"-c search_path={name}")


class System(Protocol):
    name: str
    config: str
    promise: str

    @property
    def version(self) -> str: ...

    def fill(self, jobs: int, timed: int) -> float: ...
    def vacuum(self) -> None: ...
    def consumer(self, connections: int) -> Callable[[Signals], None]: ...
    def done(self) -> int: ...
    def verify(self, jobs: int, handled: int) -> dict[str, Any]: ...
    def latency(self, settings: Settings) -> dict[str, Any]: ...
    def close(self) -> None: ...


def check(jobs: int, handled: int, records: tuple[int, int, int], leftover: int) -> dict[str, Any]:
    """Every job done exactly once: handled N times in all, N completion records of N distinct jobs, all
    of them successes, nothing left in the queue."""
    total, distinct, bad = records
    problems = [
        f"{what}: {got:,} (expected {want:,})"
        for what, got, want in (
            ("handler calls", handled, jobs),
            ("completion records", total, jobs),
            ("distinct jobs completed", distinct, jobs),
            ("records not a plain success", bad, 0),
            ("jobs left in the queue", leftover, 0),
        )
        if got != want
    ]
    return {"ok": not problems, "problems": problems}


class Ours:
    """proletarian-ref through the benchmarks' own machinery, on its bench tables in the server's database."""

    def __init__(
        self, spec: BackendSpec, harness: Harness, polling_interval_ms: float, batch_size: int = 1
    ) -> None:
        self.spec = spec
        self.harness = harness
        self.polling_interval_ms = polling_interval_ms
        self.batch_size = batch_size
        self.version = _version("proletarian-ref")
        self.config = "P processes x T worker threads, one connection per thread (create_queue_worker)"
        if batch_size > 1:
            # The same tables as the default mode's system: the rounds run one system at a time.
            self.name = f"{OURS} batch {batch_size}"
            self.promise = OURS_BATCH_PROMISE.format(k=batch_size)
            self.config += f", batch_size={batch_size}"
        else:
            self.name, self.promise = OURS, OURS_PROMISE
        self._conn = psycopg.connect(server_dsn(spec), autocommit=True)

    def fill(self, jobs: int, timed: int) -> float:
        truncate(self.harness)
        count, elapsed = library_enqueue(self.harness, 1, float("inf"), timed, None)
        bulk_load(self.harness, timed, jobs, "due")
        return count / elapsed if elapsed > 0 else 0.0

    def vacuum(self) -> None:
        analyze(self.harness, vacuum=True)

    def consumer(self, connections: int) -> Callable[[Signals], None]:
        h = self.harness
        return partial(
            peer_ours.consume,
            self.spec,
            h.job_table,
            h.archived_job_table,
            self.polling_interval_ms,
            connections,
            self.batch_size,
        )

    def done(self) -> int:
        return _count(self._conn, f"SELECT count(*) FROM {self.harness.archived_job_table}")

    def verify(self, jobs: int, handled: int) -> dict[str, Any]:
        archived = self.harness.archived_job_table
        records = self._conn.execute(
            f"SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE status <> ':success') "
            f"FROM {archived}"
        ).fetchone()
        leftover = _count(self._conn, f"SELECT count(*) FROM {self.harness.job_table}")
        return check(jobs, handled, _triple(records), leftover)

    def latency(self, settings: Settings) -> dict[str, Any]:
        truncate(self.harness)
        # With instant wake-up where the backend has it, as pgqueuer and procrastinate LISTEN too.
        figures = latency.enqueue_to_start(
            self.harness,
            settings.with_(latency_jobs=settings.peers_latency_jobs),
            self.batch_size,
            wake=latency.announces(self.harness),
        )
        return {k: v for k, v in figures.items() if k.endswith("_ms") or k == "n"}

    def close(self) -> None:
        self._conn.close()


class AsyncOurs(Ours):
    """proletarian-ref's asyncio worker (proletarian_ref.aio) on one driver of peer_aio.DRIVERS, on the
    same bench tables as the threaded worker (the rounds run one system at a time)."""

    def __init__(
        self,
        spec: BackendSpec,
        harness: Harness,
        polling_interval_ms: float,
        driver: str,
        batch_size: int = 1,
    ) -> None:
        super().__init__(spec, harness, polling_interval_ms, batch_size)
        self.driver = driver
        self.dsn = server_dsn(spec)
        self.config = (
            f"P processes x T polling tasks on one event loop each, one {driver} connection per task "
            "(proletarian_ref.aio.create_queue_worker)"
        )
        if batch_size > 1:
            self.name = f"{OURS} async batch {batch_size} ({driver})"
            self.config += f", batch_size={batch_size}"
        else:
            self.name = f"{OURS} async ({driver})"

    def fill(self, jobs: int, timed: int) -> float:
        # The timed enqueues through proletarian_ref.aio on the system's own driver: enqueue from an asyncio
        # application, one job a transaction, beside the threaded system's proletarian_ref.enqueue.
        truncate(self.harness)
        h = self.harness
        count, elapsed = peer_aio.enqueue_rate(
            self.dsn, self.driver, h.job_table, h.archived_job_table, timed
        )
        bulk_load(self.harness, timed, jobs, "due")
        return count / elapsed if elapsed > 0 else 0.0

    def consumer(self, connections: int) -> Callable[[Signals], None]:
        h = self.harness
        return partial(
            peer_aio.consume,
            self.dsn,
            self.driver,
            h.job_table,
            h.archived_job_table,
            self.polling_interval_ms,
            connections,
            self.batch_size,
        )

    def latency(self, settings: Settings) -> dict[str, Any]:
        truncate(self.harness)
        h = self.harness
        seconds = peer_aio.latency(
            self.dsn,
            self.driver,
            h.job_table,
            h.archived_job_table,
            self.batch_size,
            settings.peers_latency_jobs,
            settings.latency_gap_ms,
        )
        return summarize_ms(seconds)


class Peer:
    """A peer library, driven through its module in spawned processes, in a schema of its own."""

    def __init__(self, module: ModuleType, spec: BackendSpec, suffix: str) -> None:
        self.module = module
        self.name = str(module.NAME)
        self.config = str(module.CONFIG)
        self.promise = str(module.PROMISE)
        self.dsn = recreate_schema(server_dsn(spec), f"bench_peers_{self.name}{suffix}".lower())
        # One long-lived helper process per peer for its set-up, enqueues and latency sample; it runs them
        # in the order given, so the install goes on while the consumers start, and is done before a fill.
        self._helper = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
        self._installed = self._helper.submit(module.install, self.dsn)
        self._conn = psycopg.connect(self.dsn, autocommit=True)

    @property
    def version(self) -> str:
        return str(self._installed.result())

    def fill(self, jobs: int, timed: int) -> float:
        return float(self._helper.submit(self.module.fill, self.dsn, jobs, timed).result())

    def vacuum(self) -> None:
        for table in self.module.TABLES:
            self._conn.execute(f"VACUUM ANALYZE {table}")

    def consumer(self, connections: int) -> Callable[[Signals], None]:
        return partial(self.module.consume, self.dsn, connections)

    def done(self) -> int:
        return _count(self._conn, self.module.DONE_SQL)

    def verify(self, jobs: int, handled: int) -> dict[str, Any]:
        records = self._conn.execute(self.module.VERIFY_SQL).fetchone()
        return check(jobs, handled, _triple(records), _count(self._conn, self.module.LEFTOVER_SQL))

    def latency(self, settings: Settings) -> dict[str, Any]:
        gaps = settings.latency_gap_ms
        seconds = self._helper.submit(
            self.module.latency, self.dsn, settings.peers_latency_jobs, gaps
        ).result()
        return summarize_ms(seconds)

    def close(self) -> None:
        self._helper.shutdown()
        self._conn.close()


class ConsumerPool:
    """A system's consumer processes, spawned once and kept through every round (see Signals)."""

    def __init__(self, name: str, target: Callable[[Signals], None], processes: int, rounds: int) -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self._slots = ctx.Array("q", processes, lock=False)
        self._ready = ctx.Queue()
        self._go = [ctx.Event() for _ in range(rounds)]
        self._stop = [ctx.Event() for _ in range(rounds)]
        self._children = [
            ctx.Process(
                target=target,
                args=(Signals(i, self._slots, self._ready, self._go, self._stop),),
                name=f"bench-{name}-{i}",
                daemon=True,
            )
            for i in range(processes)
        ]
        for child in self._children:
            child.start()

    @property
    def count(self) -> int:
        """Jobs handled by every child, over every round so far."""
        return int(sum(self._slots))

    @property
    def dead(self) -> list[str]:
        """Children that have ended (before close(), only by failing)."""
        return [c.name for c in self._children if c.exitcode is not None]

    def wait_ready(self) -> None:
        """Until every child has its connections open for the next round."""
        deadline = time.monotonic() + CHILD_START_TIMEOUT_S
        ready = 0
        while ready < len(self._children):
            if self.dead or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} consumers are not ready: {self.dead or 'timed out'}")
            with contextlib.suppress(queue.Empty):
                self._ready.get(timeout=0.2)
                ready += 1

    def go(self, round_: int) -> None:
        self._go[round_].set()

    def stop(self, round_: int) -> None:
        self._stop[round_].set()

    def close(self) -> None:
        """Wait for the children to end after their last round; end them if they do not."""
        for event in (*self._go, *self._stop):
            event.set()
        for child in self._children:
            child.join(30)
            if child.is_alive():
                child.terminate()
                child.join(5)
        failed = [c.name for c in self._children if c.exitcode != 0]
        if failed:
            raise RuntimeError(f"{self.name} consumer processes failed: {failed}")


def _count(conn: Any, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _triple(row: Any) -> tuple[int, int, int]:
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


def timed_drain(system: System, pool: ConsumerPool, round_: int, settings: Settings) -> dict[str, Any]:
    """One round of one system: fill, vacuum, drain from go to the last completion record, verify."""
    jobs = settings.peers_jobs
    enqueue_rate = system.fill(jobs, settings.peers_enqueue_timed)
    system.vacuum()
    before = pool.count
    start = time.perf_counter()
    pool.go(round_)
    wait_until(lambda: pool.count - before >= jobs or bool(pool.dead), settings.peers_drain_timeout_s, 0.005)
    if pool.dead:
        raise RuntimeError(f"{system.name} consumer processes died during the drain: {pool.dead}")
    if pool.count - before < jobs:
        raise RuntimeError(
            f"{system.name} handled {pool.count - before:,} of {jobs:,} jobs in "
            f"{settings.peers_drain_timeout_s:g} s (peers_drain_timeout_s)"
        )
    finished = wait_until(lambda: system.done() >= jobs, 30.0, step_s=0.005)
    seconds = time.perf_counter() - start
    pool.stop(round_)
    # The children stop, and reopen for the next round (or end after the last): every handler has
    # returned once they say so.
    if round_ + 1 < settings.peers_rounds:
        pool.wait_ready()
    else:
        pool.close()
    verification = system.verify(jobs, pool.count - before)
    if not finished:
        verification["problems"].append("the drain did not finish in time")
        verification["ok"] = False
    return {
        "jobs": jobs,
        "seconds": round(seconds, 4),
        "jobs_per_s": jobs / seconds if seconds > 0 else 0.0,
        "enqueue_jobs_per_s": enqueue_rate,
        "verification": verification,
    }


def summarize(system: System, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["jobs_per_s"] for r in rounds]
    problems = [f"round {i + 1}: {p}" for i, r in enumerate(rounds) for p in r["verification"]["problems"]]
    return {
        "name": system.name,
        "version": system.version,
        "config": system.config,
        "promise": system.promise,
        "rounds": rounds,
        "jobs_per_s": statistics.median(rates),
        "jobs_per_s_min": min(rates),
        "jobs_per_s_max": max(rates),
        "enqueue_jobs_per_s": statistics.median(r["enqueue_jobs_per_s"] for r in rounds),
        "verification": {"ok": not problems, "problems": problems},
    }


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    harness = open_harness(spec, "peers", settings.table_suffix)
    with closing_harness(harness):
        if sql_dialect(harness) != "postgresql":
            return {
                "backend": harness.name,
                "factory": spec.factory,
                **skipped("the peers run on PostgreSQL only"),
            }
        missing = missing_peers()
        systems: list[System] = [
            Ours(spec, harness, settings.polling_interval_ms),
            Ours(spec, harness, settings.polling_interval_ms, settings.batch_size),
        ]
        # The asyncio worker beside the threaded one, default and batch mode, on each driver asked for.
        for driver in settings.peers_async_drivers:
            systems.append(AsyncOurs(spec, harness, settings.polling_interval_ms, driver))
            # The compact plan is a default-mode plan: batch mode archives a batch its own way.
            if not driver.endswith(" compact"):
                systems.append(
                    AsyncOurs(spec, harness, settings.polling_interval_ms, driver, settings.batch_size)
                )
        pools: list[ConsumerPool] = []
        try:
            systems += [Peer(m, spec, settings.table_suffix) for m in PEERS if m.PACKAGE not in missing]
            task = progress.task(
                f"{harness.name}: peers", settings.peers_rounds * len(systems) + len(systems)
            )
            # Every system's consumers start together, so no round waits for a process to start.
            pools = [
                ConsumerPool(
                    s.name,
                    s.consumer(settings.peers_connections),
                    settings.peers_processes,
                    settings.peers_rounds,
                )
                for s in systems
            ]
            for pool in pools:
                pool.wait_ready()
            rounds: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
            for round_ in range(settings.peers_rounds):
                for system, pool in zip(systems, pools, strict=True):
                    progress.describe(task, f"{harness.name}: peers, {system.name} #{round_ + 1}")
                    rounds[system.name].append(timed_drain(system, pool, round_, settings))
                    progress.advance(task)
            results = [summarize(s, rounds[s.name]) for s in systems]
            for system, result in zip(systems, results, strict=True):
                progress.describe(task, f"{harness.name}: peers, {system.name} latency")
                result["latency"] = system.latency(settings)
                progress.advance(task)
            progress.done(task)
        finally:
            for pool in pools:
                with contextlib.suppress(RuntimeError):
                    pool.close()
            for system in systems:
                system.close()
        problems = [f"{r['name']}: {p}" for r in results for p in r["verification"]["problems"]]
        out: dict[str, Any] = {
            "backend": harness.name,
            "factory": spec.factory,
            "jobs": settings.peers_jobs,
            "rounds": settings.peers_rounds,
            "processes": settings.peers_processes,
            "connections_per_process": settings.peers_connections,
            "systems": results,
            "verification": {"ok": not problems, "problems": problems},
        }
        if missing:
            out["peers_missing"] = (
                f"{', '.join(missing)} not installed, so only proletarian-ref ran: "
                "pip install -e '.[bench-peers]' (or tox -e bench-peers)"
            )
        return out
