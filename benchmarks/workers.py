"""Draining a queue with the library's worker (threaded or asyncio) or the raw loop, here or in children."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from benchmarks.async_drain import AsyncDrainer
from benchmarks.common import BENCH_QUEUE, BackendSpec, Counter, require_sql, sql_dialect, wait_until
from benchmarks.raw import RawDrainer
from benchmarks.settings import CHILD_MAX_RUN_S, CHILD_START_TIMEOUT_S
from conformance.harness import Harness
from proletarian_ref import create_queue_worker

Mode = Literal["library", "raw", "async", "async_chain", "async_chain_uvloop", "async_pipeline"]


class LibraryDrainer:
    """A proletarian-ref queue worker with a no-op handler that only counts."""

    def __init__(
        self,
        harness: Harness,
        threads: int,
        polling_interval_ms: float,
        on_job: Callable[[], Any],
        batch_size: int = 1,
    ) -> None:
        def handler(job_type: str, payload: Any) -> None:
            on_job()

        # The harness's own backend, so a factory's backend options (postgresql_pipeline) are what is
        # measured; lent to the worker, so closed here after it stops.
        self._backend = harness.make_backend()
        self._worker = create_queue_worker(
            harness.data_source,
            handler,
            queue=BENCH_QUEUE,
            worker_threads=threads,
            polling_interval_ms=polling_interval_ms,
            batch_size=batch_size,
            backend=self._backend,
            **harness.table_options,
        )

    def start(self) -> None:
        self._worker.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        try:
            self._worker.stop()
        finally:
            self._backend.close()


Drainer = LibraryDrainer | RawDrainer | AsyncDrainer


def make_drainer(
    harness: Harness,
    mode: Mode,
    threads: int,
    polling_interval_ms: float,
    on_job: Callable[[], Any],
    batch_size: int = 1,
) -> Drainer:
    """The library's worker (in batch mode when `batch_size` > 1), its asyncio worker (`threads` polling
    tasks; "async_chain" with chained claims, "async_chain_uvloop" the same on uvloop's event loop,
    "async_pipeline" on Proletarian's exact plan pipelined, PostgreSQL), or the raw loop (one job a
    transaction)."""
    if mode == "library":
        return LibraryDrainer(harness, threads, polling_interval_ms, on_job, batch_size)
    if mode in ("async", "async_chain", "async_chain_uvloop", "async_pipeline"):
        return AsyncDrainer(
            harness,
            threads,
            polling_interval_ms,
            on_job,
            batch_size,
            chain=mode in ("async_chain", "async_chain_uvloop"),
            pipeline=mode == "async_pipeline",
            uvloop=mode == "async_chain_uvloop",
        )
    sql_harness, dialect = require_sql(harness)
    return RawDrainer(sql_harness, dialect, threads, polling_interval_ms, on_job)


def raw_skip_reason(harness: Harness) -> str | None:
    if sql_dialect(harness) is None:
        return (
            f"{harness.name} is not one of the built-in dialects (PostgreSQL on psycopg, MySQL on PyMySQL), "
            "so there is no raw-driver loop to compare with"
        )
    return None


def processes_skip_reason(harness: Harness) -> str | None:
    if not harness.capabilities.multi_process:
        return f"{harness.name} cannot be shared between processes (Capabilities.multi_process is False)"
    return None


@dataclass(frozen=True, slots=True)
class ChildTask:
    """What a child process needs to rebuild the harness and drain: all of it picklable."""

    spec: BackendSpec
    job_table: str
    archived_job_table: str
    mode: Mode
    threads: int
    polling_interval_ms: float
    report_rss: bool = False
    batch_size: int = 1


def _child_main(task: ChildTask, index: int, slots: Any, ready: Any, go: Any, stop: Any, rss: Any) -> None:
    harness = task.spec.load(task.job_table, task.archived_job_table)

    def publish(value: int) -> None:
        slots[index] = value

    counter = Counter(publish)
    drainer = make_drainer(
        harness, task.mode, task.threads, task.polling_interval_ms, counter.add, task.batch_size
    )
    ready.put(os.getpid())
    if not go.wait(CHILD_START_TIMEOUT_S):
        return
    drainer.start()
    stop.wait(CHILD_MAX_RUN_S)
    drainer.stop()
    if task.report_rss:
        import resource

        # ru_maxrss is in KiB on Linux.
        rss.value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    harness.close()


class DrainRun:
    """A drain in progress; `count` is the number of jobs handled so far, however many processes run."""

    def __init__(
        self,
        harness: Harness,
        spec: BackendSpec,
        mode: Mode,
        processes: int,
        threads: int,
        polling_interval_ms: float,
        *,
        report_rss: bool = False,
        in_child: bool = False,
        batch_size: int = 1,
    ) -> None:
        self.processes = processes
        self._counter = Counter()
        self._drainer: Drainer | None = None
        self._children: list[Any] = []
        self.pids: list[int] = []
        if processes == 1 and not in_child:
            self._drainer = make_drainer(
                harness, mode, threads, polling_interval_ms, self._counter.add, batch_size
            )
            self.pids = [os.getpid()]
            return
        ctx = mp.get_context("spawn")
        self._slots = ctx.Array("q", processes, lock=False)
        self._ready = ctx.Queue()
        self._go = ctx.Event()
        self._stop = ctx.Event()
        self._rss = [ctx.Value("q", 0, lock=False) for _ in range(processes)]
        task = ChildTask(
            spec,
            harness.job_table,
            harness.archived_job_table,
            mode,
            threads,
            polling_interval_ms,
            report_rss,
            batch_size,
        )
        for i in range(processes):
            child = ctx.Process(
                target=_child_main,
                args=(task, i, self._slots, self._ready, self._go, self._stop, self._rss[i]),
                name=f"bench-drain-{i}",
                daemon=True,
            )
            child.start()
            self._children.append(child)
        deadline = time.monotonic() + CHILD_START_TIMEOUT_S
        while len(self.pids) < processes:
            dead = [c.name for c in self._children if c.exitcode is not None]
            if dead or time.monotonic() > deadline:
                self._stop.set()
                raise RuntimeError(f"drain child processes failed to start: {dead or 'timed out'}")
            try:
                self.pids.append(int(self._ready.get(timeout=0.2)))
            except queue.Empty:
                continue

    @property
    def count(self) -> int:
        if self._drainer is not None:
            return self._counter.value
        return int(sum(self._slots))

    def start(self) -> None:
        if self._drainer is not None:
            self._drainer.start()
        else:
            self._go.set()

    def stop(self) -> list[int]:
        """Stop and return each child's peak RSS in bytes (empty when run in this process)."""
        if self._drainer is not None:
            self._drainer.stop()
            return []
        self._stop.set()
        for child in self._children:
            child.join(30)
            if child.is_alive():
                child.terminate()
                child.join(5)
        return [int(v.value) for v in self._rss]


