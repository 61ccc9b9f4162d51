"""The database goes down and comes back while several workers drain a queue: nothing lost, nothing twice."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from fix_throwaway import ThrowawayServer
from support import wait_until

from conformance.harness import SqlHarness
from proletarian_ref import create_queue_worker, create_serializer, enqueue
from proletarian_ref import log as ev

# PROLETARIAN_RESTART_JOBS=100000 runs the same test bigger.
JOBS = int(os.environ.get("PROLETARIAN_RESTART_JOBS", "10000"))
WORKERS = 2
THREADS = 3
# How long the server stays down: long enough that every thread fails to reconnect a few times.
DOWNTIME_S = 1.5


@dataclass(frozen=True, slots=True)
class Run:
    """One handler call: which job, and when it started and ended (time.monotonic)."""

    n: int
    started: float
    ended: float


class Recorder:
    """The handler: records every run, so duplicates can be told apart from lost jobs."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self._lock = threading.Lock()

    def __call__(self, job_type: str, payload: Any) -> None:
        started = time.monotonic()
        # A little work, so that a crash finds jobs in flight rather than only between jobs.
        time.sleep(0.0005)
        with self._lock:
            self.runs.append(Run(int(payload), started, time.monotonic()))


class ProblemLog:
    """A log that keeps only what went wrong: routine events of 10,000 jobs would drown it."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        if event in (ev.SQL_TRANSIENT_EXCEPTION, ev.JOB_WORKER_ERROR, ev.HANDLE_JOB_EXCEPTION):
            with self._lock:
                self.problems.append((event, dict(data)))

    def named(self, event: str) -> list[dict[str, Any]]:
        with self._lock:
            return [data for name, data in self.problems if name == event]


def enqueue_all(harness: SqlHarness, count: int) -> None:
    conn = harness.connect()
    try:
        for n in range(count):
            enqueue(conn, "fault/restart", n, job_table=harness.job_table)
        conn.commit()
    finally:
        conn.close()


def archived_count(harness: SqlHarness) -> int:
    try:
        return int(harness.select(f"SELECT count(*) FROM {harness.archived_job_table}")[0][0])
    except Exception:
        return -1  # the server is down


# A crash is the harder case and gets the full count; a clean shutdown mainly checks that the errors it
# sends the clients are transient too.
@pytest.mark.parametrize(("mode", "jobs"), [("immediate", JOBS), ("fast", max(JOBS // 5, 100))])
def test_every_job_is_archived_exactly_once_across_a_database_restart(
    throwaway: ThrowawayServer, mode: str, jobs: int
) -> None:
    """The server shuts down ("fast": clean, "immediate": a crash) under load and starts again.

    The same workers carry on by themselves: every error they saw was transient, none stopped. Every
    job is archived exactly once. A handler ran twice only for a job in flight at the restart, whose
    transaction the restart rolled back: at most one per thread.
    """
    server = throwaway
    harness = server.harness("proletarian.job_fault_restart", "proletarian.archived_job_fault_restart")
    enqueue_all(harness, jobs)
    recorder = Recorder()
    log = ProblemLog()
    workers = [
        create_queue_worker(
            harness.data_source,
            recorder,
            worker_threads=THREADS,
            polling_interval_ms=10,
            log=log,
            queue_worker_id=f"fault-restart-{w}",
            **harness.table_options,
        )
        for w in range(WORKERS)
    ]
    for worker in workers:
        worker.start()
    try:
        assert wait_until(lambda: archived_count(harness) >= jobs // 5, timeout=120)
        down = time.monotonic()
        server.stop(mode)
        time.sleep(DOWNTIME_S)
        server.start()
        up = time.monotonic()
        # Bounded: about 2 ms a job at worst on a loaded 2-core machine, plus the restart.
        assert wait_until(lambda: archived_count(harness) == jobs, timeout=60 + jobs * 0.002), (
            f"{archived_count(harness)} of {jobs} archived; problems: {log.problems[-5:]}"
        )
        assert all(worker.running for worker in workers), "a worker stopped instead of recovering"
    finally:
        for worker in workers:
            worker.stop()

    rows = harness.select(f"SELECT payload, status FROM {harness.archived_job_table}")
    serializer = create_serializer()
    archived = Counter(int(serializer.decode(payload)) for payload, _ in rows)
    assert archived == Counter(range(jobs)), "every job archived exactly once"
    assert {status for _, status in rows} == {":success"}
    assert harness.jobs() == []

    runs = Counter(run.n for run in recorder.runs)
    assert set(runs) == set(range(jobs))
    # A thread loses at most one run, the one in flight when its connection is cut, and cannot connect
    # again until the server is back. One job can be lost twice, though: the server ends its backends one
    # by one, so a thread whose backend is still alive can claim the job another thread just lost.
    extra_runs = sum(count - 1 for count in runs.values())
    assert extra_runs <= WORKERS * THREADS, f"{extra_runs} runs were lost to the restart"
    for n, count in runs.items():
        if count == 1:
            continue
        lost = sorted((run for run in recorder.runs if run.n == n), key=lambda run: run.started)[:-1]
        for run in lost:
            # In flight at the restart: it ended no earlier than just before the server went down (its
            # commit was cut off) and began before the server was back.
            assert run.ended >= down - 3.0 and run.started <= up, (run, down, up)

    assert log.named(ev.SQL_TRANSIENT_EXCEPTION), "the restart should have been noticed"
    assert not log.named(ev.JOB_WORKER_ERROR), log.named(ev.JOB_WORKER_ERROR)[:3]
    assert not log.named(ev.HANDLE_JOB_EXCEPTION)
