"""The queue worker: polling threads that claim, run, retry and archive jobs (proletarian.worker)."""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from proletarian_ref import log as ev
from proletarian_ref._sync.job_run import handle_job, run_next_batch, run_next_job, write_failure
from proletarian_ref._sync.job_timeout import JobTimeout
from proletarian_ref._sync.lifecycle import Lifecycle
from proletarian_ref.backend import Backend, Listener
from proletarian_ref.backends import backend_for_data_source, refuse_async
from proletarian_ref.clock import Clock
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.interrupts import bind_stop_event
from proletarian_ref.job_ids import JobIdStrategy
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text
from proletarian_ref.log import LogFn, stdlib_logger
from proletarian_ref.retry import FailedJobFn, RetryStrategyFn
from proletarian_ref.serializers import Serializer
from proletarian_ref.shutdown_hook import hook, unhook
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName, table_name
from proletarian_ref.watchdog import DEFAULT_JOB_TIMEOUT_GRACE_MS, Watchdog, check_job_timeout
from proletarian_ref.worker_core import (
    DEFAULT_WAKE_ON_NOTIFY,
    LISTENER_UNCONFIRMED_ADVICE,
    MAX_ERROR_BACKOFF_S,
    MAX_LISTENER_BACKOFF_S,
    MAX_TRANSIENT_BACKOFF_S,
)
from proletarian_ref.worker_settings import (
    GIVEN_BACK,
    HANDLER_FN_MODES,
    HandlerFn,
    HandlerFnMode,
    JobSettings,
    check_batch_size,
    job_settings,
)

# The job transaction and the options it reads are their own units; their names stay importable here.
__all__ = [
    "DEFAULT_WAKE_ON_NOTIFY",
    "GIVEN_BACK",
    "HANDLER_FN_MODES",
    "LISTENER_UNCONFIRMED_ADVICE",
    "MAX_ERROR_BACKOFF_S",
    "MAX_LISTENER_BACKOFF_S",
    "MAX_TRANSIENT_BACKOFF_S",
    "HandlerFn",
    "HandlerFnMode",
    "JobSettings",
    "QueueWorker",
    "check_batch_size",
    "check_worker_options",
    "create_queue_worker",
    "handle_job",
    "job_settings",
    "process_next_job",
    "run_next_job",
    "worker_arguments",
    "write_failure",
]


def process_next_job(
    data_source: Any,
    handler_fn: HandlerFn,
    *,
    log: LogFn | None = None,
    backend: Backend | None = None,
    **options: Any,
) -> bool | None:
    """Run the next due job by hand, for tests and a REPL (proletarian.worker/process-next-job!).

    Returns None when no job was due, True when one ran. Takes the job options of create_queue_worker;
    unlike Proletarian it applies their defaults. With batch_size > 1 it runs one batch: up to that many
    due jobs in one transaction (docs/worker.md, "Batch mode").
    """
    active, own_backend = _backend_for(data_source, backend)
    try:
        settings = job_settings(active, **options)
        run = run_next_job if settings.batch_size == 1 else run_next_batch
        return run(
            active, settings, handler_fn, log if log is not None else stdlib_logger, {}, threading.Event()
        )
    finally:
        if own_backend:
            active.close()


def _backend_for(data_source: Any, backend: Backend | None) -> tuple[Backend, bool]:
    """The backend to run on, and whether the caller lent it (False) or it is built here, ours to close.

    A Backend passed as `backend=` or as the data source, or one the data source hands over through
    proletarian_backend(), belongs to the caller; a pool passed as the data source is never closed either.
    """
    if backend is not None:
        refuse_async(backend, "backend=")
        return backend, False
    lent = isinstance(data_source, Backend) or callable(getattr(data_source, "proletarian_backend", None))
    return backend_for_data_source(data_source), not lent


def _stop_worker(error: BaseException) -> bool:
    """The default on_polling_error: any unexpected error stops the queue worker, as in Proletarian."""
    return True


def _noop() -> None:
    return None


