"""Property tests: random workloads drained by competing workers, a killed worker, the model test."""

from __future__ import annotations

import contextvars
import os
import queue as queue_module
import signal
import threading
from datetime import timedelta
from typing import Any, ClassVar, Final

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from conformance import profiles
from conformance.agents import AgentPool
from conformance.base import SUPPRESSED, SuiteBase, no_log, property_test, scaled_examples
from conformance.capabilities import NEEDS_FACTORY, NEEDS_SIGKILL, capability, requires
from conformance.clocks import EPOCH, ManualClock, VirtualClock
from conformance.drain import (
    PROCESS_START_S,
    crash_child,
    drain_in_processes,
    drain_in_threads,
    process_context,
)
from conformance.faults import BlockedError, DoubleClaim
from conformance.harness import Harness
from conformance.model import model_machine
from conformance.strategies import process_workloads, thread_workloads
from conformance.workload import Outcome, Workload, check_outcome
from proletarian_ref.backend import STATUS_SUCCESS
from proletarian_ref.job import Job
from proletarian_ref.worker import create_queue_worker

# Examples per test as a share of the profile's max_examples: processes cost most, the model least.
THREAD_WEIGHT: Final = 2.0
PROCESS_WEIGHT: Final = 0.7
MODEL_WEIGHT: Final = 3.0
MODEL_STEPS: Final = 40
# The queue of the diagnosis a drain's failure gets before it is shrunk (_diagnose_blocking).
PROBE_QUEUE: Final = "conformance/probe"
PROBE_QUEUE_TEXT: Final = ":conformance/probe"
# The invariants whose breach means one job was held by two workers at once.
DOUBLE_RUNS: Final = ("P-overlap", "P-once")
# Set by conformance.runner to run the model test briefly against a mutant.
model_settings_override: contextvars.ContextVar[settings | None] = contextvars.ContextVar(
    "model_settings_override", default=None
)
_MODEL_EXAMPLES: Final = scaled_examples(MODEL_WEIGHT)


def _report(problems: list[str], outcome: Outcome) -> str:
    shown = "\n  ".join(problems[:20])
    more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
    return (
        f"{len(problems)} broken invariants after draining {len(outcome.enqueued)} jobs "
        f"({len(outcome.calls)} handler calls):\n  {shown}{more}"
    )


