"""What long handlers cost: K claims held for seconds beside a stream of short jobs, sampled over time.

A worker keeps a job's claim transaction open while its handler runs (as Proletarian does). One such
transaction held for seconds holds PostgreSQL's MVCC horizon back, so no dead row left by the short jobs
meanwhile can be vacuumed, and the claims step over more and more of them; on InnoDB it holds row locks
and, in a consistent read, undo history. Every `long_sample_s` the benchmark records the job table's dead
tuples and the oldest transaction's xmin age (PostgreSQL), lock waits, open transactions and the undo
history length (MySQL/MariaDB), the time of one claim on the short queue, and the short stream's rate.
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import UTC, datetime
from typing import Any, Final

from benchmarks.common import (
    BENCH_JOB_TYPE,
    BENCH_QUEUE,
    BENCH_QUEUE_TEXT,
    BackendSpec,
    Counter,
    Dialect,
    closing_harness,
    job_table_of,
    open_harness,
    require_sql,
    run_sql,
    skipped,
    sql_dialect,
)
from benchmarks.progress import Progress
from benchmarks.settings import Settings
from conformance.harness import SqlHarness
from proletarian_ref import create_queue_worker, enqueue
from proletarian_ref.backend import Backend
from proletarian_ref.backends import backend_for_data_source

LONG_QUEUE: Final = "bench/long"
LONG_JOB_TYPE: Final = "bench/long-job"
PROBES_PER_SAMPLE: Final = 3
LATE_LIMIT_S: Final = 30.0
# MySQL 8 moved lock waits to performance_schema; MariaDB 10.11 still has them in information_schema.
LOCK_WAIT_TABLES: Final = ("performance_schema.data_lock_waits", "information_schema.INNODB_LOCK_WAITS")


class _Rollback(Exception):
    """Ends the probe's transaction without a commit, so the probed row stays due."""


def probe_claim(backend: Backend, harness: SqlHarness) -> float:
    """Seconds for one get_next_job on the short queue, in a transaction rolled back (found or not)."""
    job_table = job_table_of(harness)
    elapsed = 0.0
    try:
        with backend.transaction() as conn:
            start = time.perf_counter()
            backend.get_next_job(conn, job_table, BENCH_QUEUE_TEXT, datetime.now(UTC))
            elapsed = time.perf_counter() - start
            raise _Rollback
    except _Rollback:
        pass
    return elapsed


class Sessions:
    """A data source for the workers that notes each connection's server session (PostgreSQL backend
    pid, MySQL thread id), so the figures below are our workers' own, not the whole shared server's."""

    def __init__(self, harness: SqlHarness, dialect: Dialect) -> None:
        self.harness = harness
        self.dialect: Dialect = dialect
        self.ids: list[int] = []

    def __call__(self) -> Any:
        conn = self.harness.connect()
        self.ids.append(int(conn.info.backend_pid if self.dialect == "postgresql" else conn.thread_id()))
        return conn