def measure_rate(
    run: DrainRun,
    total: int,
    warmup_s: float,
    window_s: float,
    costs: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Jobs per second in a window after a warm-up; the window ends early before the queue could run dry.

    `costs` reads counters (CPU seconds, round trips) at the window's start and end; their differences
    per job are the result's "per_job".
    """
    started = time.perf_counter()
    run.start()
    if not wait_until(lambda: run.count > 0, 30.0):
        raise RuntimeError("no job was handled within 30 s of starting the workers")
    first_job_s = time.perf_counter() - started
    # The counters first, then the count, each time: a first reading can be slow (ServerCpu finds the
    # drain's server processes), and jobs finished meanwhile would be counted with none of their costs.
    first = costs() if costs is not None else {}
    c_first, t_first = run.count, time.perf_counter()
    time.sleep(warmup_s)
    before = costs() if costs is not None else {}
    c0, t0 = run.count, time.perf_counter()
    limit = int(total * 0.95)
    if c0 >= limit:
        # A backend fast enough to near the end of the queue during the warm-up: count from the first job,
        # its costs with it, or from the start, without costs, if even the first look found it there (the
        # in-memory backend in batch mode). Costs read after the warm-up would be the few last jobs' alone.
        c0, t0, before = (c_first, t_first, first) if c_first < limit else (0, started, {})
    wait_until(lambda: run.count >= limit, window_s, step_s=0.01)
    c1, t1 = run.count, time.perf_counter()
    after = costs() if costs is not None else {}
    result: dict[str, Any] = {
        "jobs": c1 - c0,
        "seconds": round(t1 - t0, 4),
        "jobs_per_s": (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0,
        "first_job_s": round(first_job_s, 4),
        "window_cut_short": c1 >= limit,
    }
    if after and before and c1 > c0:
        result["per_job"] = {k: (after[k] - before[k]) / (c1 - c0) for k in after if k in before}
    return result
