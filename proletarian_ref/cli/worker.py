"""`proletarian-ref worker --handler module:function`: run a queue worker until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Final, Generic, Protocol, TypeVar

from proletarian_ref.backend import Backend
from proletarian_ref.cli.database import (
    Database,
    add_database_options,
    cannot_connect,
    is_driver_error,
    open_database,
    plan_backend,
    tables_from,
)
from proletarian_ref.cli.errors import (
    CannotListenError,
    CliError,
    ExitCode,
    SchemaMissingCliError,
    UsageError,
    port,
)
from proletarian_ref.cli.logs import notice
from proletarian_ref.cli.periodic import running_scheduler
from proletarian_ref.cli.processes import run_processes, watch_parent
from proletarian_ref.errors import InvalidKeywordError, SchemaMissingError, ShutdownTimeoutError
from proletarian_ref.job import Job
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text
from proletarian_ref.log import stdlib_logger
from proletarian_ref.ops.db import Tables
from proletarian_ref.retry import RetryStrategy, RetryStrategyFn
from proletarian_ref.watchdog import DEFAULT_JOB_TIMEOUT_GRACE_MS
from proletarian_ref.worker import HANDLER_FN_MODES, HandlerFn, QueueWorker, create_queue_worker

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
# `--async-driver`: the asyncio worker's PostgreSQL driver (cli.aio_worker.ASYNC_DATA_SOURCES).
ASYNC_DRIVERS: Final = ("psycopg", "asyncpg")
# `--loop`: the asyncio worker's event loop, asyncio's own or uvloop's (the uvloop extra).
EVENT_LOOPS: Final = ("asyncio", "uvloop")
# How long to wait for a worker that stops itself (after a polling error) beyond its own shutdown timeout.
_SELF_STOP_MARGIN_S: Final = 5.0


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _positive(text: str) -> int:
    value = _natural(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def _delays(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(
            f"delays must be milliseconds separated by commas, e.g. 1000,5000: {text!r}"
        )
    return tuple(_natural(p) for p in parts)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "worker",
        help="run a queue worker until SIGINT/SIGTERM",
        description="Run a queue worker until SIGINT or SIGTERM, then stop it cleanly: handlers see "
        "proletarian_ref.interrupted() and sleep() raises JobInterrupted; the command waits up to "
        "--shutdown-timeout-ms for jobs in flight. A second signal exits at once.",
    )
    parser.add_argument(
        "--handler",
        required=True,
        metavar="MODULE:FUNCTION",
        help="the handler, e.g. my_app.jobs:handle; called as f(job_type, payload), or f(job) with "
        "--handler-mode advanced. A coroutine function (async def) runs on the asyncio worker, --threads "
        "being its polling tasks (PostgreSQL). The current directory is on the import path.",
    )
    parser.add_argument(
        "--async-driver",
        choices=ASYNC_DRIVERS,
        help="PostgreSQL's driver for a coroutine handler's asyncio worker; asyncpg needs the asyncpg extra "
        "(default: psycopg; MySQL: always aiomysql)",
    )
    parser.add_argument(
        "--loop",
        choices=EVENT_LOOPS,
        default="asyncio",
        help="a coroutine handler's event loop: asyncio's own, or uvloop's, which needs the uvloop extra and "
        "spends less CPU a job (docs/benchmarks.md) (default: %(default)s)",
    )
    parser.add_argument(
        "--queue",
        action="append",
        help=f"queue keyword; repeat it to run a queue worker per queue (default: {DEFAULT_QUEUE})",
    )
    parser.add_argument(
        "--threads", type=_positive, default=1, help="worker threads per queue (default: %(default)s)"
    )
    parser.add_argument(
        "--processes",
        type=_positive,
        default=1,
        help="worker processes, each with --threads threads per queue and its own connections; one "
        "signal stops them all, draining (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive,
        default=1,
        help="jobs claimed, run and committed per transaction; above 1 is batch mode, not Proletarian's "
        "one job a transaction: a crash re-runs up to N jobs (docs/worker.md) (default: %(default)s)",
    )
    parser.add_argument(
        "--compact",
        action="store_true",
        help="the compact statement plan: a finished job's archive and delete (batch mode: a batch's) in one "
        "round trip, not Proletarian's two statements; the same rows (docs/worker.md)",
    )
    parser.add_argument(
        "--chain",
        action="store_true",
        help="chained claims: a finished job's COMMIT goes with the next job's BEGIN and the next claim "
        "follows at once, each job keeping its own transaction; with --batch-size, a finished batch's, each "
        "batch its own. On MySQL the job's archive and delete, COMMIT and next claim "
        "go as one query (docs/worker.md)",
    )
    parser.add_argument(
        "--pipeline",
        action="store_true",
        help="psycopg's pipeline mode on the worker's own connections (PostgreSQL; a coroutine handler's "
        "asyncio worker on psycopg too, not asyncpg): with --compact and --chain a finished job's archive "
        "(with --batch-size, a batch's), its COMMIT, the next BEGIN and the next claim go in one round trip, "
        "the archive's row count checked by the server (docs/worker.md)",
    )
    parser.add_argument(
        "--polling-interval-ms",
        type=_positive,
        default=100,
        help="pause after a poll finds no job (default: %(default)s)",
    )
    parser.add_argument(
        "--no-wake-on-notify",
        dest="wake_on_notify",
        action="store_false",
        help="do not listen for jobs enqueued with notify (PostgreSQL); poll only",
    )
    parser.add_argument(
        "--retries", type=_natural, help="retry a failed job up to N times (default: never retry)"
    )
    parser.add_argument(
        "--delays",
        type=_delays,
        metavar="MS,MS,...",
        help="delay before each retry in ms; the last is reused (default: 0); needs --retries",
    )
    parser.add_argument(
        "--handler-mode", choices=HANDLER_FN_MODES, default="default", help="(default: %(default)s)"
    )
    parser.add_argument(
        "--shutdown-timeout-ms",
        type=_natural,
        default=10_000,
        help="how long stopping waits for jobs in flight (default: %(default)s)",
    )
    parser.add_argument(
        "--job-timeout-ms",
        type=_positive,
        metavar="MS",
        help="bound each job: past it the handler is told (interrupted()) and, if it then raises, the job "
        "fails with JobTimeoutError; after the grace its transaction is ended, the job back with attempts "
        "unchanged (docs/worker.md, Job timeout) (default: no bound)",
    )
    parser.add_argument(
        "--job-timeout-grace-ms",
        type=_natural,
        default=DEFAULT_JOB_TIMEOUT_GRACE_MS,
        metavar="MS",
        help="how long a handler told its time is up has to return before its transaction is ended "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (needs prometheus_client)",
    )
    parser.add_argument("--metrics-host", default="127.0.0.1", help="(default: %(default)s)")
    parser.add_argument(
        "--metrics-job-types",
        type=_natural,
        metavar="N",
        help="job types with a job_type label of their own; later ones are counted as (other) "
        "(default: 20; 0: every one)",
    )
    parser.add_argument(
        "--schedules",
        metavar="MODULE:OBJECT",
        help="also run a periodic-job scheduler for this list of Schedule objects (docs/periodic.md); any "
        "number of workers may run one",
    )
    add_database_options(parser)
    parser.set_defaults(run=run)
    return parser


def load_handler(spec: str) -> HandlerFn:
    """The callable named by "package.module:function" (or "module:Class.method")."""
    target = load_attribute(spec, "--handler", "function")
    if not callable(target):
        raise UsageError(f"--handler {spec!r} is a {type(target).__name__}, not a function")
    handler: HandlerFn = target
    return handler


def load_attribute(spec: str, option: str, what: str) -> Any:
    """The object named by "package.module:attribute" (or "module:Class.attribute") for `option`."""
    module_name, sep, attribute_path = spec.partition(":")
    if not sep or not module_name or not attribute_path:
        raise UsageError(f"{option} {spec!r} must look like 'package.module:{what}'")
    # A console script does not put the current directory on sys.path as `python -m` does; handlers
    # usually live in the project the command is run from.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(
                f"{option} {spec!r}: no module named {exc.name!r} (searched the current directory and "
                "sys.path; set PYTHONPATH or install the package)"
            ) from exc
        raise UsageError(f"{option} {spec!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise UsageError(
            f"{option} {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute_path.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{option} {spec!r}: {module_name!r} has no attribute {attribute_path!r}")
        target = getattr(target, part)
    return target


def retry_strategy_fn(retries: int | None, delays: tuple[int, ...] | None) -> RetryStrategyFn | None:
    if retries is None:
        if delays is not None:
            raise UsageError("--delays needs --retries")
        return None
    strategy = RetryStrategy(retries=retries, delays=delays or ())

    def same_strategy_for_every_job(job: Job, exception: BaseException) -> RetryStrategy:
        return strategy

    return same_strategy_for_every_job


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set `stop`; a second one raises KeyboardInterrupt to give up waiting.

    Outside the main thread (where Python allows no signal handlers) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def request_stop(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        notice(f"{name}: stopping (send it again to exit at once)")
        stop.set()

    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, request_stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def start_as_daemons(worker: QueueWorker) -> None:
    """Start the worker's threads as daemon threads, so the command exits when it says it does.

    Worker threads inherit daemon-ness from the thread that starts them (as JVM threads do), so starting
    them from a daemon thread makes them daemons: a handler that ignores the stop cannot keep the process
    alive after the command has given up on it (its job is released, or dies with the connection).
    """
    starter = threading.Thread(target=worker.start, name="proletarian-ref-starter", daemon=True)
    starter.start()
    starter.join()


class _Settable(Protocol):
    def set(self) -> None: ...


_EventT = TypeVar("_EventT", bound=_Settable)


class StopRules(Generic[_EventT]):
    """The CLI's stop rules for a queue worker, the same for threads (WorkerRun) and asyncio tasks
    (cli.aio_worker.AsyncWorkerRun): a signal, or an error that stops the worker itself."""

    def __init__(self, stop_requested: _EventT, shut_down: _EventT) -> None:
        # Shared by the workers of one command, so one signal (or one worker's error) stops them all.
        self.stop_requested = stop_requested
        self.shut_down = shut_down
        self.error: BaseException | None = None

    def on_polling_error(self, error: BaseException) -> bool:
        # Transient database errors never get here (the worker retries them); anything else stops it.
        # The asyncio worker calls it on the loop's thread.
        self.error = error
        self.stop_requested.set()
        return True

    def on_shutdown(self) -> None:
        self.shut_down.set()


class WorkerRun(StopRules[threading.Event]):
    """A queue worker under the CLI's stop rules: a signal, or an error that stops the worker itself."""

    def __init__(self, stop_requested: threading.Event | None = None) -> None:
        super().__init__(
            stop_requested if stop_requested is not None else threading.Event(), threading.Event()
        )

    def create(self, db: Database, handler: HandlerFn, **options: Any) -> QueueWorker:
        try:
            return create_queue_worker(
                db.factory,
                handler,
                job_table=db.tables.job,
                archived_job_table=db.tables.archived,
                on_polling_error=self.on_polling_error,
                on_shutdown=self.on_shutdown,
                **options,
            )
        except Exception as exc:
            if is_driver_error(exc):
                raise cannot_connect(db, exc) from exc
            raise

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for a stop request (in short steps, so signal handlers run promptly); True if one came."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.stop_requested.wait(0.2):
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def finish(self, worker: QueueWorker, db: Database, await_timeout_ms: float) -> None:
        """Stop the worker (or wait for it to stop itself) and raise what made it stop on its own."""
        if self.error is None:
            try:
                worker.stop()
            except ShutdownTimeoutError as exc:
                raise released_error(exc) from exc
            return
        self.shut_down.wait(await_timeout_ms / 1000 + _SELF_STOP_MARGIN_S)
        raise stopped_on_error(self.error, db) from self.error


