"""Enqueue-to-handler latency at low load, and what an idle worker costs the database and the client.

Each is measured polling only (Proletarian's way) and, where the backend announces enqueued jobs
(PostgreSQL), with instant wake-up (enqueue notify=True, worker wake_on_notify=True) at the default
polling interval and at a ten times longer one, which the wake-up makes possible for notified jobs.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, cast

import psutil

from benchmarks.common import (
    BENCH_JOB_TYPE,
    BENCH_QUEUE,
    BackendSpec,
    closing_harness,
    job_table_of,
    open_harness,
    run_sql,
    sql_dialect,
    summarize_ms,
    wait_until,
)
from benchmarks.progress import Progress
from benchmarks.settings import Settings
from conformance.harness import Harness, SqlHarness
from proletarian_ref import Job, create_queue_worker, enqueue
from proletarian_ref import log as ev
from proletarian_ref.backend import Backend, Capabilities, JobRecord, Listener, Notifications
from proletarian_ref.log import stdlib_logger
from proletarian_ref.tables import TableName

# With wake-up, idle polling matters only for jobs nobody announced: the longer interval shown beside
# the default is this many times the default.
WAKE_UP_LONG_INTERVAL_FACTOR = 10


def announces(harness: Harness) -> bool:
    """Whether the harness's backend can announce enqueued jobs (instant wake-up)."""
    backend = harness.make_backend()
    try:
        return isinstance(backend, Notifications)
    finally:
        backend.close()


class _ListeningLog:
    """The default log, plus an event set once the worker's listener listens."""

    def __init__(self) -> None:
        self.listening = threading.Event()

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        if event == ev.LISTENING_FOR_JOBS:
            self.listening.set()
        stdlib_logger(event, data)


def enqueue_to_start(
    harness: Harness,
    settings: Settings,
    batch_size: int = 1,
    *,
    wake: bool = False,
    polling_interval_ms: float | None = None,
) -> dict[str, Any]:
    """Seconds from an enqueue's COMMIT returning to the handler starting, jobs spaced at random gaps.

    With `wake` the jobs are enqueued with notify=True to a worker with wake_on_notify=True; without it
    neither, so the worker finds them by polling alone.
    """
    interval = polling_interval_ms if polling_interval_ms is not None else settings.polling_interval_ms
    starts: dict[Any, float] = {}

    def handler(job: Job) -> None:
        starts[job.job_id] = time.perf_counter()

    log = _ListeningLog()
    worker = create_queue_worker(
        harness.data_source,
        handler,
        handler_fn_mode="advanced",
        queue=BENCH_QUEUE,
        polling_interval_ms=interval,
        batch_size=batch_size,
        wake_on_notify=wake,
        log=log,
        **harness.table_options,
    )
    sent: dict[Any, float] = {}
    rng = random.Random(4)
    conn = harness.connect()
    worker.start()
    try:
        # The worker's first poll finds nothing; from then on it sleeps the interval between empty polls.
        time.sleep(min(interval, settings.polling_interval_ms) / 1000)
        if wake and not log.listening.wait(10.0):
            raise RuntimeError("the worker's listener did not start listening within 10 s")
        for i in range(settings.latency_jobs):
            job_id = enqueue(
                conn, BENCH_JOB_TYPE, {"i": i}, queue=BENCH_QUEUE, job_table=harness.job_table, notify=wake
            )
            conn.commit()
            sent[job_id] = time.perf_counter()
            time.sleep(rng.uniform(*settings.latency_gap_ms) / 1000)
        wait_until(lambda: len(starts) >= len(sent), 10.0)
    finally:
        worker.stop()
        conn.close()
    latencies = [starts[j] - sent[j] for j in sent if j in starts]
    return {
        "jobs": len(sent),
        "started": len(latencies),
        "polling_interval_ms": interval,
        "wake_up": wake,
        **summarize_ms(latencies),
    }


