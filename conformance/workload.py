"""Workloads for the property tests: the plan, the workers that drain it, the invariants to check."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from conformance.clocks import frozen
from conformance.harness import Harness
from proletarian_ref import log as ev
from proletarian_ref.backend import STATUS_FAILURE, STATUS_SUCCESS, ArchivedJobRecord, JobRecord
from proletarian_ref.clock import Clock
from proletarian_ref.job import Job, default_serializer, encode_payload, enqueue
from proletarian_ref.job_ids import JobIdStrategy
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.worker import QueueWorker, create_queue_worker

Due = Literal["past", "now", "future"]


class PlannedFailure(Exception):
    """Raised by a handler on an attempt its script says must fail."""


@dataclass(frozen=True, slots=True)
class Script:
    """What a job's handler does: fail its first `fail_times` attempts, each taking `work_ms` of real time."""

    fail_times: int
    retries: int
    delay_ms: int
    work_ms: int

    @property
    def runs(self) -> int:
        """Handler calls until the job is archived: the failures retried, plus the last attempt."""
        return min(self.fail_times, self.retries) + 1

    @property
    def status(self) -> str:
        return STATUS_SUCCESS if self.fail_times <= self.retries else STATUS_FAILURE

    def retry_strategy(self) -> dict[str, Any]:
        return {"retries": self.retries, "delays": [self.delay_ms]}


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One job of a workload; `offset` is how far before or after its enqueue time it is due."""

    queue: str
    job_type: str
    payload: Any
    due: Due
    offset: timedelta
    script: Script


@dataclass(frozen=True, slots=True)
class Workload:
    """Jobs plus the workers that compete for them: `workers[queue]` holds one thread count per slot.

    In-process, a slot is a queue worker of its own (its own backend and connections); across processes,
    slot i is the queue worker of process i, and 0 threads means that process leaves the queue alone.
    """

    jobs: tuple[PlannedJob, ...]
    workers: dict[str, tuple[int, ...]]

    @property
    def slots(self) -> int:
        return max(len(counts) for counts in self.workers.values())

    def single_worker_queues(self) -> set[str]:
        """Queues drained by exactly one thread, whose jobs must therefore run in process_at order."""
        return {queue for queue, counts in self.workers.items() if sum(counts) == 1}

    def longest_wait(self) -> timedelta:
        """The latest a job can become due, in virtual time, counting every planned retry delay."""
        latest = timedelta(0)
        for job in self.jobs:
            start = job.offset if job.due == "future" else timedelta(0)
            retries = timedelta(milliseconds=job.script.delay_ms) * (job.script.runs - 1)
            latest = max(latest, start + retries)
        return latest


@dataclass(frozen=True, slots=True)
class Enqueued:
    """A job as enqueued: its id, the plan, and what the tables must show for it."""

    job_id: Any
    key: str
    plan: PlannedJob
    payload_text: str
    enqueued_at: datetime
    process_at: datetime


@dataclass(frozen=True, slots=True)
class Call:
    """One handler execution, stamped on the virtual clock and on the shared monotonic clock (ns)."""

    key: str
    worker: str
    worker_queue: str
    job_queue: str
    attempt: int
    process_at: datetime
    started: datetime
    ended: datetime
    started_ns: int
    ended_ns: int


def job_key(strategy: JobIdStrategy, stored_id: Any) -> str:
    """The same text for a job id in every process, whatever form the database returns it in."""
    return str(strategy.decode_id(stored_id))


def enqueue_workload(harness: Harness, workload: Workload, clock: Clock) -> list[Enqueued]:
    """Enqueue every planned job in one caller transaction, each at a time its plan dictates."""
    backend = harness.backend()
    strategy = harness.job_id_strategy()
    serializer = default_serializer()
    enqueued: list[Enqueued] = []
    conn = harness.connect()
    try:
        for plan in workload.jobs:
            now = clock()
            enqueue_time = now - plan.offset if plan.due == "past" else now
            process_at = now + plan.offset if plan.due == "future" else None
            job_id = enqueue(
                conn,
                plan.job_type,
                plan.payload,
                queue=plan.queue,
                process_at=process_at,
                job_table=harness.job_table,
                serializer=serializer,
                job_id_strategy=strategy,
                clock=frozen(enqueue_time),
                backend=backend,
            )
            enqueued.append(
                Enqueued(
                    job_id=job_id,
                    key=str(job_id),
                    plan=plan,
                    payload_text=encode_payload(serializer, plan.payload),
                    enqueued_at=enqueue_time,
                    process_at=process_at if process_at is not None else enqueue_time,
                )
            )
        conn.commit()
    finally:
        conn.close()
    return enqueued


class Recorder:
    """Collects handler calls and worker errors from any thread; wakes a waiter at the expected count."""

    def __init__(self, expected_calls: int) -> None:
        self.expected_calls = expected_calls
        self.calls: list[Call] = []
        self.errors: list[str] = []
        self._cond = threading.Condition()

    def call(self, call: Call) -> None:
        with self._cond:
            self.calls.append(call)
            self._cond.notify_all()

    def error(self, message: str) -> None:
        with self._cond:
            self.errors.append(message)

    def wait(self, timeout: float) -> bool:
        """Whether every planned call happened within `timeout` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.calls) >= self.expected_calls, timeout)