def released_error(exc: ShutdownTimeoutError) -> CliError:
    """What the command says (exit 1) when stopping released handlers still running at the timeout."""
    return CliError(
        f"{exc}. Nothing those handlers do is committed: their jobs stay queued with "
        "their attempts unchanged and run again (at least once)."
    )


def stopped_on_error(error: BaseException, db: Database) -> CliError:
    """What the command says when a queue worker stopped itself on `error` (exit 4 if tables went)."""
    if isinstance(error, SchemaMissingError):
        return SchemaMissingCliError(
            f"the worker stopped: {error}; install the schema with:\n  {db.install_command()}"
        )
    return CliError(f"the worker stopped on an error: {type(error).__name__}: {error}")


def queues_of(names: list[str] | None) -> list[str]:
    try:
        queues = [to_keyword_text(name, what="--queue") for name in names or [DEFAULT_QUEUE]]
    except InvalidKeywordError as exc:
        raise UsageError(str(exc)) from exc
    return list(dict.fromkeys(queues))


@contextmanager
def metrics_server(args: argparse.Namespace, db: Database) -> Iterator[Any]:
    """WorkerMetrics served on --metrics-port while the block runs, or None without that option."""
    if args.metrics_port is None:
        yield None
        return
    try:
        from proletarian_ref.ops.metrics import QueueCollector, WorkerMetrics, serve
    except ImportError as exc:
        raise CliError(
            f"--metrics-port needs prometheus_client: pip install 'proletarian-ref[metrics]' ({exc})"
        ) from exc
    limit = args.metrics_job_types
    metrics = WorkerMetrics() if limit is None else WorkerMetrics(max_job_types=limit)
    collector = QueueCollector(
        db.factory, Tables(db.tables.job, db.tables.archived), db.dialect, queues_of(args.queue)
    )
    metrics.registry.register(collector)
    try:
        stop = serve(metrics.registry, args.metrics_port, args.metrics_host)
    except OSError as exc:
        raise CannotListenError(
            f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}"
        ) from exc
    notice(f"metrics on http://{args.metrics_host}:{args.metrics_port}/metrics")
    try:
        yield metrics
    finally:
        stop()
        collector.close()


