"""`proletarian-ref demo`: enqueue jobs (some fail, some retry), work them off with a progress bar, sum up."""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from proletarian_ref.cli.database import Database, add_database_options, open_database, tables_from
from proletarian_ref.cli.errors import CliError, ExitCode
from proletarian_ref.cli.logs import notice
from proletarian_ref.cli.worker import WorkerRun, stop_on_signals
from proletarian_ref.clock import system_utc
from proletarian_ref.interrupts import sleep
from proletarian_ref.job import Job, enqueue
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.log import NOT_RETRYING, RETRYING
from proletarian_ref.ops.stats import ArchiveSummary, archive_summary, archived_count
from proletarian_ref.retry import RetryStrategy

DEMO_QUEUE: Final = "proletarian-ref/demo"
DEMO_JOB_TYPE: Final = "proletarian-ref.demo/work"
RETRIES: Final = 2
DELAYS_MS: Final = (100, 200)
_PROGRESS_POLL_S: Final = 0.1


class DemoFailure(Exception):
    """Raised on purpose by the demo handler for the jobs planned to fail."""


def plan(jobs: int) -> list[dict[str, int]]:
    """The demo's payloads, the same on every run: every 10th job always fails, some fail once or twice."""
    rng = random.Random(jobs)
    payloads = []
    for n in range(jobs):
        if n % 10 == 9:
            fail_attempts = RETRIES + 1
        elif n % 7 == 3:
            fail_attempts = 2
        elif n % 4 == 1:
            fail_attempts = 1
        else:
            fail_attempts = 0
        payloads.append({"n": n, "work-ms": rng.randint(10, 60), "fail-attempts": fail_attempts})
    return payloads


def demo_handler(job: Job) -> None:
    """Work for a while, then fail while the job's attempt number is within its planned failures."""
    payload: Mapping[str, Any] = job.payload
    # proletarian_ref.sleep wakes up at once when the worker is stopped, and leaves the job queued.
    sleep(int(payload["work-ms"]) / 1000)
    if job.attempts <= int(payload["fail-attempts"]):
        raise DemoFailure(f"demo job {payload['n']} fails on attempt {job.attempts}, as planned")


def _same_strategy(job: Job, exception: BaseException) -> RetryStrategy:
    return RetryStrategy(retries=RETRIES, delays=DELAYS_MS)