class ServerProbe:
    """The database's side of the picture, read on one connection of its own."""

    def __init__(self, harness: SqlHarness, dialect: Dialect, sessions: Sessions) -> None:
        self.harness = harness
        self.dialect: Dialect = dialect
        self.sessions = sessions
        self.lock_wait_table = self._lock_wait_table() if dialect == "mysql" else None

    def _lock_wait_table(self) -> str | None:
        for table in LOCK_WAIT_TABLES:
            try:
                run_sql(self.harness, f"SELECT count(*) FROM {table}")
            except Exception:
                # Not on this server (MySQL 8 has only the first, MariaDB only the second).
                continue
            return table
        return None

    def read(self) -> dict[str, Any]:
        if self.dialect == "postgresql":
            return self._postgresql()
        return self._mysql()

    def _postgresql(self) -> dict[str, Any]:
        job = job_table_of(self.harness)
        tup = run_sql(
            self.harness,
            "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables "
            "WHERE schemaname = %(s)s AND relname = %(t)s",
            {"s": job.schema or "public", "t": job.name},
        )
        # The horizon our workers hold: the oldest snapshot among their sessions.
        horizon = run_sql(
            self.harness,
            "SELECT coalesce(max(age(backend_xmin)), 0), "
            "coalesce(extract(epoch FROM max(now() - xact_start)), 0) "
            "FROM pg_stat_activity WHERE pid = ANY(%(pids)s)",
            {"pids": list(self.sessions.ids)},
        )
        return {
            "dead_tuples": int(tup[0][0]) if tup else 0,
            "live_tuples": int(tup[0][1]) if tup else 0,
            "xmin_age": int(horizon[0][0]),
            "oldest_transaction_s": round(float(horizon[0][1]), 3),
        }

    def _mysql(self) -> dict[str, Any]:
        job = job_table_of(self.harness)
        trx = run_sql(
            self.harness,
            "SELECT count(*), coalesce(max(TIMESTAMPDIFF(MICROSECOND, trx_started, NOW())), 0) / 1e6, "
            "coalesce(sum(trx_rows_locked), 0) FROM information_schema.innodb_trx "
            "WHERE trx_mysql_thread_id IN %(ids)s",
            {"ids": tuple(self.sessions.ids) or (-1,)},
        )
        # Undo history is the server's, whoever left it: the one figure here not ours alone.
        history = run_sql(
            self.harness,
            "SELECT `count` FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'",
        )
        return {
            "lock_waits": self._lock_waits(job.schema, job.name),
            "open_transactions": int(trx[0][0]),
            "oldest_transaction_s": round(float(trx[0][1]), 3),
            "rows_locked": int(trx[0][2]),
            "history_length": int(history[0][0]) if history else None,
        }

    def _lock_waits(self, schema: str | None, table: str) -> int | None:
        """Lock waits on our job table now."""
        if self.lock_wait_table is None:
            return None
        if self.lock_wait_table.startswith("performance_schema"):
            statement = (
                "SELECT count(*) FROM performance_schema.data_lock_waits w "
                "JOIN performance_schema.data_locks l ON l.ENGINE_LOCK_ID = w.REQUESTING_ENGINE_LOCK_ID "
                "WHERE l.OBJECT_SCHEMA = COALESCE(%(schema)s, DATABASE()) AND l.OBJECT_NAME = %(table)s"
            )
        else:
            statement = (
                "SELECT count(*) FROM information_schema.INNODB_LOCK_WAITS w "
                "JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id "
                "WHERE l.lock_table = CONCAT('`', COALESCE(%(schema)s, DATABASE()), '`.`', %(table)s, '`')"
            )
        return int(run_sql(self.harness, statement, {"schema": schema, "table": table})[0][0])


class Stream:
    """Short jobs enqueued at a steady rate, one per transaction, until stopped."""

    def __init__(self, harness: SqlHarness, rate: float) -> None:
        self.harness = harness
        self.rate = rate
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="long-handlers-stream", daemon=True)

    def _loop(self) -> None:
        conn = self.harness.connect()
        backend = self.harness.backend()
        start = time.monotonic()
        try:
            while not self._stop.is_set():
                enqueue(
                    conn,
                    BENCH_JOB_TYPE,
                    {"i": self.sent},
                    queue=BENCH_QUEUE,
                    job_table=self.harness.job_table,
                    backend=backend,
                )
                conn.commit()
                self.sent += 1
                self._stop.wait(max(0.0, start + self.sent / self.rate - time.monotonic()))
        finally:
            conn.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def phase_summary(samples: list[dict[str, Any]], phase: str, dialect: Dialect) -> dict[str, Any]:
    rows = [s for s in samples if s["phase"] == phase]
    if not rows:
        return {}
    out: dict[str, Any] = {
        "samples": len(rows),
        "short_jobs_per_s": statistics.fmean(r["short_jobs_per_s"] for r in rows),
        "poll_ms_median": statistics.median(r["poll_ms"] for r in rows),
        "poll_ms_max": max(r["poll_ms"] for r in rows),
    }
    keys = ("dead_tuples", "xmin_age") if dialect == "postgresql" else ("lock_waits", "history_length")
    for key in keys:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            out[f"{key}_max"] = max(values)
    return out


def run(spec: BackendSpec, settings: Settings, progress: Progress) -> dict[str, Any]:
    harness = open_harness(spec, "long", settings.table_suffix)
    with closing_harness(harness):
        if sql_dialect(harness) is None:
            return {
                "backend": harness.name,
                "factory": spec.factory,
                **skipped("needs a built-in SQL dialect: the figures come from the server's own views"),
            }
        sql_harness, dialect = require_sql(harness)
        return _measure(sql_harness, dialect, spec, settings, progress)