def make_handler(
    scripts: Mapping[str, Script],
    worker_queue: str,
    worker: str,
    clock: Clock,
    emit: Callable[[Call], None],
) -> Callable[[Job], None]:
    """An advanced-mode handler that records each call and fails as the job's script says."""

    def handler(job: Job) -> None:
        started_ns = time.monotonic_ns()
        started = clock()
        key = str(job.job_id)
        script = scripts.get(key)
        if script is not None and script.work_ms:
            # Simulated work, so that two executions of one job, if a backend allowed them, would overlap.
            time.sleep(script.work_ms / 1000)
        emit(
            Call(
                key=key,
                worker=f"{worker}/{threading.current_thread().name}",
                worker_queue=worker_queue,
                job_queue=job.queue,
                attempt=job.attempts,
                process_at=job.process_at,
                started=started,
                ended=clock(),
                started_ns=started_ns,
                ended_ns=time.monotonic_ns(),
            )
        )
        if script is None or job.attempts <= script.fail_times:
            raise PlannedFailure(f"attempt {job.attempts} of job {key} fails as planned")

    return handler


def start_worker(
    harness: Harness,
    queue: str,
    threads: int,
    scripts: Mapping[str, Script],
    clock: Clock,
    recorder_call: Callable[[Call], None],
    recorder_error: Callable[[str], None],
    label: str,
) -> QueueWorker:
    """A started queue worker on a backend of its own, recording into the given callbacks."""

    def retry_strategy(job: Job, exc: BaseException) -> dict[str, Any] | None:
        script = scripts.get(str(job.job_id))
        return None if script is None else script.retry_strategy()

    def log(event: str, data: Mapping[str, Any]) -> None:
        if event in (ev.JOB_WORKER_ERROR, ev.SQL_TRANSIENT_EXCEPTION, ev.QUEUE_WORKER_SHUTDOWN_ERROR):
            recorder_error(f"{label}: {event}: {data.get(ev.THROWABLE)!r}")

    def keep_polling(exc: BaseException) -> bool:
        # Keep going after an error (it is recorded by the log function): one broken transaction must
        # not hide what the remaining jobs would show.
        return False

    worker = create_queue_worker(
        None,
        make_handler(scripts, queue, label, clock, recorder_call),
        backend=harness.backend(),
        queue=queue,
        job_table=harness.job_table,
        archived_job_table=harness.archived_job_table,
        job_id_strategy=harness.job_id_strategy(),
        handler_fn_mode="advanced",
        retry_strategy_fn=retry_strategy,
        log=log,
        queue_worker_id=label,
        polling_interval_ms=2,
        worker_threads=threads,
        on_polling_error=keep_polling,
        await_termination_timeout_ms=10_000,
        clock=clock,
        **harness.worker_options,
    )
    worker.start()
    return worker


@dataclass
class Outcome:
    """Everything a drained workload left behind, for check_outcome."""

    enqueued: list[Enqueued]
    stored: list[JobRecord]
    calls: list[Call]
    errors: list[str]
    finished: bool
    jobs: list[JobRecord] = field(default_factory=list)
    archived: list[ArchivedJobRecord] = field(default_factory=list)