class CountingBackend:
    """A Backend that counts the worker's transactions and polls, passing everything else through."""

    def __init__(self, inner: Backend, before_close: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self._before_close = before_close
        self.transactions = 0
        self.polls = 0

    @property
    def dialect(self) -> str:
        return self.inner.dialect

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def transaction(self) -> AbstractContextManager[Any]:
        self.transactions += 1
        return self.inner.transaction()

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        return self.inner.enqueue(conn, job_table, job)

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        self.polls += 1
        return self.inner.get_next_job(conn, job_table, queue, now)

    def archive_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        self.inner.archive_job(conn, job_table, archived_job_table, job_id, status, finished_at)

    def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        self.inner.delete_job(conn, job_table, job_id)

    def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        self.inner.retry_at(conn, job_table, job_id, retry_at)

    def close(self) -> None:
        if self._before_close is not None:
            self._before_close()
        self.inner.close()


class ListeningCountingBackend(CountingBackend):
    """CountingBackend over a backend with Notifications, passing them through (the worker then listens)."""

    def notify_enqueued(self, conn: Any, job_table: TableName, queues: Any) -> None:
        cast(Notifications, self.inner).notify_enqueued(conn, job_table, queues)

    def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> Listener:
        return cast(Notifications, self.inner).listen(job_table, queue, data_source)


def table_scans(harness: Harness) -> int | None:
    """PostgreSQL's count of scans of our job table: every poll is one, and nobody else reads this table."""
    if sql_dialect(harness) != "postgresql" or not isinstance(harness, SqlHarness):
        return None
    job = job_table_of(harness)
    rows = run_sql(
        harness,
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
        "WHERE schemaname = %(schema)s AND relname = %(table)s",
        {"schema": job.schema or "public", "table": job.name},
    )
    return int(rows[0][0]) if rows else 0


_MYSQL_SESSION_STATUS = (
    "SHOW SESSION STATUS WHERE Variable_name IN ('Com_select', 'Com_commit', 'Com_rollback', 'Questions')"
)


class SessionRecorder:
    """A data source that keeps the worker's MySQL connections, to read their own session counters.

    Server-wide counters move with every other client of the server; a session's own do not.
    """

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.connections: list[Any] = []
        self.status: dict[str, int] = {}

    def __call__(self) -> Any:
        conn = self.harness.connect()
        self.connections.append(conn)
        return conn

    def read(self) -> None:
        for conn in self.connections:
            cursor = conn.cursor()
            cursor.execute(_MYSQL_SESSION_STATUS)
            for name, value in cursor.fetchall():
                self.status[name] = self.status.get(name, 0) + int(value)
            cursor.close()


def idle_cost(
    harness: Harness, settings: Settings, *, wake: bool = False, polling_interval_ms: float | None = None
) -> dict[str, Any]:
    """Polls per second of one idle worker thread, counted by the client and by the server.

    With `wake` the worker also listens (its listener connection sends no query while it waits).

    The server's figures are isolated from everyone else's traffic: on PostgreSQL the scans of our own
    job table (statistics are published about once a second, so they are read after the worker stopped),
    on MySQL the worker connection's own session counters, read just before the worker closes it.
    """
    from proletarian_ref.backends import backend_for_data_source

    interval = polling_interval_ms if polling_interval_ms is not None else settings.polling_interval_ms
    # A window of at least five intervals, so a long interval still shows a rate.
    window = max(settings.idle_window_s, 5 * interval / 1000)
    dialect = sql_dialect(harness)
    recorder = SessionRecorder(harness) if dialect == "mysql" else None
    inner = backend_for_data_source(recorder) if recorder is not None else harness.make_backend()
    counting_class = ListeningCountingBackend if wake else CountingBackend
    counting = counting_class(inner, before_close=recorder.read if recorder is not None else None)
    worker = create_queue_worker(
        None,
        lambda job_type, payload: None,
        queue=BENCH_QUEUE,
        polling_interval_ms=interval,
        backend=counting,
        wake_on_notify=wake,
        **harness.table_options,
    )
    process = psutil.Process()
    scans_before = table_scans(harness)
    cpu_before = process.cpu_times()
    start = time.perf_counter()
    worker.start()
    time.sleep(window)
    worker.stop()
    elapsed = time.perf_counter() - start
    # A worker closes only a backend it made itself; this one is ours to close (which reads the counters).
    counting.close()
    cpu_after = process.cpu_times()
    server: dict[str, float] = {}
    if scans_before is not None:
        time.sleep(1.2)
        scans_after = table_scans(harness)
        server["job table scans"] = ((scans_after or 0) - scans_before) / elapsed
    if recorder is not None:
        # Less the one SHOW that read them.
        server.update(
            {f"session {k}": (v - (k == "Questions")) / elapsed for k, v in recorder.status.items()}
        )
    cpu_s = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "window_s": round(elapsed, 3),
        "polling_interval_ms": interval,
        "wake_up": wake,
        "client_polls_per_s": counting.polls / elapsed,
        "client_transactions_per_s": counting.transactions / elapsed,
        "client_cpu_percent": 100 * cpu_s / elapsed,
        "server_per_s": server,
    }


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    harness = open_harness(spec, "lat", settings.table_suffix)
    with closing_harness(harness):
        wake = announces(harness)
        intervals = (
            [settings.polling_interval_ms, settings.polling_interval_ms * WAKE_UP_LONG_INTERVAL_FACTOR]
            if wake
            else []
        )
        task = progress.task(f"{harness.name}: latency and idle cost", 2 + 2 * len(intervals))
        latency = enqueue_to_start(harness, settings)
        progress.advance(task)
        harness.clear()
        idle = idle_cost(harness, settings)
        progress.advance(task)
        wake_up: list[dict[str, Any]] = []
        for interval in intervals:
            harness.clear()
            woken = enqueue_to_start(harness, settings, wake=True, polling_interval_ms=interval)
            progress.advance(task)
            harness.clear()
            idle_woken = idle_cost(harness, settings, wake=True, polling_interval_ms=interval)
            progress.advance(task)
            wake_up.append({"enqueue_to_start": woken, "idle": idle_woken})
        progress.done(task)
        out: dict[str, Any] = {
            "backend": harness.name,
            "factory": spec.factory,
            "enqueue_to_start": latency,
            "idle": idle,
        }
        if wake_up:
            out["wake_up"] = wake_up
        return out