class QueueWorker(JobTimeout, Lifecycle):
    """Polling threads over one queue; build it with create_queue_worker."""

    backend: Backend
    _lock: threading.RLock

    def __init__(
        self,
        backend: Backend,
        handler_fn: HandlerFn,
        settings: JobSettings,
        *,
        log: LogFn,
        queue_worker_id: str,
        polling_interval_ms: float,
        worker_threads: int,
        on_polling_error: Callable[[BaseException], object],
        await_termination_timeout_ms: float,
        install_shutdown_hook: bool,
        on_shutdown: Callable[[], object],
        owns_backend: bool = False,
        wake_on_notify: bool = False,
        listen_data_source: Any = None,
        job_timeout_ms: float | None = None,
        job_timeout_grace_ms: float = DEFAULT_JOB_TIMEOUT_GRACE_MS,
    ) -> None:
        super().__init__(
            backend,
            handler_fn,
            settings,
            log=log,
            queue_worker_id=queue_worker_id,
            polling_interval_ms=polling_interval_ms,
            worker_threads=worker_threads,
            on_polling_error=on_polling_error,
            await_termination_timeout_ms=await_termination_timeout_ms,
            on_shutdown=on_shutdown,
            owns_backend=owns_backend,
            wake_on_notify=wake_on_notify,
            listen_data_source=listen_data_source,
            job_timeout_ms=job_timeout_ms,
            job_timeout_grace_ms=job_timeout_grace_ms,
        )
        self._install_shutdown_hook = install_shutdown_hook
        # Guards the stop request against a handler's start: stop_event is set, and a handler admitted,
        # under it, so no handler starts once stop() has begun.
        self._lock = threading.RLock()  # re-entered by a signal handler that interrupts start()
        self._stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        # The thread numbers whose work stop() released at its deadline.
        self._released: set[int] = set()
        self._wake = threading.Condition(threading.Lock())
        self._listener_thread: threading.Thread | None = None
        self._listener: Listener | None = None  # set and read under _lock, so stop() can interrupt it
        # The job timeout, when there is one: each thread's own interrupt (set by stop() and by its job's
        # deadline), and, under _lock, the threads whose transaction the watchdog ended.
        self._watchdog: Watchdog | None = None
        self._interrupts: dict[int, threading.Event] = {}
        self._timeout_released: set[int] = set()
        if job_timeout_ms is not None:
            self._watchdog = Watchdog(
                self.queue_worker_id,
                job_timeout_ms / 1000,
                job_timeout_grace_ms / 1000,
                self._at_deadline,
                self._after_grace,
            )
            self._interrupts = {n: threading.Event() for n in range(1, worker_threads + 1)}

    # -- lifecycle -------------------------------------------------------------------------------------

    # Start-up: the threads inherit daemon-ness from the thread calling start(), as a JVM thread does,
    # so a worker started on the main thread keeps the process alive after the main thread returns, like
    # Proletarian's: stop it with stop(), a `with` block, or a signal with install_shutdown_hook=True.
    #
    # Stop: from the call on, no thread claims a job and no handler starts; a job claimed meanwhile goes
    # back untouched. A handler already running sees the request through proletarian_ref.interrupted() /
    # sleep() and may give its job back (JobInterrupted: attempts unchanged); one that ignores it may
    # finish, and its job is archived. Threads still busy at the deadline are released: a running job's
    # connection is closed, so the database rolls its transaction back and another worker can claim the
    # job with attempts unchanged, and whatever the handler does when it returns is not written; a claim
    # still in progress is abandoned the same way. Then stop() raises ShutdownTimeoutError and skips
    # on_shutdown, as Proletarian does, because those threads are still running. A second stop() logs
    # already-shut-down and calls on_shutdown again, as Proletarian's does.
    _ON_SHUTDOWN_AGAIN = True

    def _hook_signals(self) -> None:
        if self._install_shutdown_hook:
            hook(self)

    def _unhook_signals(self) -> None:
        unhook(self)

    def _request_stop(self) -> Listener | None:
        with self._lock:
            self._stop_event.set()
            for interrupt in self._interrupts.values():
                interrupt.set()
            return self._listener

    def _drain(self, timeout: float) -> list[tuple[int, threading.Thread]]:
        deadline = time.monotonic() + timeout
        current = threading.current_thread()
        listener = [self._listener_thread] if self._listener_thread is not None else []
        for thread in [*self._threads, *listener]:
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))
        return [
            (n, thread)
            for n, thread in enumerate(self._threads, 1)
            if thread.is_alive() and thread is not current
        ]

    def _releasing(self, n: int) -> dict[str, Any]:
        self._released.add(n)
        return dict(self._current_jobs.get(n, {}))

    def _release_poller(self, poller: threading.Thread) -> bool | None:
        release = getattr(self.backend, "release_connection", None)
        if release is None:
            return None
        # By thread ident: only this thread's transaction, never another worker's on a shared backend.
        return poller.ident is not None and bool(release(poller.ident))

    def _drained(self, stuck: list[tuple[int, threading.Thread]]) -> None:
        if self._watchdog is not None:
            self._watchdog.close()

    # -- polling ---------------------------------------------------------------------------------------

    def _may_handle(self, n: int) -> Callable[[Mapping[str, Any]], bool]:
        lock, stopping, current = self._lock, self._stop_event.is_set, self._current_jobs

        def may_handle(job_context: Mapping[str, Any]) -> bool:
            running = {
                ev.JOB_ID: job_context[ev.JOB_ID],
                ev.JOB_TYPE: job_context[ev.JOB_TYPE],
                ev.ATTEMPT: job_context[ev.ATTEMPT],
            }
            # Checked under the lock stop() sets the event with: a handler either starts before stop()
            # begins, and is drained or released, or never starts. acquire and release rather than
            # `with`, which costs twice as much, twice per job.
            lock.acquire()
            try:
                if stopping():
                    return False
                current[n] = running
                return True
            finally:
                lock.release()

        return may_handle

    def _poller_ended(self) -> None:
        # A worker on a lent backend gives back the connection its thread opened, and only that one.
        close_thread_connection = getattr(self.backend, "close_thread_connection", None)
        if close_thread_connection is not None:
            with contextlib.suppress(Exception):
                close_thread_connection()

    def _run_over(self, n: int) -> None:
        lock = self._lock
        lock.acquire()  # as in may_handle
        try:
            self._current_jobs.pop(n, None)
        finally:
            lock.release()

    def _run_failed(self, n: int) -> tuple[bool, bool, dict[str, Any]]:
        with self._lock:
            released, running = n in self._released, self._current_jobs.pop(n, {})
            expired = n in self._timeout_released
            self._timeout_released.discard(n)
        # A job released by its timeout: _finish dropped its connection, and the thread polls again.
        return released, expired, running

    # -- the job timeout -------------------------------------------------------------------------------

    def _poller_handler(self, n: int) -> HandlerFn:
        """Set thread n up to run handlers: what interrupted() reads, the server limits checked once per
        worker (on thread 1, before its first poll), the job bound if any."""
        bind_stop_event(self._interrupts.get(n, self._stop_event))
        if n == 1:
            self._check_server_limits()
        if self._watchdog is None:
            return self.handler_fn
        return self._timed_handler(n, self.handler_fn, self._watchdog)

    def _arm(self, n: int, token: object) -> None:
        self._timeout_released.discard(n)
        if not self._stop_event.is_set():
            self._interrupts[n].clear()  # the last job's deadline is not this one's

    def _bound(self, n: int) -> contextlib.nullcontext[None]:
        # A thread cannot be ended from outside: _end_handler ends its transaction instead.
        return contextlib.nullcontext()

    def _disarm(self, n: int) -> None:
        # Nothing to undo: the thread's interrupt is cleared as its next handler starts (_arm), not here,
        # where stop() may have just set it.
        return None

    def _tell_late(self, n: int) -> None:
        self._interrupts[n].set()

    def _end_handler(self, n: int) -> bool:
        # A backend that cannot end a session from another (end_transaction) closes the connection, as at
        # stop()'s deadline.
        release = getattr(self.backend, "end_transaction", None) or getattr(
            self.backend, "release_connection", None
        )
        thread = self._threads[n - 1]
        if release is None or thread.ident is None:
            return False
        done = bool(release(thread.ident))
        if done:
            self._timeout_released.add(n)
        return done

    def _close_listener(self, listener: Listener) -> None:
        with contextlib.suppress(Exception):
            listener.close()

    def _stop_in_background(self) -> None:
        # A polling thread cannot join itself, so another thread stops the worker. Not a daemon: the
        # process must not exit half way through stop() (it ends within await_termination_timeout_ms).
        threading.Thread(
            target=self._stop_logging_errors, name=f"{self.queue_worker_id}-stop", daemon=False
        ).start()

    def _stop_logging_errors(self) -> None:
        """stop() where no caller could catch its error (on a signal, or after a polling thread's error)."""
        try:
            self.stop()
        except BaseException as exc:
            self._safe_log(
                ev.QUEUE_WORKER_SHUTDOWN_ERROR, {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.THROWABLE: exc}
            )

    def _threads_alive(self) -> bool:
        current = threading.current_thread()
        return any(t.is_alive() for t in self._threads if t is not current)


