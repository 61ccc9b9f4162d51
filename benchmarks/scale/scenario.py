"""One load run for the scale-out tests and benchmarks: enqueuers and workers, an optional fault, the tally.

Each job's payload is its number n. Enqueuers commit batches; a batch whose COMMIT raised is "uncertain"
(it may or may not have committed), a batch that failed before its COMMIT is enqueued again. At the end
the archive must hold every committed job exactly once, an uncertain one at most once, and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.harness import SqlHarness
from proletarian_ref import create_queue_worker, create_serializer, enqueue
from proletarian_ref import log as ev
from proletarian_ref.worker import QueueWorker

JOB_TYPE = "scale/job"
ENQUEUE_RETRY_S = 0.1
PROBE_S = 0.05


@dataclass(frozen=True, slots=True)
class Run:
    """One handler call: which job, on which worker (or host)."""

    n: int
    worker: int


class Recorder:
    """The handlers of all workers: records every run, so a job run twice is told from one lost."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.runs: list[Run] = []
        self._lock = threading.Lock()

    def handler(self, worker: int) -> Callable[[str, Any], None]:
        def handle(job_type: str, payload: Any) -> None:
            # A little work, so a fault finds jobs in flight rather than only between jobs.
            time.sleep(self.work_s)
            with self._lock:
                self.runs.append(Run(int(payload), worker))

        return handle

    def count(self) -> int:
        with self._lock:
            return len(self.runs)


