"""Draining a workload with competing queue workers, as threads of this process or as separate processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue as queue_module
import sys
import threading
import time
import traceback
from datetime import datetime
from typing import Any, Final

from conformance.clocks import VirtualClock, frozen
from conformance.harness import Harness, HarnessFactory
from conformance.workload import (
    Call,
    Outcome,
    Recorder,
    Script,
    Workload,
    enqueue_workload,
    start_worker,
)
from proletarian_ref.job import Job
from proletarian_ref.worker import QueueWorker, create_queue_worker

# Where process_context tells conformance._preload, in the fork server, what to put in place and import.
PRELOAD_ENV: Final = "PROLETARIAN_CONFORMANCE_PRELOAD"
# Beyond the time the plan itself needs (future jobs, retry delays), this much real time for the work: a
# correct backend needs a fraction of it, a broken one that loses or blocks jobs fails within it.
DRAIN_SLACK_S: Final = 20.0
# After the last planned handler call its job's outcome (archive, retry, failure archive) is still being
# written. Stopping the workers then would give a failing last job back untouched, as stop() must, and another
# worker not yet stopped could run it again: the harness's doing, not the backend's. A correct backend empties
# the job table within moments; one that leaves rows behind is stopped after this many seconds and reported.
SETTLE_S: Final = 5.0
# A worker process gets this long to start (import, connect) and report.
PROCESS_START_S: Final = 30.0
# How long a crash-test handler blocks if nobody kills it: only ever reached if the test itself is broken.
CRASH_HANDLER_LIMIT_S: Final = 60.0


def drain_limit(workload: Workload, clock: VirtualClock) -> float:
    """Real seconds the drain may take before it counts as failed."""
    return clock.real_seconds(workload.longest_wait()) + DRAIN_SLACK_S


def settle(harness: Harness) -> None:
    """Wait until the job table is empty (every planned job written as archived), for at most SETTLE_S."""
    until = time.monotonic() + SETTLE_S
    while harness.jobs() and time.monotonic() < until:
        time.sleep(0.01)


def scripts_of(enqueued: list[Any]) -> dict[str, Script]:
    return {e.key: e.plan.script for e in enqueued}


def drain_in_threads(harness: Harness, workload: Workload, clock: VirtualClock) -> Outcome:
    """Enqueue the workload, run every slot as a queue worker of this process, and collect the outcome."""
    enqueued = enqueue_workload(harness, workload, clock)
    stored = harness.jobs()
    scripts = scripts_of(enqueued)
    recorder = Recorder(sum(s.runs for s in scripts.values()))
    workers: list[QueueWorker] = []
    try:
        for queue, counts in workload.workers.items():
            for slot, threads in enumerate(counts):
                if threads:
                    label = f"w{slot}[{queue}]"
                    workers.append(
                        start_worker(
                            harness, queue, threads, scripts, clock, recorder.call, recorder.error, label
                        )
                    )
        finished = recorder.wait(drain_limit(workload, clock))
        if finished:
            settle(harness)
    finally:
        for worker in workers:
            try:
                worker.stop()
            except Exception as exc:
                recorder.error(f"{worker.queue_worker_id}: stop failed: {exc!r}")
    return Outcome(
        enqueued=enqueued,
        stored=stored,
        calls=list(recorder.calls),
        errors=list(recorder.errors),
        finished=finished,
        jobs=harness.jobs(),
        archived=harness.archived_jobs(),
    )


def process_context(harness: Harness) -> Any:
    """forkserver where there is one (a child costs ~50 ms once the server runs), else spawn.

    Never fork: the test process runs threads, and a forked child would inherit their locks mid-use.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    modules = ["conformance.drain"]
    if harness.factory is not None:
        modules.append(harness.factory.spec.partition(":")[0])
    backend = harness.make_backend()
    modules.append(type(backend).__module__)
    backend.close()
    # Only the first start of this process's fork server reads these; later harnesses pay their own
    # imports in each worker process, which is slower but no less correct.
    os.environ[PRELOAD_ENV] = json.dumps({"sys_path": sys.path, "modules": modules})
    context.set_forkserver_preload(["conformance._preload"])
    return context