def check_worker_options(options: Mapping[str, Any]) -> None:
    """Refuse a worker option of the wrong kind or range, naming it, before any backend or connection is
    made (the threaded and asyncio workers; `options` holds every name of WORKER_OPTION_DEFAULTS)."""
    worker_threads = options["worker_threads"]
    if not isinstance(worker_threads, int) or isinstance(worker_threads, bool) or worker_threads < 1:
        raise ConfigurationError(f"worker_threads must be an int >= 1, got {worker_threads!r}")
    # Proletarian's scheduleWithFixedDelay refuses a polling delay <= 0 (IllegalArgumentException from
    # start!); here the same refusal comes before anything runs.
    for name, zero_ok in (("polling_interval_ms", False), ("await_termination_timeout_ms", True)):
        value = options[name]
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not (number and (value >= 0 if zero_ok else value > 0) and value < 10**12):
            least = ">= 0" if zero_ok else "> 0"
            raise ConfigurationError(f"{name} must be a number of milliseconds {least}, got {value!r}")
    if not isinstance(options["wake_on_notify"], bool):
        raise ConfigurationError(f"wake_on_notify must be True or False, got {options['wake_on_notify']!r}")
    for name in ("log", "on_polling_error", "on_shutdown"):
        if options[name] is not None and not callable(options[name]):
            raise ConfigurationError(f"{name} must be callable, got {options[name]!r}")
    # Names are checked before the data source is asked for a connection: a bad one opens nothing.
    table_name(options["job_table"], option="job_table")
    table_name(options["archived_job_table"], option="archived_job_table")
    to_keyword_text(options["queue"], what="queue")
    check_batch_size(options["batch_size"])
    check_job_timeout(options["job_timeout_ms"], options["job_timeout_grace_ms"])