@contextmanager
def _shared_backend(db: Database, *, compact: bool, chain: bool, pipeline: bool) -> Iterator[Backend | None]:
    """With --compact, --chain or --pipeline, the backend every queue worker of the command shares, closed
    after they stopped; else None, and each worker builds its own from the connection factory."""
    if not compact and not chain and not pipeline:
        yield None
        return
    backend = plan_backend(db, compact=compact, chain=chain, pipeline=pipeline)
    try:
        yield backend
    finally:
        backend.close()


def _finish_all(runs: list[tuple[WorkerRun, QueueWorker]], db: Database, timeout_ms: float) -> None:
    """Stop every queue worker at once (each drains in parallel); raise the first error any of them had."""
    errors: list[BaseException] = []

    def finish(run_state: WorkerRun, worker: QueueWorker) -> None:
        try:
            run_state.finish(worker, db, timeout_ms)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=pair, name="stop-worker") for pair in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def running_notice(args: argparse.Namespace, queues: list[str], db: Database, unit: str) -> str:
    """The line saying the worker runs: its queues, tables, database, threads (or tasks) and handler."""
    count = f"{args.threads} {unit}{'s' if args.threads != 1 else ''}"
    names = ", ".join(q[1:] for q in queues)
    return (
        f"worker running on queue{'s' if len(queues) > 1 else ''} {names} of {db.tables.job} in "
        f"{db.describe()} with {count}{' each' if len(queues) > 1 else ''}, handler "
        f"{args.handler}{_plan_words(args)}; stop it with Ctrl-C or SIGTERM"
    )