class EventLog:
    """The workers' log: counts every event and keeps only the errors (thousands of jobs' would not fit)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.errors: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        with self._lock:
            self.counts[event] += 1
            if event in (ev.SQL_TRANSIENT_EXCEPTION, ev.JOB_WORKER_ERROR, ev.HANDLE_JOB_EXCEPTION):
                error = data.get(ev.EXCEPTION) or data.get(ev.THROWABLE)
                self.errors.append((event, f"{type(error).__name__}: {error}"))

    def named(self, event: str) -> list[str]:
        with self._lock:
            return [text for name, text in self.errors if name == event]


def _load_average() -> tuple[float, ...]:
    return tuple(round(x, 1) for x in os.getloadavg())


@dataclass
class Outcome:
    """What a run did; `problems` is empty when every promise held."""

    jobs: int
    committed: set[int] = field(default_factory=set)
    uncertain: set[int] = field(default_factory=set)
    enqueue_errors: list[str] = field(default_factory=list)
    archived: Counter[int] = field(default_factory=Counter)
    statuses: set[str] = field(default_factory=set)
    left_in_queue: int = 0
    runs: list[Run] = field(default_factory=list)
    seconds: float = 0.0
    fault_at: float | None = None
    longest_gap_s: float = 0.0
    gap_started_after_fault_s: float | None = None
    fault_to_progress_s: float | None = None
    stall_after_fault_s: float | None = None
    fault_to_recovery_s: float | None = None
    workers_running: bool = True
    events: EventLog = field(default_factory=EventLog)
    drained: bool = False
    # The machine is shared: figures mean little without how busy it was.
    load_average: tuple[float, ...] = field(
        default_factory=lambda: tuple(round(x, 1) for x in os.getloadavg())
    )

    @property
    def extra_runs(self) -> int:
        return sum(count - 1 for count in Counter(run.n for run in self.runs).values())

    @property
    def jobs_run_twice(self) -> int:
        return sum(1 for count in Counter(run.n for run in self.runs).values() if count > 1)

    @property
    def jobs_per_s(self) -> float:
        return sum(self.archived.values()) / self.seconds if self.seconds else 0.0

    def per_worker(self) -> Counter[int]:
        return Counter(run.worker for run in self.runs)

    @property
    def problems(self) -> list[str]:
        found: list[str] = []
        if not self.drained:
            found.append(f"not drained: {self.left_in_queue} jobs left in the queue")
        missing = sorted(n for n in self.committed if self.archived[n] == 0)
        twice = sorted(n for n, count in self.archived.items() if count > 1)
        unknown = sorted(n for n in self.archived if n not in self.committed and n not in self.uncertain)
        for label, items in (
            ("committed jobs never archived", missing),
            ("jobs archived more than once", twice),
            ("archived jobs nobody enqueued", unknown),
        ):
            if items:
                found.append(f"{len(items)} {label} (e.g. {items[:5]})")
        if self.statuses - {":success"}:
            found.append(f"archived statuses {sorted(self.statuses)}")
        run_jobs = {run.n for run in self.runs}
        if not_run := sorted(n for n in self.archived if n not in run_jobs):
            found.append(f"{len(not_run)} archived jobs never handled (e.g. {not_run[:5]})")
        if not self.workers_running:
            found.append("a worker stopped for good")
        if errors := self.events.named(ev.JOB_WORKER_ERROR):
            found.append(f"{len(errors)} job-worker-error, e.g. {errors[:3]}")
        return found

    def figures(self) -> dict[str, Any]:
        """The numbers a benchmark prints and the docs quote."""
        transient = self.events.named(ev.SQL_TRANSIENT_EXCEPTION)
        return {
            "load_average_at_start": list(self.load_average),
            "jobs_committed": len(self.committed),
            "jobs_uncertain": len(self.uncertain),
            "archived": sum(self.archived.values()),
            "handler_runs": len(self.runs),
            "jobs_run_twice": self.jobs_run_twice,
            "extra_runs": self.extra_runs,
            "seconds": round(self.seconds, 2),
            "jobs_per_s": round(self.jobs_per_s, 1),
            "longest_gap_without_progress_s": round(self.longest_gap_s, 2),
            "gap_started_after_fault_s": _rounded(self.gap_started_after_fault_s),
            "fault_to_progress_s": _rounded(self.fault_to_progress_s),
            "stall_after_fault_s": _rounded(self.stall_after_fault_s),
            "fault_to_recovery_s": _rounded(self.fault_to_recovery_s),
            "transient_errors": len(transient),
            "transient_error_kinds": dict(Counter(_driver_error(text) for text in transient)),
            "transient_error_samples": sorted({text[:160] for text in transient})[:4],
            "enqueue_errors": len(self.enqueue_errors),
            "runs_per_worker": dict(sorted(self.per_worker().items())),
            "problems": self.problems,
        }


def _driver_error(text: str) -> str:
    """ "TransientDatabaseError: OperationalError: (1213, ...)" -> "OperationalError 1213"."""
    parts = text.split(": ", 2)
    kind = parts[1] if len(parts) > 1 else parts[0]
    code = parts[2][1:5] if len(parts) > 2 and parts[2][:1] == "(" and parts[2][1:5].isdigit() else ""
    return f"{kind} {code}".strip()


def enqueuer(
    connect: Callable[[], Any],
    numbers: Sequence[int],
    batch: int,
    job_table: str,
    outcome: Outcome,
    lock: threading.Lock,
    deadline: float,
    pause_s: float = 0.0,
) -> None:
    """Enqueue `numbers` in batches until done or `deadline`, noting what surely or maybe committed.

    `pause_s` between batches spreads the enqueues over the run, so a fault finds some in flight.
    """
    conn: Any = None
    pending = list(numbers)
    while pending and time.monotonic() < deadline:
        chunk = pending[:batch]
        committing = False
        try:
            if conn is None:
                conn = connect()
            for n in chunk:
                enqueue(conn, JOB_TYPE, n, job_table=job_table)
            committing = True
            conn.commit()
        except Exception as exc:
            with lock:
                outcome.enqueue_errors.append(f"{type(exc).__name__}: {exc}")
                if committing:
                    outcome.uncertain.update(chunk)
            if committing:
                del pending[: len(chunk)]
            with contextlib.suppress(Exception):
                conn.close()
            conn = None
            time.sleep(ENQUEUE_RETRY_S)
            continue
        with lock:
            outcome.committed.update(chunk)
        del pending[: len(chunk)]
        if pause_s and pending:
            time.sleep(pause_s)
    if conn is not None:
        conn.close()


def _count(harness: SqlHarness, table: str) -> int:
    return int(harness.select(f"SELECT count(*) FROM {table}")[0][0])


def _left(harness: SqlHarness) -> int:
    try:
        return _count(harness, harness.job_table)
    except Exception:
        return -1  # the database cannot be reached just now


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


class ProgressProbe:
    """Samples the archive's row count every PROBE_S from its own thread: progress as a reader sees it.

    A handler's end is not progress: its COMMIT can still hang (a Galera view change) or fail (a lost
    primary). So the time without progress is measured on committed rows, to about PROBE_S.
    """

    def __init__(self, harness: SqlHarness) -> None:
        self._harness = harness
        self._stop = threading.Event()
        self.samples: list[tuple[float, int]] = []
        self._thread = threading.Thread(target=self._run, name="progress-probe", daemon=True)

    def __enter__(self) -> ProgressProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        statement = f"SELECT count(*) FROM {self._harness.archived_job_table}"
        while not self._stop.wait(PROBE_S):
            try:
                count = int(self._harness.select(statement)[0][0])
            except Exception:
                continue  # the database cannot be reached just now: no sample
            self.samples.append((time.monotonic(), count))

    def first_after(self, at: float, count: int) -> float | None:
        """Seconds from `at` to the first sample after it that saw more than `count` rows."""
        return next((t - at for t, seen in self.samples if t > at and seen > count), None)

    def longest_gap(self, start: float) -> tuple[float, float]:
        """The longest time between two samples that saw the count grow, and when it began."""
        gap, began, last = 0.0, start, start
        previous = 0
        for at, count in self.samples:
            if count > previous:
                if at - last > gap:
                    gap, began = at - last, last
                last, previous = at, count
        return gap, began

    def stall_after(self, at: float) -> tuple[float, float] | None:
        """The longest time without progress that ended after `at`, and when it ended (seconds after `at`).

        Unlike the first progress after `at`, this sees a fault whose effect comes later than its start (a
        switchover's primary serves until it is demoted), and the first commit after it.
        """
        found: tuple[float, float] | None = None
        last, previous = None, -1
        for t, count in self.samples:
            if count > previous:
                if last is not None and t > at and (found is None or t - last > found[0]):
                    found = (t - last, t - at)
                last, previous = t, count
        return found


class Load:
    """One run in progress: workers, enqueuers and the progress probe started; the fault marked; the tally.

    `run_load` is the whole of it for one fault; a caller that drives the fault itself (several loads at
    once, or a fault with steps of its own) calls start(), wait_handled(), mark_fault() and finish().
    """

    def __init__(
        self,
        harness: SqlHarness,
        *,
        jobs: int,
        worker_sources: Sequence[Any],
        threads: int,
        enqueue_connects: Sequence[Callable[[], Any]],
        batch: int = 50,
        work_s: float = 0.0005,
        timeout_s: float = 120.0,
        polling_interval_ms: int = 10,
        enqueue_pause_s: float = 0.0,
    ) -> None:
        self.harness = harness
        self.jobs = jobs
        self.threads_total = threads * len(worker_sources)
        self.outcome = Outcome(jobs)
        self.recorder = Recorder(work_s)
        self.start_at = time.monotonic()
        self.deadline = self.start_at + timeout_s
        self.archived_before = 0
        self.workers: list[QueueWorker] = [
            create_queue_worker(
                source,
                self.recorder.handler(w),
                job_table=harness.job_table,
                archived_job_table=harness.archived_job_table,
                worker_threads=threads,
                polling_interval_ms=polling_interval_ms,
                log=self.outcome.events,
                queue_worker_id=f"scale-{w}",
            )
            for w, source in enumerate(worker_sources)
        ]
        lock = threading.Lock()
        shares = [range(i, jobs, len(enqueue_connects)) for i in range(len(enqueue_connects))]
        self.enqueuers = [
            threading.Thread(
                target=enqueuer,
                args=(connect, share, batch, harness.job_table, self.outcome, lock, self.deadline),
                kwargs={"pause_s": enqueue_pause_s},
                name=f"enqueuer-{i}",
            )
            for i, (connect, share) in enumerate(zip(enqueue_connects, shares, strict=True))
        ]
        self.probe = ProgressProbe(harness)

    def start(self) -> Load:
        for worker in self.workers:
            worker.start()
        self.probe.__enter__()
        for thread in self.enqueuers:
            thread.start()
        return self

    def wait_handled(self, fraction: float) -> None:
        """Until `fraction` of the jobs have been handled (or the run's deadline)."""
        while self.recorder.count() < self.jobs * fraction and time.monotonic() < self.deadline:
            time.sleep(0.01)

    def mark_fault(self) -> None:
        """The fault strikes now: figures after it are measured from here."""
        self.archived_before = _count(self.harness, self.harness.archived_job_table)
        self.outcome.fault_at = time.monotonic()

    def finish(self) -> Outcome:
        """Wait for the enqueuers and the drain (up to the deadline), stop the workers, count the archive."""
        outcome, harness = self.outcome, self.harness
        try:
            for thread in self.enqueuers:
                thread.join(max(self.deadline - time.monotonic(), 0.1))
            while time.monotonic() < self.deadline:
                outcome.left_in_queue = _left(harness)
                if outcome.left_in_queue == 0 and not any(t.is_alive() for t in self.enqueuers):
                    outcome.drained = True
                    break
                time.sleep(0.05)
            outcome.seconds = time.monotonic() - self.start_at
            outcome.workers_running = all(worker.running for worker in self.workers)
        finally:
            self.probe.__exit__(None, None, None)
            for worker in self.workers:
                worker.stop()
        outcome.runs = list(self.recorder.runs)
        outcome.longest_gap_s, began = self.probe.longest_gap(self.start_at)
        if outcome.fault_at is not None:
            outcome.gap_started_after_fault_s = began - outcome.fault_at
            # Each thread may have had one COMMIT racing the fault: progress is a commit beyond those.
            outcome.fault_to_progress_s = self.probe.first_after(
                outcome.fault_at, self.archived_before + self.threads_total
            )
            if (stall := self.probe.stall_after(outcome.fault_at)) is not None:
                outcome.stall_after_fault_s, outcome.fault_to_recovery_s = stall
        serializer = create_serializer()
        rows = harness.select(f"SELECT payload, status FROM {harness.archived_job_table}")
        outcome.archived = Counter(int(serializer.decode(payload)) for payload, _ in rows)
        outcome.statuses = {status for _, status in rows}
        return outcome


def run_load(
    harness: SqlHarness,
    *,
    fault: Callable[[], None] | None = None,
    fault_after: float = 0.3,
    **load: Any,
) -> Outcome:
    """Run a Load (its keyword arguments: jobs, worker_sources, threads, enqueue_connects, ...) to the end.

    `fault` is called (in this thread) once `fault_after` of the jobs have been handled. `harness` reads
    the tables at the end, so its connections must reach the database that survived the fault.
    """
    started = Load(harness, **load).start()
    try:
        if fault is not None:
            started.wait_handled(fault_after)
            started.mark_fault()
            fault()
    finally:
        outcome = started.finish()
    return outcome
