"""`proletarian-ref worker --handler module:function`: run a queue worker until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Final

from proletarian_ref.cli.database import (
    Database,
    add_database_options,
    cannot_connect,
    is_driver_error,
    open_database,
    tables_from,
)
from proletarian_ref.cli.errors import CliError, ExitCode, SchemaMissingCliError, UsageError
from proletarian_ref.errors import InvalidKeywordError, SchemaMissingError, ShutdownTimeoutError
from proletarian_ref.job import Job
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text
from proletarian_ref.log import LogFn, stdlib_logger
from proletarian_ref.retry import RetryStrategy, RetryStrategyFn
from proletarian_ref.worker import HANDLER_FN_MODES, HandlerFn, QueueWorker, create_queue_worker

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
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


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
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
        "--handler-mode advanced. The current directory is on the import path.",
    )
    parser.add_argument("--queue", default=DEFAULT_QUEUE, help="queue keyword (default: %(default)s)")
    parser.add_argument("--threads", type=_positive, default=1, help="worker threads (default: %(default)s)")
    parser.add_argument(
        "--polling-interval-ms",
        type=_positive,
        default=100,
        help="pause after a poll finds no job (default: %(default)s)",
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
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="worker log level on stderr (default: %(default)s)",
    )
    add_database_options(parser)
    parser.set_defaults(run=run)


def load_handler(spec: str) -> HandlerFn:
    """The callable named by "package.module:function" (or "module:Class.method")."""
    module_name, sep, attribute_path = spec.partition(":")
    if not sep or not module_name or not attribute_path:
        raise UsageError(f"--handler {spec!r} must look like 'package.module:function'")
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
                f"--handler {spec!r}: no module named {exc.name!r} (searched the current directory and "
                "sys.path; set PYTHONPATH or install the package)"
            ) from exc
        raise UsageError(f"--handler {spec!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise UsageError(
            f"--handler {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute_path.split("."):
        if not hasattr(target, part):
            raise UsageError(f"--handler {spec!r}: {module_name!r} has no attribute {attribute_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"--handler {spec!r} is a {type(target).__name__}, not a function")
    handler: HandlerFn = target
    return handler


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
        print(
            f"proletarian-ref: {name}: stopping (send it again to exit at once)", file=sys.stderr, flush=True
        )
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


class WorkerRun:
    """A queue worker under the CLI's stop rules: a signal, or an error that stops the worker itself."""

    def __init__(self) -> None:
        self.stop_requested = threading.Event()
        self.shut_down = threading.Event()
        self.error: BaseException | None = None

    def on_polling_error(self, error: BaseException) -> bool:
        # Transient database errors never get here (the worker retries them); anything else stops it.
        self.error = error
        self.stop_requested.set()
        return True

    def on_shutdown(self) -> None:
        self.shut_down.set()

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
                raise CliError(
                    f"{exc}. Nothing those handlers do is committed: their jobs stay queued with "
                    "their attempts unchanged and run again (at least once)."
                ) from exc
            return
        self.shut_down.wait(await_timeout_ms / 1000 + _SELF_STOP_MARGIN_S)
        error = self.error
        if isinstance(error, SchemaMissingError):
            raise SchemaMissingCliError(
                f"the worker stopped: {error}; install the schema with:\n  {db.install_command()}"
            ) from error
        raise CliError(f"the worker stopped on an error: {type(error).__name__}: {error}") from error


def _stderr_log_handler(level: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(message)s"))
    handler.setLevel(level.upper())
    return handler


@contextmanager
def worker_logging(level: str) -> Iterator[LogFn]:
    """The worker's events on stderr at `level` and above, for the duration of the command."""
    logger = logging.getLogger("proletarian_ref")
    handler = _stderr_log_handler(level)
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    try:
        yield stdlib_logger
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)


def run(args: argparse.Namespace) -> int:
    handler = load_handler(args.handler)
    retry_fn = retry_strategy_fn(args.retries, args.delays)
    try:
        queue = to_keyword_text(args.queue, what="--queue")
    except InvalidKeywordError as exc:
        raise UsageError(str(exc)) from exc
    tables = tables_from(args)
    with open_database(args, tables) as db, worker_logging(args.log_level) as log:
        run_state = WorkerRun()
        worker = run_state.create(
            db,
            handler,
            queue=queue,
            handler_fn_mode=args.handler_mode,
            retry_strategy_fn=retry_fn,
            log=log,
            polling_interval_ms=args.polling_interval_ms,
            worker_threads=args.threads,
            await_termination_timeout_ms=args.shutdown_timeout_ms,
        )
        with stop_on_signals(run_state.stop_requested):
            start_as_daemons(worker)
            threads = f"{args.threads} thread{'s' if args.threads != 1 else ''}"
            print(
                f"proletarian-ref: worker running on queue {queue[1:]} of {tables.job} in {db.describe()} "
                f"with {threads}, handler {args.handler}; stop it with Ctrl-C or SIGTERM",
                file=sys.stderr,
                flush=True,
            )
            run_state.wait()
            run_state.finish(worker, db, args.shutdown_timeout_ms)
        print("proletarian-ref: worker stopped", file=sys.stderr, flush=True)
    return ExitCode.OK