def check_outcome(
    outcome: Outcome,
    workload: Workload,
    strategy: JobIdStrategy,
    precision: timedelta,
    *,
    ordered: bool = True,
) -> list[str]:
    """Every broken invariant, each prefixed with the clause it breaks; empty when the backend behaved.

    `ordered` is False for a backend whose claims may lock rows they do not return (InnoDB): there a
    queue's only worker can meet its oldest job locked by another queue's poll and take a later one.
    """
    problems: list[str] = []
    by_key = {e.key: e for e in outcome.enqueued}
    calls: dict[str, list[Call]] = defaultdict(list)
    for call in sorted(outcome.calls, key=lambda c: c.started_ns):
        calls[call.key].append(call)
    expected_calls = sum(e.plan.script.runs for e in outcome.enqueued)

    if len(outcome.stored) != len(outcome.enqueued):
        problems.append(
            f"P-lost: {len(outcome.enqueued)} jobs enqueued and committed, but the job table holds "
            f"{len(outcome.stored)}"
        )
    if not outcome.finished:
        problems.append(
            f"P-finish: only {len(outcome.calls)} of {expected_calls} planned handler calls happened in time"
        )
    problems.extend(f"P-errors: a worker failed: {error}" for error in outcome.errors[:5])

    queued = Counter(job_key(strategy, j.job_id) for j in outcome.jobs)
    archived_count = Counter(job_key(strategy, a.job_id) for a in outcome.archived)
    archived = {job_key(strategy, a.job_id): a for a in outcome.archived}
    for key in sorted(set(by_key) - set(queued) - set(archived_count)):
        problems.append(f"P-lost: job {key} is in neither the job table nor the archive")
    for key in sorted((set(queued) | set(archived_count)) - set(by_key)):
        problems.append(f"P-lost: job {key} was never enqueued but is in the tables")
    for key in sorted(set(queued)):
        if key in by_key:
            problems.append(f"P-lost: job {key} is still in the job table after all its planned runs")

    for key, entry in sorted(by_key.items()):
        script = entry.plan.script
        job_calls = calls.get(key, [])
        if archived_count.get(key, 0) > 1:
            problems.append(f"P-once: job {key} is archived {archived_count[key]} times")
        row = archived.get(key)
        if row is not None:
            problems.extend(_check_archived_row(key, entry, row, job_calls, precision))
        if len(job_calls) != script.runs:
            problems.append(f"P-runs: job {key} ran {len(job_calls)} times; its script plans {script.runs}")
        attempts = [c.attempt for c in job_calls]
        if attempts != list(range(1, len(job_calls) + 1)):
            problems.append(f"P-runs: job {key} saw attempts {attempts}; expected 1, 2, 3, ... in order")
        for first, second in itertools.pairwise(job_calls):
            if second.started_ns < first.ended_ns:
                problems.append(
                    f"P-overlap: job {key} ran in {first.worker} and {second.worker} at the same time "
                    f"(attempts {first.attempt} and {second.attempt})"
                )
        due = entry.process_at
        for call in job_calls:
            if call.started <= due - precision:
                problems.append(
                    f"P-early: job {key} attempt {call.attempt} started at {call.started.isoformat()} "
                    f"but was not due before {due.isoformat()}"
                )
            if call.job_queue != entry.plan.queue or call.worker_queue != entry.plan.queue:
                problems.append(
                    f"P-queue: job {key} of queue {entry.plan.queue} ran as a {call.job_queue} job in the "
                    f"worker of {call.worker_queue}"
                )
            # A failed attempt makes the job due again its retry delay after the failure, not sooner.
            due = call.ended + timedelta(milliseconds=script.delay_ms)

    for queue in sorted(workload.single_worker_queues() if ordered else ()):
        seen = [c for c in sorted(outcome.calls, key=lambda c: c.started_ns) if c.worker_queue == queue]
        for before, after in itertools.pairwise(seen):
            if after.process_at < before.process_at:
                problems.append(
                    f"P-order: the only worker of {queue} ran job {after.key} (process_at "
                    f"{after.process_at.isoformat()}) after job {before.key} (process_at "
                    f"{before.process_at.isoformat()})"
                )
                break
    return problems


def _check_archived_row(
    key: str, entry: Enqueued, row: ArchivedJobRecord, job_calls: Sequence[Call], precision: timedelta
) -> list[str]:
    script = entry.plan.script
    problems: list[str] = []
    if row.status != script.status:
        problems.append(
            f"P-status: job {key} is archived as {row.status!r}; its script ends in {script.status!r}"
        )
    if row.attempts != script.runs:
        problems.append(
            f"P-status: job {key} is archived with attempts {row.attempts}; it ran {script.runs} times"
        )
    if row.payload != entry.payload_text:
        problems.append(f"P-status: job {key}'s archived payload text differs from the text enqueued")
    if (row.queue, row.job_type) != (
        to_keyword_text(entry.plan.queue, what="queue"),
        to_keyword_text(entry.plan.job_type, what="job_type"),
    ):
        problems.append(
            f"P-status: job {key} is archived with queue {row.queue!r} and job type {row.job_type!r}"
        )
    if abs(row.enqueued_at - entry.enqueued_at) >= precision:
        problems.append(
            f"P-status: job {key} is archived with enqueued_at {row.enqueued_at.isoformat()}; "
            f"it was enqueued at {entry.enqueued_at.isoformat()}"
        )
    if job_calls:
        last = job_calls[-1]
        if row.process_at != last.process_at:
            problems.append(
                f"P-status: job {key} is archived with process_at {row.process_at.isoformat()}; its last run "
                f"saw {last.process_at.isoformat()}"
            )
        if row.finished_at <= last.ended - precision:
            problems.append(
                f"P-status: job {key} is archived with finished_at {row.finished_at.isoformat()}, before its "
                f"last run ended at {last.ended.isoformat()}"
            )
    return problems
