"""Prometheus metrics of a running worker, from its `log` events, and queue depth and lag at scrape time.

Nothing in the worker changes: `WorkerMetrics.log_for(queue, log)` is a `log` function that counts the
event and passes it on. Needs prometheus_client (pip install 'proletarian-ref[metrics]').
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from proletarian_ref import log as ev
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.keywords import from_keyword_text, to_keyword_text
from proletarian_ref.log import LogFn
from proletarian_ref.ops.db import Tables
from proletarian_ref.ops.stats import QueueStats, queue_stats

_LABELS: Final = ("queue", "job_type")
# The job types that get a label value of their own; the rest share OTHER_JOB_TYPES, so that a scrape stays
# small however many job types the jobs carry.
DEFAULT_MAX_JOB_TYPES: Final = 20
# Parentheses end a Clojure keyword, so no job type is ever spelt so.
OTHER_JOB_TYPES: Final = "(other)"
# Handler times from a few milliseconds to several minutes.
_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_ENDS: Final = frozenset(
    (ev.JOB_FINISHED, ev.HANDLE_JOB_EXCEPTION, ev.JOB_INTERRUPTED, ev.HANDLE_JOB_EXCEPTION_WITH_INTERRUPT)
)


class WorkerMetrics:
    """The counters and histogram a worker's events feed, in a registry of their own.

    The first `max_job_types` job types seen get a `job_type` label value of their own; later ones are
    counted under OTHER_JOB_TYPES (0: every job type is).
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, max_job_types: int = DEFAULT_MAX_JOB_TYPES
    ) -> None:
        if isinstance(max_job_types, bool) or not isinstance(max_job_types, int) or max_job_types < 0:
            raise ConfigurationError(f"max_job_types must be a whole number >= 0, got {max_job_types!r}")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_job_types = max_job_types
        self._job_types: set[str] = set()

        def counter(name: str, doc: str, labels: tuple[str, ...] = _LABELS) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        self.processed = counter("proletarian_jobs_processed", "Handler runs that ended (returned or raised)")
        self.succeeded = counter("proletarian_jobs_succeeded", "Handler runs that returned (archived)")
        self.failed = counter("proletarian_jobs_failed", "Handler runs that raised (each failed attempt)")
        self.retried = counter("proletarian_jobs_retried", "Failed jobs rescheduled for another attempt")
        self.given_up = counter(
            "proletarian_jobs_given_up", "Failed jobs with no retry left, archived as :failure"
        )
        self.interrupted = counter(
            "proletarian_jobs_interrupted", "Handler runs ended by a stop; the job stays queued"
        )
        self.polling_errors = counter(
            "proletarian_polling_errors",
            "Polling errors by kind (transient, error)",
            ("queue", "kind"),
        )
        self.duration = Histogram(
            "proletarian_handler_duration_seconds",
            "How long handlers ran",
            _LABELS,
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._started: dict[tuple[Any, Any], float] = {}
        self._lock = threading.Lock()

    def observe(self, queue: str, event: str, data: Mapping[str, Any]) -> None:
        """Count one event of a worker on `queue` (keyword text or name)."""
        name = from_keyword_text(queue)
        job_type = self._job_type_label(str(data.get(ev.JOB_TYPE, "")))
        thread = (data.get(ev.QUEUE_WORKER_ID), data.get(ev.WORKER_THREAD_ID))
        if event == ev.HANDLING_JOB:
            with self._lock:
                self._started[thread] = time.perf_counter()
            return
        if event in _ENDS:
            with self._lock:
                started = self._started.pop(thread, None)
            if started is not None:
                self.duration.labels(name, job_type).observe(time.perf_counter() - started)
            if event in (ev.JOB_INTERRUPTED, ev.HANDLE_JOB_EXCEPTION_WITH_INTERRUPT):
                self.interrupted.labels(name, job_type).inc()
                return
            self.processed.labels(name, job_type).inc()
            (self.succeeded if event == ev.JOB_FINISHED else self.failed).labels(name, job_type).inc()
        elif event == ev.RETRYING:
            self.retried.labels(name, job_type).inc()
        elif event == ev.NOT_RETRYING:
            self.given_up.labels(name, job_type).inc()
        elif event == ev.SQL_TRANSIENT_EXCEPTION:
            self.polling_errors.labels(name, "transient").inc()
        elif event == ev.JOB_WORKER_ERROR:
            self.polling_errors.labels(name, "error").inc()

    def _job_type_label(self, job_type: str) -> str:
        with self._lock:
            if job_type in self._job_types:
                return job_type
            if len(self._job_types) < self.max_job_types:
                self._job_types.add(job_type)
                return job_type
        return OTHER_JOB_TYPES

    def log_for(self, queue: str, log: LogFn) -> LogFn:
        """A worker `log` that counts each event, then hands it to `log`."""

        def counting_log(event: str, data: Mapping[str, Any]) -> None:
            self.observe(queue, event, data)
            log(event, data)

        return counting_log


class QueueCollector(Collector):
    """Queue depth (due, running and scheduled jobs) and lag (the oldest waiting job's age), queried at
    each scrape, for exactly the `queues` served (keyword text or names): a served queue with no jobs has
    its series at 0, and no other queue has any."""

    def __init__(
        self, connect: Callable[[], Any], tables: Tables, dialect: str, queues: Iterable[str]
    ) -> None:
        self._connect = connect
        self._tables = tables
        self._dialect = dialect
        self._queues = sorted({from_keyword_text(to_keyword_text(q, what="queue")) for q in queues})
        self._conn: Any = None
        self._lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "proletarian_queue_depth",
            "Queued jobs: due now and waiting, running (held by a worker), or scheduled",
            labels=["queue", "state"],
        )
        lag = GaugeMetricFamily(
            "proletarian_queue_lag_seconds",
            "Age of the oldest due job no worker holds (0: none)",
            labels=["queue"],
        )
        up = GaugeMetricFamily("proletarian_queue_stats_up", "1 if the last scrape could read the job table")
        try:
            stats = self._stats()
        except Exception:
            up.add_metric([], 0)
        else:
            up.add_metric([], 1)
            found = {q.queue: q for q in stats.queues}
            for name in self._queues:
                q = found.get(name, QueueStats(queue=name))
                depth.add_metric([name, "due"], q.due)
                depth.add_metric([name, "running"], q.running)
                depth.add_metric([name, "scheduled"], q.scheduled)
                age = q.oldest_due_age
                lag.add_metric([name], 0.0 if age is None else age.total_seconds())
        yield from (depth, lag, up)

    def _stats(self) -> Any:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._connect()
                return queue_stats(
                    self._conn,
                    job_table=self._tables.job,
                    archived_job_table=self._tables.archived,
                    dialect=self._dialect,
                    archived=False,
                    queues=self._queues,
                )
            except Exception:
                self.close_locked()
                raise

    def close_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> Callable[[], None]:
    """Serve /metrics on host:port in a background thread; returns the function that stops it."""
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return stop
