"""The queue worker: polling threads that claim, run, retry and archive jobs (proletarian.worker)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, Final, Literal

from proletarian_ref import log as ev
from proletarian_ref.backend import STATUS_SUCCESS, Backend, JobRecord
from proletarian_ref.backends import backend_for_data_source
from proletarian_ref.clock import Clock, now_from, system_utc
from proletarian_ref.errors import (
    ConfigurationError,
    JobInterrupted,
    PayloadDecodeError,
    ShutdownTimeoutError,
    TransientDatabaseError,
)
from proletarian_ref.interrupts import bind_stop_event
from proletarian_ref.job import Job, default_serializer
from proletarian_ref.job_ids import JobIdStrategy, default_job_id_strategy
from proletarian_ref.keywords import DEFAULT_QUEUE, from_keyword_text, to_keyword_text
from proletarian_ref.log import LogFn, stdlib_logger
from proletarian_ref.retry import FailedJobFn, RetryStrategyFn, maybe_retry, no_failed_job_fn, no_retries
from proletarian_ref.serializers import Serializer
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName, table_name

HandlerFnMode = Literal["default", "advanced"]
HandlerFn = Callable[..., object]
HANDLER_FN_MODES: Final = ("default", "advanced")

# After consecutive failed polling runs a thread waits twice as long each time, from the polling
# interval up to these caps (or the interval, if longer): a job that fails the same way on every run
# (Proletarian #30 with on_polling_error returning false) then cannot spin, and a database that is down
# is not hammered, yet one that comes back is polled again within a second.
MAX_ERROR_BACKOFF_S: Final = 30.0
MAX_TRANSIENT_BACKOFF_S: Final = 1.0
_MIN_BACKOFF_S: Final = 0.01


@dataclass(frozen=True, slots=True)
class JobSettings:
    """The options that running one job reads (the config map of process-next-job!)."""

    queue: str
    job_table: TableName
    archived_job_table: TableName
    serializer: Serializer
    job_id_strategy: JobIdStrategy
    handler_fn_mode: HandlerFnMode
    retry_strategy_fn: RetryStrategyFn
    failed_job_fn: FailedJobFn
    clock: Clock


def job_settings(
    backend: Backend,
    *,
    queue: str = DEFAULT_QUEUE,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    serializer: Serializer | None = None,
    job_id_strategy: JobIdStrategy | None = None,
    handler_fn_mode: str = "default",
    retry_strategy_fn: RetryStrategyFn | None = None,
    failed_job_fn: FailedJobFn | None = None,
    clock: Clock | None = None,
) -> JobSettings:
    """Apply defaults and check every option before anything runs."""
    if handler_fn_mode not in HANDLER_FN_MODES:
        raise ConfigurationError(
            f"handler_fn_mode must be one of {', '.join(map(repr, HANDLER_FN_MODES))}, "
            f"got {handler_fn_mode!r}"
        )
    serializer = serializer if serializer is not None else default_serializer()
    if not (callable(getattr(serializer, "encode", None)) and callable(getattr(serializer, "decode", None))):
        raise ConfigurationError(f"serializer must have encode and decode methods, got {serializer!r}")
    strategy = job_id_strategy if job_id_strategy is not None else default_job_id_strategy(backend.dialect)
    if not all(callable(getattr(strategy, m, None)) for m in ("generate_id", "encode_id", "decode_id")):
        raise ConfigurationError(f"job_id_strategy must implement JobIdStrategy, got {strategy!r}")
    for name, fn in (
        ("retry_strategy_fn", retry_strategy_fn),
        ("failed_job_fn", failed_job_fn),
        ("clock", clock),
    ):
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"{name} must be callable, got {fn!r}")
    return JobSettings(
        queue=to_keyword_text(queue, what="queue"),
        job_table=table_name(job_table, option="job_table"),
        archived_job_table=table_name(archived_job_table, option="archived_job_table"),
        serializer=serializer,
        job_id_strategy=strategy,
        handler_fn_mode="advanced" if handler_fn_mode == "advanced" else "default",
        retry_strategy_fn=retry_strategy_fn if retry_strategy_fn is not None else no_retries,
        failed_job_fn=failed_job_fn if failed_job_fn is not None else no_failed_job_fn,
        clock=clock if clock is not None else system_utc,
    )


def _to_job(record: JobRecord, settings: JobSettings) -> tuple[Job, PayloadDecodeError | None]:
    """Decode a claimed row; a payload that does not decode becomes the job's failure, not the worker's."""
    error: PayloadDecodeError | None = None
    try:
        payload = settings.serializer.decode(record.payload)
    except Exception as exc:
        error = (
            exc
            if isinstance(exc, PayloadDecodeError)
            else PayloadDecodeError(f"payload does not decode: {exc}")
        )
        if error is not exc:
            error.__cause__ = exc
        payload = record.payload
    # _make, in Job's field order: the generated __new__ with keywords costs six times as much.
    job = Job._make(
        (
            settings.job_id_strategy.decode_id(record.job_id),
            from_keyword_text(record.queue),
            from_keyword_text(record.job_type),
            payload,
            record.attempts + 1,
            record.enqueued_at,
            record.process_at,
        )
    )
    return job, error


def run_next_job(
    backend: Backend,
    settings: JobSettings,
    handler_fn: HandlerFn,
    log: LogFn,
    context: Mapping[str, Any],
    stop_event: threading.Event,
    may_handle: Callable[[Mapping[str, Any]], bool] | None = None,
) -> bool | None:
    """One poll in one transaction: None when no job was due, else whether the worker may go on.

    The handler runs inside the claiming transaction, holding the row lock, exactly as Proletarian does.
    No claim starts once `stop_event` is set (a thread may have waited for its connection meanwhile), and
    a claimed job whose `may_handle(job context)` is false goes back untouched, its handler never called.
    """
    with backend.transaction() as conn:
        if stop_event.is_set():
            return None
        record = backend.get_next_job(conn, settings.job_table, settings.queue, now_from(settings.clock))
        if record is None:
            return None
        job, decode_error = _to_job(record, settings)
        job_context = {**context, ev.JOB_ID: job.job_id, ev.JOB_TYPE: job.job_type, ev.ATTEMPT: job.attempts}
        if may_handle is not None and not may_handle(job_context):
            return False

        def job_log(event: str, data: Mapping[str, Any]) -> None:
            log(event, {**data, **job_context})

        # The default log function drops both events (INFO, log._LEVELS) unless someone listens at INFO:
        # one check per job instead of two calls that each find it out.
        quiet = log is stdlib_logger and not ev.logger.isEnabledFor(logging.INFO)
        try:
            if not quiet:
                log(ev.HANDLING_JOB, job_context)
            if decode_error is not None:
                raise decode_error
            if settings.handler_fn_mode == "advanced":
                handler_fn(job)
            else:
                handler_fn(job.job_type, job.payload)
            # Inside the try, as in Proletarian: a log function that raises here fails the job.
            if not quiet:
                log(ev.JOB_FINISHED, job_context)
        except JobInterrupted:
            job_log(ev.JOB_INTERRUPTED, {})
            return False
        except (MemoryError, RecursionError):
            # The JVM's OutOfMemoryError and StackOverflowError are Errors, not Exceptions: the process is
            # short of a resource, which is not the job's failure (docs/worker.md).
            raise
        except Exception as exc:
            if stop_event.is_set():
                job_log(ev.HANDLE_JOB_EXCEPTION_WITH_INTERRUPT, {ev.EXCEPTION: exc})
                return False
            job_log(ev.HANDLE_JOB_EXCEPTION, {ev.EXCEPTION: exc})
            maybe_retry(
                backend,
                conn,
                job_table=settings.job_table,
                archived_job_table=settings.archived_job_table,
                stored_job_id=record.job_id,
                job=job,
                exception=exc,
                retry_strategy_fn=settings.retry_strategy_fn,
                failed_job_fn=settings.failed_job_fn,
                clock=settings.clock,
                log=job_log,
            )
        else:
            finished_at = now_from(settings.clock)
            backend.archive_job(
                conn,
                settings.job_table,
                settings.archived_job_table,
                record.job_id,
                STATUS_SUCCESS,
                finished_at,
            )
            backend.delete_job(conn, settings.job_table, record.job_id)
        return not stop_event.is_set()


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
    unlike Proletarian it applies their defaults.
    """
    active, own_backend = _backend_for(data_source, backend)
    try:
        settings = job_settings(active, **options)
        return run_next_job(
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
        return backend, False
    lent = isinstance(data_source, Backend) or callable(getattr(data_source, "proletarian_backend", None))
    return backend_for_data_source(data_source), not lent


def _stop_worker(error: BaseException) -> bool:
    """The default on_polling_error: any unexpected error stops the queue worker, as in Proletarian."""
    return True


def _noop() -> None:
    return None


class QueueWorker:
    """Polling threads over one queue; build it with create_queue_worker."""

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
        self._install_shutdown_hook = install_shutdown_hook
        self._on_shutdown = on_shutdown
        self._owns_backend = owns_backend
        # Guards the stop request against a handler's start: stop_event is set, and a handler admitted,
        # under it, so no handler starts once stop() has begun.
        self._lock = threading.RLock()  # re-entered by a signal handler that interrupts start()
        self._stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._stopped = False
        # Per thread number: the job it is running (for logs and release) and whether stop() released it.
        self._current_jobs: dict[int, dict[str, Any]] = {}
        self._released: set[int] = set()

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> bool | None:
        """Start the polling threads; None if already started (a stopped worker cannot restart).

        The threads inherit daemon-ness from the thread calling start(), as a JVM thread does, so a
        worker started on the main thread keeps the process alive after the main thread returns, like
        Proletarian's: stop it with stop(), a `with` block, or a signal with install_shutdown_hook=True.
        """
        with self._lock:
            if self._started:
                return None
            self._started = True
            if self._install_shutdown_hook:
                _hook(self)
            for n in range(1, self._worker_threads + 1):
                thread = threading.Thread(target=self._work, args=(n,), name=f"{self.queue_worker_id}-{n}")
                self._threads.append(thread)
                thread.start()
            return True

    def stop(self) -> bool | None:
        """Stop polling, let running jobs drain for await_termination_timeout_ms, then release the rest.

        From the call on, no thread claims a job and no handler starts; a job claimed meanwhile goes back
        untouched. A handler already running sees the request through proletarian_ref.interrupted() /
        sleep() and may give its job back (JobInterrupted: attempts unchanged); one that ignores it may
        finish, and its job is archived. Threads still busy at the deadline are released: a running job's
        connection is closed, so the database rolls its transaction back and another worker can claim the
        job with attempts unchanged, and whatever the handler does when it returns is not written; a claim
        still in progress is abandoned the same way. Then stop() raises ShutdownTimeoutError and skips
        on_shutdown, as Proletarian does, because those threads are still running.
        """
        with self._lock:
            if not self._started:
                return None
            already = self._stopped
            self._stopped = True
        context = {ev.QUEUE_WORKER_ID: self.queue_worker_id}
        if already:
            self._safe_log(ev.ALREADY_SHUT_DOWN, context)
        else:
            _unhook(self)
            self._safe_log(ev.SHUTTING_DOWN, context)
            with self._lock:
                self._stop_event.set()
            deadline = time.monotonic() + self._await_timeout
            current = threading.current_thread()
            for thread in self._threads:
                if thread is not current:
                    thread.join(max(0.0, deadline - time.monotonic()))
            stuck = [
                (n, thread)
                for n, thread in enumerate(self._threads, 1)
                if thread.is_alive() and thread is not current
            ]
            still_running = self._release(stuck) if stuck else []
            if self._owns_backend:
                self.backend.close()
            if stuck:
                raise ShutdownTimeoutError(
                    f"Could not shut down the queue worker within {self._await_timeout * 1000:g} ms; "
                    f"still running: {'; '.join(still_running)}"
                )
            self._safe_log(ev.COMPLETED_SHUTDOWN, context)
        self._on_shutdown()
        return True

    def _release(self, stuck: list[tuple[int, threading.Thread]]) -> list[str]:
        """Release what the threads still running at the deadline hold; says, per thread, what it was."""
        release = getattr(self.backend, "release_connection", None)
        notes: list[str] = []
        for n, thread in stuck:
            with self._lock:
                self._released.add(n)
                job = dict(self._current_jobs.get(n, {}))
            # By thread ident: only this thread's transaction, never another worker's on a shared backend.
            done = release is not None and thread.ident is not None and bool(release(thread.ident))
            if not job:
                note = (
                    "no job yet: its claim was abandoned"
                    if done
                    else "no job yet: waiting for a database connection, nothing to release"
                )
            elif done:
                note = f"job {job[ev.JOB_ID]} released back to the queue"
                self._safe_log(
                    ev.JOB_RELEASED, {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.WORKER_THREAD_ID: n, **job}
                )
            elif release is None:
                note = f"job {job[ev.JOB_ID]} still running: this backend cannot release it"
            else:
                note = f"job {job[ev.JOB_ID]} finishing: its transaction had already ended"
            notes.append(f"{thread.name} ({note})")
        return notes

    def __enter__(self) -> QueueWorker:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    # -- polling ---------------------------------------------------------------------------------------

    def _may_handle(self, n: int) -> Callable[[Mapping[str, Any]], bool]:
        def may_handle(job_context: Mapping[str, Any]) -> bool:
            # Checked under the lock stop() sets the event with: a handler either starts before stop()
            # begins, and is drained or released, or never starts.
            with self._lock:
                if self._stop_event.is_set():
                    return False
                self._current_jobs[n] = {
                    ev.JOB_ID: job_context[ev.JOB_ID],
                    ev.JOB_TYPE: job_context[ev.JOB_TYPE],
                    ev.ATTEMPT: job_context[ev.ATTEMPT],
                }
                return True

        return may_handle

    def _work(self, n: int) -> None:
        try:
            self._poll(n)
        finally:
            # A worker on a lent backend gives back the connection its thread opened, and only that one.
            close_thread_connection = getattr(self.backend, "close_thread_connection", None)
            if close_thread_connection is not None:
                with contextlib.suppress(Exception):
                    close_thread_connection()

    def _poll(self, n: int) -> None:
        bind_stop_event(self._stop_event)
        outer = {ev.QUEUE_WORKER_ID: self.queue_worker_id}
        context = {**outer, ev.WORKER_THREAD_ID: n}
        current = self._current_jobs
        may_handle = self._may_handle(n)
        # Spread the threads' idle polls over the interval, as Proletarian's start-up jitter does, but
        # without blocking start().
        if n > 1 and self._stop_event.wait(random.uniform(0, min(self._interval, 1.0))):
            return
        failures = 0
        while not self._stop_event.is_set():
            delay = self._interval
            try:
                self._log_fn(ev.POLLING_FOR_JOBS, context)
                while not self._stop_event.is_set():
                    ran = run_next_job(
                        self.backend,
                        self.settings,
                        self.handler_fn,
                        self._log_fn,
                        context,
                        self._stop_event,
                        may_handle,
                    )
                    with self._lock:
                        current.pop(n, None)  # its transaction is over: nothing left to release
                    if ran is not True:
                        break
                failures = 0
            except BaseException as exc:
                with self._lock:
                    released, running = n in self._released, current.pop(n, {})
                if released:
                    if running:
                        self._safe_log(ev.RELEASED_JOB_RETURNED, {**context, **running, ev.THROWABLE: exc})
                    return
                failures += 1
                if isinstance(exc, TransientDatabaseError):
                    self._safe_log(ev.SQL_TRANSIENT_EXCEPTION, {**outer, **running, ev.THROWABLE: exc})
                    delay = self._backoff(failures, MAX_TRANSIENT_BACKOFF_S)
                else:
                    self._safe_log(ev.JOB_WORKER_ERROR, {**outer, **running, ev.THROWABLE: exc})
                    if self._polling_error_stops(exc):
                        self._stop_async()
                        return
                    delay = self._backoff(failures, MAX_ERROR_BACKOFF_S)
            self._stop_event.wait(delay)

    def _backoff(self, failures: int, cap: float) -> float:
        # From at least 10 ms, so that even a 1 ms polling interval cannot spin on a failing job.
        first = max(self._interval, _MIN_BACKOFF_S)
        return min(first * 2.0 ** min(failures - 1, 32), max(cap, self._interval))

    def _polling_error_stops(self, exc: BaseException) -> bool:
        try:
            return bool(self._on_polling_error(exc))
        except Exception as error:
            self._safe_log(
                ev.JOB_WORKER_ERROR, {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.THROWABLE: error}
            )
            return True

    def _stop_async(self) -> None:
        # A polling thread cannot join itself, so another thread stops the worker. Not a daemon: the
        # process must not exit half way through stop() (it ends within await_termination_timeout_ms).
        threading.Thread(
            target=self._stop_logging_errors, name=f"{self.queue_worker_id}-stop", daemon=False
        ).start()

    def _safe_log(self, event: str, data: Mapping[str, Any]) -> None:
        # Outside a job nothing else would catch a failing log function, and a polling thread must not
        # die silently because of one.
        try:
            self._log_fn(event, data)
        except Exception:
            ev.logger.exception("log function failed on %s", event)

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


# -- the shutdown hook ---------------------------------------------------------------------------------
#
# The JVM runs Proletarian's shutdown hook on System.exit, SIGTERM and SIGINT, and not when main returns
# while worker threads live. Python runs atexit functions only after it has joined every non-daemon
# thread, so an atexit hook would never fire while the worker runs; the hook is therefore a SIGTERM and
# SIGINT handler, installed on the main thread over the default handlers only.

_HOOK_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
_hooked: list[QueueWorker] = []
_hooked_lock = threading.RLock()  # a signal handler may run while the main thread holds it
_previous_handlers: dict[int, Any] = {}


def _is_default_handler(signum: int, handler: Any) -> bool:
    return handler is (signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


def _hook(worker: QueueWorker) -> None:
    with _hooked_lock:
        _hooked.append(worker)
        if threading.current_thread() is not threading.main_thread():
            return  # Python allows signal handlers to be set on the main thread only
        for signum in _HOOK_SIGNALS:
            handler = signal.getsignal(signum)
            if _is_default_handler(signum, handler):
                _previous_handlers[signum] = handler
                signal.signal(signum, _stop_on_signal)


def _unhook(worker: QueueWorker) -> None:
    with _hooked_lock:
        if worker in _hooked:
            _hooked.remove(worker)
        if _hooked or threading.current_thread() is not threading.main_thread():
            return  # a handler left behind with no worker to stop behaves as the default one
        for signum, previous in list(_previous_handlers.items()):
            if signal.getsignal(signum) is _stop_on_signal:
                signal.signal(signum, previous)
            del _previous_handlers[signum]


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    """Stop every hooked worker (drain, then release), then exit with 128 + signal, as the JVM does."""
    with _hooked_lock:
        workers = list(_hooked)
    if not workers:
        # Every hooked worker is stopping or stopped already (perhaps by this very thread, in a stop()
        # the signal interrupted): do what the signal would have done without the hook.
        if signum == signal.SIGINT:
            signal.default_int_handler(signum, frame)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    for worker in workers:
        worker._stop_logging_errors()
    code = 128 + signum
    if threading.main_thread().is_alive() and not any(w._threads_alive() for w in workers):
        # The main thread is running: unwind it, so finally blocks and atexit functions run.
        raise SystemExit(code)
    # The main thread has returned, so Python is waiting for non-daemon threads, or a released handler is
    # still running and would keep the process alive: end it, as the JVM halts after its hooks.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


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
) -> QueueWorker:
    """A queue worker over `data_source` (a psycopg_pool.ConnectionPool or a zero-argument connection
    factory); nothing runs until start(). Options mirror Proletarian's create-queue-worker.

    The worker closes only what it opened: the connections it took from a factory. A pool, a Backend
    (as `backend=` or as the data source) and the factory itself stay the caller's to close.
    """
    if not callable(handler_fn):
        raise ConfigurationError(f"handler_fn must be callable, got {handler_fn!r}")
    if not isinstance(worker_threads, int) or isinstance(worker_threads, bool) or worker_threads < 1:
        raise ConfigurationError(f"worker_threads must be an int >= 1, got {worker_threads!r}")
    # Proletarian's scheduleWithFixedDelay refuses a polling delay <= 0 (IllegalArgumentException from
    # start!); here the same refusal comes before anything runs.
    for name, value, zero_ok in (
        ("polling_interval_ms", polling_interval_ms, False),
        ("await_termination_timeout_ms", await_termination_timeout_ms, True),
    ):
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not (number and (value >= 0 if zero_ok else value > 0) and value < 10**12):
            least = ">= 0" if zero_ok else "> 0"
            raise ConfigurationError(f"{name} must be a number of milliseconds {least}, got {value!r}")
    for name, fn in (("log", log), ("on_polling_error", on_polling_error), ("on_shutdown", on_shutdown)):
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"{name} must be callable, got {fn!r}")
    # Names are checked before the data source is asked for a connection: a bad one opens nothing.
    table_name(job_table, option="job_table")
    table_name(archived_job_table, option="archived_job_table")
    to_keyword_text(queue, what="queue")
    active, owns_backend = _backend_for(data_source, backend)
    settings = job_settings(
        active,
        queue=queue,
        job_table=job_table,
        archived_job_table=archived_job_table,
        serializer=serializer,
        job_id_strategy=job_id_strategy,
        handler_fn_mode=handler_fn_mode,
        retry_strategy_fn=retry_strategy_fn,
        failed_job_fn=failed_job_fn,
        clock=clock,
    )
    return QueueWorker(
        active,
        handler_fn,
        settings,
        log=log if log is not None else stdlib_logger,
        queue_worker_id=queue_worker_id if queue_worker_id is not None else f"proletarian[{settings.queue}]",
        polling_interval_ms=polling_interval_ms,
        worker_threads=worker_threads,
        on_polling_error=on_polling_error if on_polling_error is not None else _stop_worker,
        await_termination_timeout_ms=await_termination_timeout_ms,
        install_shutdown_hook=install_shutdown_hook,
        on_shutdown=on_shutdown if on_shutdown is not None else _noop,
        owns_backend=owns_backend,
    )