class PropertyTests(SuiteBase):
    """Invariants that must survive any workload, any number of workers, threads or processes, and crashes."""

    __test__ = False
    # Virtual seconds per real second for the workers' shared clock: a job due in 90 s is due in 0.15 s.
    virtual_speed: ClassVar[float] = 600.0

    def _check(self, harness: Harness, workload: Workload, outcome: Outcome) -> None:
        ordered = bool(capability(harness, "claim_locks_only_the_claimed_row"))
        problems = check_outcome(
            outcome, workload, harness.job_id_strategy(), self.precision(harness), ordered=ordered
        )
        if not problems:
            return
        report = _report(problems, outcome)
        if any(problem.startswith(DOUBLE_RUNS) for problem in problems):
            # Two workers ran one job: the claim's lock is missing, which no smaller workload explains better.
            raise DoubleClaim(
                "get_next_job let two workers hold one job (its row lock is missing or released early): "
                + report
            )
        self._diagnose_blocking(harness, report)
        raise AssertionError(report)

    def _diagnose_blocking(self, harness: Harness, report: str) -> None:
        """Before a drain's failure is shrunk, see whether a claim waits for a row another transaction
        holds, as S5 does: workers that queue behind each other's locks break the drain in ways no smaller
        workload explains better, so that failure is raised as found (BlockedError, not shrunk)."""
        if not capability(harness, "skip_locked"):
            return
        job_table, _ = self.tables(harness)
        harness.clear()
        self.enqueue_job(harness, EPOCH, queue=PROBE_QUEUE)
        with AgentPool(harness.make_backend, self.step_timeout) as pool:
            holder, other = pool.agent(), pool.agent()
            holder.begin()
            other.begin()
            self.claim_in(holder, job_table, PROBE_QUEUE_TEXT, EPOCH)
            try:
                self.claim_in(
                    other,
                    job_table,
                    PROBE_QUEUE_TEXT,
                    EPOCH,
                    "get_next_job beside a job another transaction holds",
                )
            except BlockedError as exc:
                raise BlockedError(f"{exc}; which explains this drain's failure: {report}") from None
            finally:
                holder.rollback()
        harness.clear()

    @property_test(THREAD_WEIGHT, workload=thread_workloads())
    def test_competing_worker_threads_run_every_job_as_planned(
        self, harness: Harness, workload: Workload
    ) -> None:
        """P1 (threads): no overlap, archived once with the right status, never early, nothing lost, in order.

        P-overlap: no two executions of one job overlap. P-once/P-status: each job is archived exactly once,
        with the status, attempts and payload its script implies. P-early: no job runs before its
        process_at (to within the time precision). P-lost: job table + archive = everything enqueued.
        P-order: a queue's only worker runs its jobs in process_at order (where claims lock only the row
        they claim; see S7). P-queue: queues stay apart.
        """
        harness.clear()
        try:
            outcome = drain_in_threads(harness, workload, VirtualClock.start(speed=self.virtual_speed))
            self._check(harness, workload, outcome)
        finally:
            harness.close()

    @requires(NEEDS_FACTORY, multi_process=True)
    @property_test(PROCESS_WEIGHT, workload=process_workloads())
    def test_competing_worker_processes_run_every_job_as_planned(
        self, harness: Harness, workload: Workload
    ) -> None:
        """P2 (processes): the invariants of P1, with the workers in separate processes."""
        harness.clear()
        try:
            outcome = drain_in_processes(harness, workload, VirtualClock.start(speed=self.virtual_speed))
            self._check(harness, workload, outcome)
        finally:
            harness.close()

    @requires(NEEDS_FACTORY, NEEDS_SIGKILL, multi_process=True)
    def test_a_worker_killed_mid_handler_leaves_its_job_to_another_worker(self, harness: Harness) -> None:
        """T5 (crash): a SIGKILLed worker's job goes to the next worker, attempts unchanged; one archive."""
        assert harness.factory is not None
        queue = "conformance/crash"
        job_id = self.enqueue_job(harness, EPOCH, queue=queue, payload={"crash": "😀"})
        stored = self.only_job(harness)
        context = process_context(harness)
        outbox: Any = context.Queue()
        process = context.Process(
            target=crash_child,
            args=(harness.factory, queue, EPOCH + timedelta(seconds=1), outbox),
            name="conformance-crash",
            daemon=True,
        )
        process.start()
        try:
            try:
                message = outbox.get(timeout=PROCESS_START_S)
            except queue_module.Empty:
                pytest.fail(f"T5: the worker process did not start the job within {PROCESS_START_S:g} s")
            assert message[0] == "started", f"T5: the worker process failed: {message}"
            assert tuple(message[1:]) == (str(job_id), 1), (
                f"T5: the worker process ran job {message[1]} as attempt {message[2]}; expected job {job_id} "
                "as attempt 1 (get_next_job's row)"
            )
            os.kill(process.pid, signal.SIGKILL)
            process.join(10)
            assert process.exitcode == -signal.SIGKILL, (
                f"T5: the worker process ended with exit code {process.exitcode}, not killed by SIGKILL"
            )
        finally:
            if process.is_alive():
                process.kill()
                process.join(5)
            outbox.close()
        left = self.only_job(harness)
        assert left.attempts == 0, (
            f"T5: the job has attempts {left.attempts} after its worker was killed mid-handler; expected 0: "
            "something the killed transaction wrote (retry_at, archive_job) was committed"
        )
        assert harness.archived_jobs() == [], (
            "T5: the job of a worker killed mid-handler is archived: archive_job committed outside the claim"
        )

        taken = threading.Event()
        seen: list[int] = []

        def handler(job: Job) -> None:
            seen.append(job.attempts)
            taken.set()

        worker = create_queue_worker(
            None,
            handler,
            backend=harness.backend(),
            queue=queue,
            job_table=harness.job_table,
            archived_job_table=harness.archived_job_table,
            job_id_strategy=harness.job_id_strategy(),
            handler_fn_mode="advanced",
            polling_interval_ms=10,
            clock=ManualClock(EPOCH + timedelta(seconds=2)),
            log=no_log,
            **harness.worker_options,
        )
        with worker:
            assert taken.wait(15), (
                "T5: get_next_job gave no other worker the job of the killed worker within 15 s: its row "
                "lock outlived the killed process's connection"
            )
        assert seen == [1], f"T5: the next worker saw attempts {seen}, expected [1]"
        row = self.only_archived(harness)
        assert (row.status, row.attempts, row.payload) == (STATUS_SUCCESS, 1, stored.payload), (
            f"T5: archive_job wrote status {row.status!r}, attempts {row.attempts} and a payload "
            f"{'equal to' if row.payload == stored.payload else 'unlike'} the stored one; expected "
            f"{STATUS_SUCCESS!r}, 1 and the stored payload"
        )
        assert harness.jobs() == [], "T5: delete_job left the finished job in the job table"

    def test_the_backend_matches_the_memory_model(self, harness: Harness) -> None:
        """M1 (model): random enqueue/claim/retry/archive/delete/commit/rollback over up to three open
        transactions leave the backend and the in-memory reference with the same claims and tables."""
        override = model_settings_override.get()
        chosen = settings(
            parent=override if override is not None else profiles.active(),
            max_examples=_MODEL_EXAMPLES if override is None else override.max_examples,
            stateful_step_count=MODEL_STEPS,
            deadline=None,
            suppress_health_check=SUPPRESSED if override is None else override.suppress_health_check,
        )
        run_state_machine_as_test(model_machine(harness, self.step_timeout), settings=chosen)