def _or(value: Any, default: Any) -> Any:
    return value if value is not None else default


_JOB_OPTIONS: Final = (
    *("queue", "job_table", "archived_job_table", "serializer", "job_id_strategy", "handler_fn_mode"),
    *("retry_strategy_fn", "failed_job_fn", "clock", "batch_size"),
)


def worker_arguments(backend: Any, options: Mapping[str, Any]) -> tuple[JobSettings, dict[str, Any]]:
    """The job settings on `backend`, and the worker's own keyword arguments, defaults applied."""
    settings = job_settings(backend, **{name: options[name] for name in _JOB_OPTIONS})
    log, worker_id = options["log"], options["queue_worker_id"]
    return settings, {
        "log": log if log is not None else stdlib_logger,
        "queue_worker_id": worker_id if worker_id is not None else f"proletarian[{settings.queue}]",
        "polling_interval_ms": options["polling_interval_ms"],
        "worker_threads": options["worker_threads"],
        "on_polling_error": _or(options["on_polling_error"], _stop_worker),
        "await_termination_timeout_ms": options["await_termination_timeout_ms"],
        "on_shutdown": _or(options["on_shutdown"], _noop),
        "wake_on_notify": options["wake_on_notify"],
        "listen_data_source": options["listen_data_source"],
        "job_timeout_ms": options["job_timeout_ms"],
        "job_timeout_grace_ms": options["job_timeout_grace_ms"],
    }