def _measure(
    harness: SqlHarness, dialect: Dialect, spec: BackendSpec, settings: Settings, progress: Progress
) -> dict[str, Any]:
    total_s = settings.long_before_s + settings.long_hold_s + settings.long_after_s
    task = progress.task(f"{harness.name}: long handlers", int(total_s / settings.long_sample_s) + 1)
    handled = Counter()
    sessions = Sessions(harness, dialect)
    # Backends passed to a worker stay ours to close.
    backends = [backend_for_data_source(sessions), backend_for_data_source(sessions)]
    short = create_queue_worker(
        None,
        lambda job_type, payload: handled.add(),
        backend=backends[0],
        queue=BENCH_QUEUE,
        worker_threads=settings.long_stream_threads,
        polling_interval_ms=settings.polling_interval_ms,
        **harness.table_options,
    )
    long_running, long_done = Counter(), Counter()

    def hold(job_type: str, payload: Any) -> None:
        long_running.add()
        time.sleep(settings.long_hold_s)
        long_running.add(-1)
        long_done.add()

    long = create_queue_worker(
        None,
        hold,
        backend=backends[1],
        queue=LONG_QUEUE,
        worker_threads=settings.long_handlers,
        polling_interval_ms=settings.polling_interval_ms,
        **harness.table_options,
    )
    probe_backend = harness.backend()
    server = ServerProbe(harness, dialect, sessions)
    stream = Stream(harness, settings.long_stream_rate)
    samples: list[dict[str, Any]] = []
    short.start()
    long.start()
    stream.start()
    start = time.monotonic()
    enqueued_long = False
    try:
        last_t, last_count = 0.0, 0
        # The first sample after one interval, so each sample's rate covers a whole interval.
        time.sleep(settings.long_sample_s)
        # Sampled until the long handlers are done and after_s more, however slow a loaded machine makes
        # the samples, within a bound.
        finished_at: float | None = None
        while (t := time.monotonic() - start) < total_s + LATE_LIMIT_S and (
            finished_at is None or t < finished_at + settings.long_after_s
        ):
            if finished_at is None and long_done.value >= settings.long_handlers:
                finished_at = t
            polls = [probe_claim(probe_backend, harness) for _ in range(PROBES_PER_SAMPLE)]
            count = handled.value
            sample = {
                "t_s": round(t, 3),
                "phase": _phase(long_running.value, long_done.value, settings.long_handlers),
                "short_jobs_per_s": (count - last_count) / (t - last_t) if t > last_t else 0.0,
                "poll_ms": statistics.median(polls) * 1000,
                "long_running": long_running.value,
                **server.read(),
            }
            samples.append(sample)
            last_t, last_count = t, count
            if not enqueued_long and t >= settings.long_before_s:
                # After this sample, so the last one before the long handlers is still "before".
                conn = harness.connect()
                for i in range(settings.long_handlers):
                    enqueue(conn, LONG_JOB_TYPE, {"i": i}, queue=LONG_QUEUE, job_table=harness.job_table)
                conn.commit()
                conn.close()
                enqueued_long = True
            progress.advance(task)
            time.sleep(max(0.0, settings.long_sample_s - (time.monotonic() - start - t)))
    finally:
        stream.stop()
        long.stop()
        short.stop()
        for backend in backends:
            backend.close()
    progress.done(task)
    return {
        "backend": harness.name,
        "factory": spec.factory,
        "long_handlers": settings.long_handlers,
        "hold_s": settings.long_hold_s,
        "stream_rate_per_s": settings.long_stream_rate,
        "stream_threads": settings.long_stream_threads,
        "sample_s": settings.long_sample_s,
        "hold_s_observed": _observed(samples),
        "lock_wait_source": server.lock_wait_table,
        "enqueued_short": stream.sent,
        "handled_short": handled.value,
        "phases": {p: phase_summary(samples, p, dialect) for p in ("before", "during", "after")},
        "samples": samples,
    }


def _phase(running: int, done: int, handlers: int) -> str:
    """By what the long handlers were doing: none started yet, some running, all finished."""
    if done >= handlers:
        return "after"
    return "during" if running or done else "before"


def _observed(samples: list[dict[str, Any]]) -> list[float] | None:
    """First and last sample time at which a long handler was running."""
    during = [s["t_s"] for s in samples if s["phase"] == "during"]
    return [during[0], during[-1]] if during else None