def drain_in_processes(harness: Harness, workload: Workload, clock: VirtualClock) -> Outcome:
    """Enqueue the workload and drain it with one worker process per slot, each building its own harness."""
    if harness.factory is None:
        raise ValueError("worker processes need a harness made by load_harness")
    enqueued = enqueue_workload(harness, workload, clock)
    stored = harness.jobs()
    scripts = scripts_of(enqueued)
    expected = sum(s.runs for s in scripts.values())
    context = process_context(harness)
    outbox: Any = context.Queue()
    stop: Any = context.Event()
    limit = drain_limit(workload, clock)
    processes = []
    for slot in range(workload.slots):
        threads = {
            q: counts[slot] for q, counts in workload.workers.items() if slot < len(counts) and counts[slot]
        }
        process = context.Process(
            target=drain_child,
            args=(
                harness.factory,
                f"p{slot}",
                threads,
                scripts,
                clock,
                outbox,
                stop,
                limit + PROCESS_START_S,
            ),
            name=f"conformance-drain-p{slot}",
            daemon=True,
        )
        processes.append(process)
    calls: list[Call] = []
    errors: list[str] = []
    done: set[str] = set()
    finished = False
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + limit + PROCESS_START_S
        while len(calls) < expected and len(done) < len(processes):
            message = _next_message(outbox, deadline, processes)
            if message is None:
                break
            _take(message, calls, errors, done)
        finished = len(calls) >= expected
        if finished:
            settle(harness)
    finally:
        stop.set()
        deadline = time.monotonic() + PROCESS_START_S
        while len(done) < len(processes):
            message = _next_message(outbox, deadline, processes)
            if message is None:
                missing = sorted({f"p{i}" for i in range(len(processes))} - done)
                errors.append(f"worker processes {missing} hung or died without reporting")
                break
            _take(message, calls, errors, done)
        for process in processes:
            if process.pid is None:
                continue  # Never started: start() itself failed, and that error is on its way up.
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(5)
        outbox.close()
    return Outcome(
        enqueued=enqueued,
        stored=stored,
        calls=calls,
        errors=errors,
        finished=finished,
        jobs=harness.jobs(),
        archived=harness.archived_jobs(),
    )


def _next_message(outbox: Any, deadline: float, processes: list[Any]) -> tuple[Any, ...] | None:
    """The next message, or None at the deadline or once every process is gone and nothing is left."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            message: tuple[Any, ...] = outbox.get(timeout=min(remaining, 0.5))
        except queue_module.Empty:
            # A process killed outright (or one that never got going) sends nothing more: stop
            # waiting for it rather than sit out the deadline.
            if not any(p.is_alive() for p in processes if p.pid is not None):
                return None
            continue
        return message


def _take(message: tuple[Any, ...], calls: list[Call], errors: list[str], done: set[str]) -> None:
    kind = message[0]
    if kind == "call":
        calls.append(message[1])
    elif kind == "error":
        errors.append(f"{message[1]}: {message[2]}")
    elif kind == "done":
        done.add(message[1])


def drain_child(
    factory: HarnessFactory,
    label: str,
    threads: dict[str, int],
    scripts: dict[str, Script],
    clock: VirtualClock,
    outbox: Any,
    stop: Any,
    limit: float,
) -> None:
    """A worker process: its own harness and queue workers, reporting every handler call to the parent."""
    try:
        harness = factory.load()
        workers: list[QueueWorker] = []
        try:
            for queue, count in threads.items():
                workers.append(
                    start_worker(
                        harness,
                        queue,
                        count,
                        scripts,
                        clock,
                        lambda call: outbox.put(("call", call)),
                        lambda error: outbox.put(("error", label, error)),
                        f"{label}[{queue}]",
                    )
                )
            stop.wait(limit)
        finally:
            for worker in workers:
                worker.stop()
            harness.close()
    except BaseException:
        outbox.put(("error", label, traceback.format_exc()))
    finally:
        outbox.put(("done", label))


def crash_child(factory: HarnessFactory, queue: str, now: datetime, outbox: Any) -> None:
    """A worker process whose handler reports the job it took and then blocks until the test kills it."""
    try:
        harness = factory.load()
        started = threading.Event()

        def handler(job: Job) -> None:
            outbox.put(("started", str(job.job_id), job.attempts))
            started.set()
            # Hold the job's row lock and transaction open: the test kills this process right here.
            threading.Event().wait(CRASH_HANDLER_LIMIT_S)

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
            clock=frozen(now),
            log=lambda event, data: None,
            **harness.worker_options,
        )
        worker.start()
        started.wait(CRASH_HANDLER_LIMIT_S)
        threading.Event().wait(CRASH_HANDLER_LIMIT_S)
    except BaseException:
        outbox.put(("error", traceback.format_exc()))
