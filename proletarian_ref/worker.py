"""The queue worker: polling threads that claim, run, retry and archive jobs (proletarian.worker)."""

from __future__ import annotations

import atexit
import random
import signal
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
    job = Job(
        job_id=settings.job_id_strategy.decode_id(record.job_id),
        queue=from_keyword_text(record.queue),
        job_type=from_keyword_text(record.job_type),
        payload=payload,
        attempts=record.attempts + 1,
        enqueued_at=record.enqueued_at,
        process_at=record.process_at,
    )
    return job, error


def run_next_job(
    backend: Backend,
    settings: JobSettings,
    handler_fn: HandlerFn,
    log: LogFn,
    context: Mapping[str, Any],
    stop_event: threading.Event,
) -> bool | None:
    """One poll in one transaction: None when no job was due, else whether the worker may go on.

    The handler runs inside the claiming transaction, holding the row lock, exactly as Proletarian does.
    """
    with backend.transaction() as conn:
        record = backend.get_next_job(conn, settings.job_table, settings.queue, now_from(settings.clock))
        if record is None:
            return None
        job, decode_error = _to_job(record, settings)
        job_context = {**context, ev.JOB_ID: job.job_id, ev.JOB_TYPE: job.job_type, ev.ATTEMPT: job.attempts}

        def job_log(event: str, data: Mapping[str, Any]) -> None:
            log(event, {**data, **job_context})

        try:
            log(ev.HANDLING_JOB, job_context)
            if decode_error is not None:
                raise decode_error
            if settings.handler_fn_mode == "advanced":
                handler_fn(job)
            else:
                handler_fn(job.job_type, job.payload)
        except JobInterrupted:
            job_log(ev.JOB_INTERRUPTED, {})
            return False
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
            log(ev.JOB_FINISHED, job_context)
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
    own_backend = backend is None
    active = backend if backend is not None else backend_for_data_source(data_source)
    try:
        settings = job_settings(active, **options)
        return run_next_job(
            active, settings, handler_fn, log if log is not None else stdlib_logger, {}, threading.Event()
        )
    finally:
        if own_backend:
            active.close()


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
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._stopped = False
        self._previous_sigterm: Any = None
        # Per thread number: the job it is running (for logs and release) and whether stop() released it.
        self._current_jobs: dict[int, dict[str, Any]] = {}
        self._released: set[int] = set()

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> bool | None:
        """Start the polling threads; None if already started (a stopped worker cannot restart)."""
        with self._lock:
            if self._started:
                return None
            self._started = True
            if self._install_shutdown_hook:
                self._add_shutdown_hooks()
            for n in range(1, self._worker_threads + 1):
                thread = threading.Thread(
                    target=self._work, args=(n,), name=f"{self.queue_worker_id}-{n}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            return True

    def stop(self) -> bool | None:
        """Stop polling, let running jobs drain for await_termination_timeout_ms, then release the rest.

        Every thread stops claiming jobs at once. A handler sees the request through
        proletarian_ref.interrupted() / sleep() and may give its job back (JobInterrupted: attempts
        unchanged); one that ignores it may finish, and its job is archived. Threads still running a job
        at the deadline have it released: their connection is closed, so the database rolls their
        transaction back and another worker can claim the job with attempts unchanged, and whatever the
        handler does when it returns is not written. Then stop() raises ShutdownTimeoutError and skips
        on_shutdown, as Proletarian does, because those handlers are still running.
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
            self._remove_shutdown_hooks()
            self._safe_log(ev.SHUTTING_DOWN, context)
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
            released = self._release(stuck) if stuck else []
            self.backend.close()
            if stuck:
                names = ", ".join(thread.name for _, thread in stuck)
                outcome = (
                    f"released their jobs {', '.join(map(str, released))} back to the queue"
                    if released
                    else "no job of theirs could be released"
                )
                raise ShutdownTimeoutError(
                    f"Could not shut down the queue worker within {self._await_timeout * 1000:g} ms; "
                    f"still running: {names}; {outcome}"
                )
            self._safe_log(ev.COMPLETED_SHUTDOWN, context)
        self._on_shutdown()
        return True

    def _release(self, stuck: list[tuple[int, threading.Thread]]) -> list[Any]:
        """Release the jobs of threads still running at the deadline; returns their job ids."""
        release = getattr(self.backend, "release_connection", None)
        released: list[Any] = []
        for n, thread in stuck:
            with self._lock:
                self._released.add(n)
                job = dict(self._current_jobs.get(n, {}))
            if release is None or thread.ident is None or not release(thread.ident):
                continue
            released.append(job.get(ev.JOB_ID))
            self._safe_log(
                ev.JOB_RELEASED, {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.WORKER_THREAD_ID: n, **job}
            )
        return released

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

    def _work(self, n: int) -> None:
        bind_stop_event(self._stop_event)
        outer = {ev.QUEUE_WORKER_ID: self.queue_worker_id}
        context = {**outer, ev.WORKER_THREAD_ID: n}
        current = self._current_jobs

        def log(event: str, data: Mapping[str, Any]) -> None:
            # Remember the running job so that an error escaping the run, or a release, can name it.
            if event == ev.HANDLING_JOB:
                running = {
                    ev.JOB_ID: data[ev.JOB_ID],
                    ev.JOB_TYPE: data[ev.JOB_TYPE],
                    ev.ATTEMPT: data[ev.ATTEMPT],
                }
                with self._lock:
                    current[n] = running
            self._log_fn(event, data)

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
                    with self._lock:
                        current.pop(n, None)
                    ran = run_next_job(
                        self.backend, self.settings, self.handler_fn, log, context, self._stop_event
                    )
                    if ran is not True:
                        break
                failures = 0
            except BaseException as exc:
                with self._lock:
                    released, running = n in self._released, current.get(n, {})
                if released:
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
        # From at least 10 ms, so that even a zero polling interval cannot spin on a failing job.
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
        # A polling thread cannot join itself, so another thread stops the worker.
        threading.Thread(
            target=self._stop_logging_errors, name=f"{self.queue_worker_id}-stop", daemon=True
        ).start()

    def _safe_log(self, event: str, data: Mapping[str, Any]) -> None:
        # Outside a job nothing else would catch a failing log function, and a polling thread must not
        # die silently because of one.
        try:
            self._log_fn(event, data)
        except Exception:
            ev.logger.exception("log function failed on %s", event)

    # -- shutdown hooks --------------------------------------------------------------------------------

    def _add_shutdown_hooks(self) -> None:
        atexit.register(self._stop_logging_errors)
        on_main_thread = threading.current_thread() is threading.main_thread()
        if on_main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous_sigterm = signal.SIG_DFL
            signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def _remove_shutdown_hooks(self) -> None:
        if not self._install_shutdown_hook:
            return
        atexit.unregister(self._stop_logging_errors)
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def _stop_logging_errors(self) -> None:
        """stop() where no caller could catch its error (at exit, or after an error on a polling thread)."""
        try:
            self.stop()
        except BaseException as exc:
            self._safe_log(
                ev.QUEUE_WORKER_SHUTDOWN_ERROR, {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.THROWABLE: exc}
            )


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # SystemExit unwinds the main thread normally, so atexit runs the queue workers' stop().
    raise SystemExit(128 + signum)


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
    """
    if not callable(handler_fn):
        raise ConfigurationError(f"handler_fn must be callable, got {handler_fn!r}")
    if not isinstance(worker_threads, int) or isinstance(worker_threads, bool) or worker_threads < 1:
        raise ConfigurationError(f"worker_threads must be an int >= 1, got {worker_threads!r}")
    for name, value in (
        ("polling_interval_ms", polling_interval_ms),
        ("await_termination_timeout_ms", await_termination_timeout_ms),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 10**12:
            raise ConfigurationError(f"{name} must be a number of milliseconds >= 0, got {value!r}")
    for name, fn in (("log", log), ("on_polling_error", on_polling_error), ("on_shutdown", on_shutdown)):
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"{name} must be callable, got {fn!r}")
    # Names are checked before the data source is asked for a connection: a bad one opens nothing.
    table_name(job_table, option="job_table")
    table_name(archived_job_table, option="archived_job_table")
    to_keyword_text(queue, what="queue")
    active = backend if backend is not None else backend_for_data_source(data_source)
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
    )