def create_queue_worker(
    data_source: Any,
    handler_fn: HandlerFn,
    *,
    queue: str = DEFAULT_QUEUE,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    serializer: Serializer | None = None,
    job_id_strategy: JobIdStrategy | None = None,
    handler_fn_mode: str = "default",
    retry_strategy_fn: RetryStrategyFn | None = None,
    failed_job_fn: FailedJobFn | None = None,
    log: LogFn | None = None,
    queue_worker_id: str | None = None,
    polling_interval_ms: float = 100,
    worker_threads: int = 1,
    on_polling_error: Callable[[BaseException], object] | None = None,
    await_termination_timeout_ms: float = 10_000,
    install_shutdown_hook: bool = False,
    on_shutdown: Callable[[], object] | None = None,
    clock: Clock | None = None,
    backend: Backend | None = None,
    batch_size: int = 1,
    wake_on_notify: bool = DEFAULT_WAKE_ON_NOTIFY,
    listen_data_source: Any = None,
    job_timeout_ms: float | None = None,
    job_timeout_grace_ms: float = DEFAULT_JOB_TIMEOUT_GRACE_MS,
) -> QueueWorker:
    """A queue worker over `data_source` (a psycopg_pool.ConnectionPool or a zero-argument connection
    factory); nothing runs until start(). Options mirror Proletarian's create-queue-worker.

    The worker closes only what it opened: the connections it took from a factory. A pool, a Backend
    (as `backend=` or as the data source) and the factory itself stay the caller's to close.

    `batch_size` > 1 is batch mode, not Proletarian's: each transaction claims and runs up to that many
    jobs and commits once (docs/worker.md, "Batch mode").

    With `wake_on_notify`, on a backend that can (PostgreSQL, in-memory) one more thread keeps one more
    connection LISTENing, from `listen_data_source` if given (a factory or a pool: e.g. a direct DSN when
    the workers go through PgBouncer in transaction mode), else from the data source (for a pool, made
    as the pool makes its connections but outside it, so it takes no slot of the polling threads). A job
    enqueued with notify then starts at once; polling still runs every other job. Elsewhere (MySQL) the
    option changes nothing.

    With `job_timeout_ms`, a job's handler that runs that long is told (interrupted() turns true, sleep()
    raises JobInterrupted); if it then raises, the job fails with JobTimeoutError (retry_strategy_fn
    decides, as for any failure); if it has not returned after `job_timeout_grace_ms` more, its session is
    ended from another one, so the server rolls its transaction back and the job goes back to the queue
    with attempts unchanged (docs/worker.md, "Job timeout").
    """
    options = {name: value for name, value in locals().items() if name in WORKER_OPTION_DEFAULTS}
    if not callable(handler_fn):
        raise ConfigurationError(f"handler_fn must be callable, got {handler_fn!r}")
    check_worker_options(options)
    active, owns_backend = _backend_for(data_source, backend)
    try:
        settings, arguments = worker_arguments(active, options)
    except BaseException:
        if owns_backend:
            active.close()
        raise
    return QueueWorker(
        active,
        handler_fn,
        settings,
        install_shutdown_hook=install_shutdown_hook,
        owns_backend=owns_backend,
        **arguments,
    )


# The options of create_queue_worker, by name, with their defaults: the asyncio worker takes the same.
WORKER_OPTION_DEFAULTS: Final = {
    name: parameter.default
    for name, parameter in inspect.signature(create_queue_worker).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("backend", "install_shutdown_hook")
}