class EventCounter:
    """A worker `log` that counts events for the progress bar instead of printing them."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        with self._lock:
            self.counts[event] += 1

    def describe(self) -> str:
        with self._lock:
            return f"demo jobs (retries {self.counts[RETRYING]}, gave up {self.counts[NOT_RETRYING]})"


def _bounded(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}: {text!r}")
        return value

    return parse


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="enqueue demo jobs, run workers with a progress bar, print a summary",
        description=f"Enqueue --jobs jobs on queue {DEMO_QUEUE} (every 10th always fails, others fail once "
        f"or twice and succeed on a retry; {RETRIES} retries after {DELAYS_MS} ms), work them off with a "
        "progress bar, and print a summary read back from the archive.",
    )
    parser.add_argument("--jobs", type=_bounded(1, 10_000), default=40, metavar="N", help="(default: 40)")
    parser.add_argument("--threads", type=_bounded(1, 64), default=4, metavar="N", help="(default: 4)")
    parser.add_argument(
        "--timeout",
        type=_bounded(1, 3600),
        default=60,
        metavar="SECONDS",
        help="give up after this long (default: %(default)s)",
    )
    add_database_options(parser)
    parser.set_defaults(run=run)


def _progress() -> Any:
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError as exc:
        raise CliError("demo needs the rich package: pip install 'proletarian-ref[cli]'") from exc
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


def format_summary(summary: ArchiveSummary, db: Database, dialect_precision_s: float) -> str:
    elapsed = summary.elapsed
    seconds = 0.0 if elapsed is None else elapsed.total_seconds()
    if dialect_precision_s >= 1:
        # Whole-second timestamps: the run took less than the span they show plus one second, so this is
        # a lower bound, and it holds for a run that fits within one second too.
        bound = seconds + dialect_precision_s
        rate = f"at least {summary.processed / bound:.1f} jobs/s  ({summary.processed} jobs, first "
        rate += f"enqueue to last finish within {bound:.0f} s, timestamps in whole seconds)"
    elif seconds > 0:
        rate = f"{summary.processed / seconds:.1f} jobs/s  ({summary.processed} jobs, first enqueue to last "
        rate += f"finish in {seconds:.2f} s)"
    else:
        rate = "n/a (all jobs finished within the timestamps' precision)"
    lines = [
        f"Demo summary, read back from {db.tables.archived} (queue {DEMO_QUEUE}):",
        f"  processed   {summary.processed:>5} jobs",
        f"  succeeded   {summary.succeeded:>5}",
        f"  failed      {summary.failed:>5}  (still failing after {RETRIES + 1} attempts)",
        f"  retried     {summary.retried:>5}  (jobs that needed more than one attempt)",
        f"  attempts    {summary.attempts:>5}",
        f"  throughput  {rate}",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    tables = tables_from(args)
    progress = _progress()
    payloads = plan(args.jobs)
    queue = to_keyword_text(DEMO_QUEUE, what="queue")
    with open_database(args, tables) as db:
        conn = db.connect()
        try:
            since = _run_start(db.dialect)
            for payload in payloads:
                enqueue(conn, DEMO_JOB_TYPE, payload, queue=queue, job_table=tables.job)
            conn.commit()
            done, interrupted = _work_off(args, db, conn, since, progress)
            summary = archive_summary(
                conn,
                queue=queue,
                since=since,
                job_table=tables.job,
                archived_job_table=tables.archived,
                dialect=db.dialect,
            )
        finally:
            conn.close()
    sys.stdout.write(format_summary(summary, db, 1.0 if db.dialect == "mysql" else 0.0))
    if interrupted:
        notice("demo interrupted")
        return ExitCode.INTERRUPTED
    if done < args.jobs:
        raise CliError(
            f"the demo timed out after {args.timeout:g} s with {done} of {args.jobs} jobs archived"
        )
    return ExitCode.OK


def _run_start(dialect: str) -> datetime:
    """The moment this run's jobs count from, in the precision the archive keeps.

    MySQL keeps whole seconds, which the server makes by truncating (MariaDB) or rounding (MySQL): a job
    an earlier run enqueued half a second or less before a whole second can be stored as that second. So
    on MySQL the run starts on a whole second at least half a second after now, and waits for it.
    """
    now = system_utc()
    if dialect != "mysql":
        return now
    start = (now + timedelta(seconds=1.5)).replace(microsecond=0)
    time.sleep((start - now).total_seconds())
    return start


def _work_off(
    args: argparse.Namespace, db: Database, conn: Any, since: Any, progress: Any
) -> tuple[int, bool]:
    """Run the demo's worker until every demo job is archived; returns (archived, interrupted)."""
    counter = EventCounter()
    run_state = WorkerRun()
    worker = run_state.create(
        db,
        demo_handler,
        queue=DEMO_QUEUE,
        handler_fn_mode="advanced",
        retry_strategy_fn=_same_strategy,
        log=counter,
        polling_interval_ms=20,
        worker_threads=args.threads,
        await_termination_timeout_ms=5_000,
    )
    queue = to_keyword_text(DEMO_QUEUE, what="queue")
    done = 0
    with stop_on_signals(run_state.stop_requested), progress:
        task = progress.add_task(counter.describe(), total=args.jobs)
        worker.start()
        deadline = time.monotonic() + args.timeout
        while done < args.jobs and time.monotonic() < deadline:
            if run_state.wait(_PROGRESS_POLL_S):
                break
            done = archived_count(
                conn,
                queue=queue,
                since=since,
                job_table=db.tables.job,
                archived_job_table=db.tables.archived,
                dialect=db.dialect,
            )
            progress.update(task, completed=done, description=counter.describe())
        interrupted = run_state.stop_requested.is_set() and run_state.error is None
        run_state.finish(worker, db, 5_000)
        progress.update(task, completed=done, description=counter.describe())
    return done, interrupted