def _plan_words(args: argparse.Namespace) -> str:
    named = {"the compact plan": args.compact, "chained claims": args.chain, "pipelining": args.pipeline}
    plans = [name for name, on in named.items() if on]
    return f", on {' with '.join(plans)}" if plans else ""


def run_several(args: argparse.Namespace) -> int:
    """`--processes N` above 1: the options already checked once here, N children run the command."""
    if args.metrics_port is not None:
        raise UsageError(
            "--metrics-port serves one process's metrics and cannot be shared by --processes "
            f"{args.processes}; run one worker command per metrics port instead"
        )
    return run_processes(getattr(args, "cli_argv", None) or sys.argv[1:], args.processes)


def queue_worker_options(
    args: argparse.Namespace, queue: str, retry_fn: Any, metrics: Any, backend: Any
) -> dict[str, Any]:
    """The create_queue_worker options the command line gives one queue's worker: the same for the
    threaded and the asyncio worker command (cli.aio_worker), whose workers take the same options."""
    return {
        "queue": queue,
        "handler_fn_mode": args.handler_mode,
        "retry_strategy_fn": retry_fn,
        "log": stdlib_logger if metrics is None else metrics.log_for(queue, stdlib_logger),
        "polling_interval_ms": args.polling_interval_ms,
        "wake_on_notify": args.wake_on_notify,
        "worker_threads": args.threads,
        "batch_size": args.batch_size,
        "await_termination_timeout_ms": args.shutdown_timeout_ms,
        "job_timeout_ms": args.job_timeout_ms,
        "job_timeout_grace_ms": args.job_timeout_grace_ms,
        "backend": backend,
    }


def run(args: argparse.Namespace, handler: HandlerFn | None = None) -> int:
    """The threaded worker command; `handler` if already loaded (cli.aio_worker chose this worker)."""
    handler = handler if handler is not None else load_handler(args.handler)
    retry_fn = retry_strategy_fn(args.retries, args.delays)
    queues = queues_of(args.queue)
    tables = tables_from(args)
    if args.processes > 1:
        return run_several(args)
    with (
        open_database(args, tables) as db,
        metrics_server(args, db) as metrics,
        _shared_backend(db, compact=args.compact, chain=args.chain, pipeline=args.pipeline) as backend,
    ):
        stop = threading.Event()
        watch_parent(stop)
        runs: list[tuple[WorkerRun, QueueWorker]] = []
        for queue in queues:
            run_state = WorkerRun(stop)
            worker = run_state.create(
                db, handler, **queue_worker_options(args, queue, retry_fn, metrics, backend)
            )
            runs.append((run_state, worker))
        with stop_on_signals(stop), running_scheduler(args.schedules, db, stop):
            for _, worker in runs:
                start_as_daemons(worker)
            notice(running_notice(args, queues, db, "thread"))
            runs[0][0].wait()
            _finish_all(runs, db, args.shutdown_timeout_ms)
        notice("worker stopped")
    return ExitCode.OK
