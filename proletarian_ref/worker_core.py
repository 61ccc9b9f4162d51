"""What the threaded and the asyncio queue workers share: options, logging, what a failed poll means."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Final

from proletarian_ref import log as ev
from proletarian_ref.errors import TransientDatabaseError
from proletarian_ref.log import LogFn
from proletarian_ref.watchdog import DEFAULT_JOB_TIMEOUT_GRACE_MS, limit_warnings
from proletarian_ref.worker_settings import JobSettings

# After consecutive failed polling runs a thread waits twice as long each time, from the polling
# interval up to these caps (or the interval, if longer): a job that fails the same way on every run
# (Proletarian #30 with on_polling_error returning false) then cannot spin, and a database that is down
# is not hammered, yet one that comes back is polled again within a second.
MAX_ERROR_BACKOFF_S: Final = 30.0
MAX_TRANSIENT_BACKOFF_S: Final = 1.0
_MIN_BACKOFF_S: Final = 0.01
# The listener connection, once broken, is opened again after 0.1 s, doubling up to this cap; polling
# runs the jobs meanwhile.
MAX_LISTENER_BACKOFF_S: Final = 30.0
# How long one listener wait lasts; stop() and a notification end it at once, so it only bounds how
# long a listener whose interrupt failed keeps its thread after stop().
_LISTEN_TICK_S: Final = 5.0
# Whether a worker listens for enqueue notifications where its backend can (docs/worker.md).
DEFAULT_WAKE_ON_NOTIFY: Final = True
LISTENER_UNCONFIRMED_ADVICE: Final = (
    "a test notification sent as enqueuers send theirs did not reach the worker's listener: behind "
    "PgBouncer in transaction mode LISTEN keeps no server session. Jobs still run, at the polling "
    "interval. Give the worker listen_data_source= (a direct or session-mode connection), or "
    "wake_on_notify=False (docs/scaling.md)"
)


def backoff(interval: float, failures: int, cap: float) -> float:
    """How long a polling thread (or task) waits after `failures` failed runs in a row, up to `cap`."""
    # From at least 10 ms, so that even a 1 ms polling interval cannot spin on a failing job.
    first = max(interval, _MIN_BACKOFF_S)
    return min(first * 2.0 ** min(failures - 1, 32), max(cap, interval))


class WorkerCore:
    """The options a queue worker keeps, its logging, and what a failed poll means; _async/wake.py,
    poll_loop.py, drain.py, job_timeout.py and lifecycle.py (and their generated _sync twins) add how it
    runs, QueueWorker (threads) and aio.AsyncQueueWorker (tasks) what differs between the two."""

    # Guards the stop request against a handler's start, and a job's bound against its handler's return
    # (the threaded worker's lock; on the one event loop thread, nothing to guard).
    _lock: AbstractContextManager[Any]

    def __init__(
        self,
        backend: Any,
        handler_fn: Callable[..., Any],
        settings: JobSettings,
        *,
        log: LogFn,
        queue_worker_id: str,
        polling_interval_ms: float,
        worker_threads: int,
        on_polling_error: Callable[[BaseException], object],
        await_termination_timeout_ms: float,
        on_shutdown: Callable[[], object],
        owns_backend: bool = False,
        wake_on_notify: bool = False,
        listen_data_source: Any = None,
        job_timeout_ms: float | None = None,
        job_timeout_grace_ms: float = DEFAULT_JOB_TIMEOUT_GRACE_MS,
    ) -> None:
        self.backend = backend
        self.handler_fn = handler_fn
        self.settings = settings
        self.queue_worker_id = queue_worker_id
        self._log_fn = log
        self._interval = polling_interval_ms / 1000
        self._worker_threads = worker_threads
        self._on_polling_error = on_polling_error
        self._await_timeout = await_termination_timeout_ms / 1000
        self._on_shutdown = on_shutdown
        self._owns_backend = owns_backend
        self._started = False
        self._stopped = False
        # Per thread (or task) number: the job it is running, for logs and release.
        self._current_jobs: dict[int, dict[str, Any]] = {}
        # Instant wake-up: idle pollers wait until the interval ends, stop() or a new generation (a
        # notification for this queue, or a busy poller seeing a backlog) tells one of them to poll.
        self._listens = wake_on_notify and hasattr(backend, "listen")
        self._listen_data_source = listen_data_source
        self._wake_generation = 0
        # The per-job time bound (docs/worker.md, "Job timeout"); None: a job runs as long as it takes.
        self._job_timeout_ms = job_timeout_ms
        self._grace_ms = job_timeout_grace_ms
        # Under _lock, per poller: the token of the handler it runs, if bound, and of one past its deadline.
        self._timing: dict[int, object] = {}
        self._timed_out: dict[int, object] = {}

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    def _after_failure(
        self, exc: BaseException, failures: int, context: Mapping[str, Any], running: Mapping[str, Any]
    ) -> float | None:
        """Log a failed polling run: the delay before the next one, or None when the worker must stop."""
        if isinstance(exc, TransientDatabaseError):
            self._safe_log(ev.SQL_TRANSIENT_EXCEPTION, {**context, **running, ev.THROWABLE: exc})
            return backoff(self._interval, failures, MAX_TRANSIENT_BACKOFF_S)
        self._safe_log(ev.JOB_WORKER_ERROR, {**context, **running, ev.THROWABLE: exc})
        if self._polling_error_stops(exc):
            return None
        return backoff(self._interval, failures, MAX_ERROR_BACKOFF_S)

    def _listener_backoff(self, failures: int) -> float:
        return min(0.1 * 2.0 ** min(failures - 1, 32), MAX_LISTENER_BACKOFF_S)

    def _polling_error_stops(self, exc: BaseException) -> bool:
        try:
            return bool(self._on_polling_error(exc))
        except Exception as error:
            self._safe_log(
                ev.JOB_WORKER_ERROR, {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.THROWABLE: error}
            )
            return True

    def _timeout_data(self) -> dict[str, Any]:
        return {"job-timeout-ms": self._job_timeout_ms, "job-timeout-grace-ms": self._grace_ms}

    def _log_server_limits(self, limits: Mapping[str, float] | None) -> None:
        """Warn of each server limit that ends a job's transaction before the worker's own bound does."""
        for data in limit_warnings(limits or {}, self._job_timeout_ms, self._grace_ms):
            self._safe_log(ev.SERVER_TIME_LIMIT, {ev.QUEUE_WORKER_ID: self.queue_worker_id, **data})

    def _server_limits_failed(self, exc: BaseException) -> None:
        # Not worth stopping for: the check only advises, and a database that is down shows in the polls.
        ev.logger.debug("could not read the server's transaction time limits: %s", exc)

    def _safe_log(self, event: str, data: Mapping[str, Any]) -> None:
        # Outside a job nothing else would catch a failing log function, and a poller must not die
        # silently because of one.
        try:
            self._log_fn(event, data)
        except Exception:
            ev.logger.exception("log function failed on %s", event)
