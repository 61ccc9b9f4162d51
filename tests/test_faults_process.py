"""A worker process is killed or told to terminate mid-job: the job is not lost and never archived twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import RecordingLog, enqueue_committed, has_started, wait_until

import proletarian_ref
from conformance.harness import Harness, SqlHarness
from proletarian_ref import create_queue_worker
from proletarian_ref import log as ev

pytestmark = pytest.mark.sql_only

# The worker process. Its handler writes "started" to a file and then, by mode:
#   cooperative  sleeps with proletarian_ref.sleep (honours stop), stubborn  sleeps and ignores it,
#   quick        finishes well within the drain timeout (10 s; the stubborn one gets 0.5 s).
# Log events go to stdout as JSON lines.
WORKER_SCRIPT = """
import json, sys, time
import proletarian_ref
from proletarian_ref import create_queue_worker
from proletarian_ref.backends.dsn import connection_factory

dsn, job_table, archived_job_table, mode, marker = sys.argv[1:6]

def handler(job_type, payload):
    with open(marker, "a") as f:
        f.write("started\\n")
    if mode == "cooperative":
        proletarian_ref.sleep(60)
    elif mode == "stubborn":
        time.sleep(60)
    else:
        time.sleep(0.3)

def log(event, data):
    # One write per line: print() writes the newline apart, and two threads log here at shutdown.
    sys.stdout.write(json.dumps({"event": event, "data": {k: str(v) for k, v in data.items()}}) + "\\n")
    sys.stdout.flush()

worker = create_queue_worker(
    connection_factory(dsn), handler, job_table=job_table, archived_job_table=archived_job_table,
    polling_interval_ms=10, await_termination_timeout_ms=500 if mode == "stubborn" else 10_000,
    install_shutdown_hook=True, log=log,
)
worker.start()
while True:
    time.sleep(0.05)
"""


def start_worker_process(
    db: SqlHarness, request: pytest.FixtureRequest, tmp_path: Path, mode: str
) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "fault_worker.py"
    script.write_text(WORKER_SCRIPT)
    marker = tmp_path / "started"
    dsn = request.getfixturevalue("pg_dsn" if db.dialect == "postgresql" else "mysql_dsn")
    process = subprocess.Popen(
        [sys.executable, str(script), dsn, db.job_table, db.archived_job_table, mode, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # The script runs from tmp_path: point it at the package under test, not an installed copy.
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(Path(proletarian_ref.__file__).resolve().parents[1]),
        },
    )
    return process, marker


def finish(process: subprocess.Popen[str], timeout: float = 20) -> tuple[int, list[str], str]:
    """Wait for the process; its exit code, the log events it printed, and its stderr."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate(timeout=timeout)
        pytest.fail(f"the worker process did not exit within {timeout} s: {err[-2000:]}")
    events = [json.loads(line)["event"] for line in out.splitlines() if line.startswith("{")]
    return process.returncode, events, err


def run_remaining_job_here(db: SqlHarness) -> list[Any]:
    """Another worker, in this process, takes over the queue; returns what its handler ran."""
    ran: list[Any] = []
    worker = create_queue_worker(
        db.data_source,
        lambda job_type, payload: ran.append(payload),
        polling_interval_ms=10,
        log=RecordingLog(),
        **db.table_options,
    )
    with worker:
        assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=20)
    return ran


def test_a_job_whose_worker_process_is_killed_runs_on_another_worker_once(
    db: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """SIGKILL mid-job: the database sees the connection go and rolls the claim back at once. The
    job runs on another worker with attempts unchanged (a crash is not an attempt) and is archived
    once.
    """
    assert isinstance(db, SqlHarness)
    enqueue_committed(db, "fault/killed", "payload")
    process, marker = start_worker_process(db, request, tmp_path, "stubborn")
    try:
        assert wait_until(lambda: has_started(marker), timeout=30), "the worker process never started the job"
        process.send_signal(signal.SIGKILL)
        code, _, _ = finish(process)
        assert code == -signal.SIGKILL
        assert [job.attempts for job in db.jobs()] == [0]
        assert run_remaining_job_here(db) == ["payload"]
        (row,) = db.archived_jobs()
        assert (row.status, row.attempts) == (":success", 1)
        assert marker.read_text() == "started\n", "the killed worker ran it once and never again"
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize("mode", ["quick", "cooperative", "stubborn"])
def test_sigterm_with_the_shutdown_hook_drains_interrupts_or_releases_the_job(
    db: Harness, request: pytest.FixtureRequest, tmp_path: Path, mode: str
) -> None:
    """install_shutdown_hook=True: SIGTERM runs stop() before the process exits (code 128 + 15).

    quick: the handler finishes within await_termination_timeout_ms and its job is archived.
    cooperative: the handler honours the stop (proletarian_ref.sleep raises JobInterrupted) and the
    job stays queued with attempts unchanged. stubborn: the handler outlasts the timeout; its job is
    released (job-released), stop() raises (queue-worker-shutdown-error), and the job, still with
    attempts 0, runs on another worker.
    """
    assert isinstance(db, SqlHarness)
    enqueue_committed(db, "fault/terminated", "payload")
    process, marker = start_worker_process(db, request, tmp_path, mode)
    try:
        assert wait_until(lambda: has_started(marker), timeout=30)
        process.send_signal(signal.SIGTERM)
        code, events, err = finish(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert ev.SHUTTING_DOWN in events
    if mode == "quick":
        assert ev.COMPLETED_SHUTDOWN in events
        assert [(row.status, row.attempts) for row in db.archived_jobs()] == [(":success", 1)]
        assert db.jobs() == []
        return
    if mode == "cooperative":
        assert ev.JOB_INTERRUPTED in events and ev.COMPLETED_SHUTDOWN in events
    else:
        assert ev.JOB_RELEASED in events and ev.QUEUE_WORKER_SHUTDOWN_ERROR in events
        assert ev.COMPLETED_SHUTDOWN not in events
    assert [job.attempts for job in db.jobs()] == [0]
    assert run_remaining_job_here(db) == ["payload"]
    assert [(row.status, row.attempts) for row in db.archived_jobs()] == [(":success", 1)]
