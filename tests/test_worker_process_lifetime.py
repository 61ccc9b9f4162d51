"""How long a worker keeps its process alive, as a JVM with Proletarian does (issue 11.6).

Worker threads are not daemons, so returning from main leaves the worker running; the shutdown hook is a
SIGTERM/SIGINT handler (the JVM runs its hooks on those signals, not when main returns), and `with`
stops the worker when the block ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import enqueue_committed, wait_until

import proletarian_ref
from conformance.harness import Harness, SqlHarness
from proletarian_ref import log as ev

# The script runs from a temporary directory: point it at the package under test, not whatever copy the
# interpreter would find installed.
PACKAGE_ROOT = str(Path(proletarian_ref.__file__).resolve().parents[1])

pytestmark = pytest.mark.sql_only

# Modes: plain (main returns at once, no hook), hooked (main returns, hook installed), hooked-main (main
# keeps running, hook installed), with (a with block until the jobs are done), self-stop (the handler
# raises SystemExit: a worker error that stops the worker, and then main has nothing left to wait for).
SCRIPT = """
import json, sys, threading, time
import proletarian_ref
from proletarian_ref import create_queue_worker
from proletarian_ref.backends.dsn import connection_factory

dsn, job_table, archived_job_table, mode, marker, jobs = sys.argv[1:7]
done = threading.Semaphore(0)
out = threading.Lock()

def handler(job_type, payload):
    if payload == "interruptible":
        with open(marker, "a") as f:
            f.write("started\\n")
        while not proletarian_ref.interrupted():
            time.sleep(0.01)
        with open(marker, "a") as f:
            f.write("saw interrupted\\n")
        proletarian_ref.check_interrupted()
    if mode == "self-stop":
        raise SystemExit(7)
    done.release()

def log(event, data):
    with out:
        print(json.dumps({"event": event}), flush=True)

worker = create_queue_worker(
    connection_factory(dsn), handler, job_table=job_table, archived_job_table=archived_job_table,
    polling_interval_ms=10, worker_threads=2, install_shutdown_hook=mode.startswith("hooked"), log=log,
)
if mode == "with":
    with worker:
        for _ in range(int(jobs)):
            done.acquire()
else:
    worker.start()
    log("main-returns", {})
    while mode == "hooked-main":
        time.sleep(0.05)
"""


def start(
    db: SqlHarness, request: pytest.FixtureRequest, tmp_path: Path, mode: str, jobs: int
) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "lifetime.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "marker"
    dsn = request.getfixturevalue("pg_dsn" if db.dialect == "postgresql" else "mysql_dsn")
    argv = [
        sys.executable,
        str(script),
        dsn,
        db.job_table,
        db.archived_job_table,
        mode,
        str(marker),
        str(jobs),
    ]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": PACKAGE_ROOT},
    )
    return process, marker


def finish(process: subprocess.Popen[str], timeout: float = 20) -> tuple[int, list[str], str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the worker process did not exit within {timeout} s: {err[-2000:]}")
    events = [json.loads(line)["event"] for line in out.splitlines() if line.startswith("{")]
    return process.returncode, events, err


def test_returning_from_main_leaves_the_worker_running_until_the_process_is_terminated(
    db: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """As on the JVM: non-daemon threads outlive main; without the hook SIGTERM ends the process."""
    assert isinstance(db, SqlHarness)
    for n in range(5):
        enqueue_committed(db, "life/plain", n)
    process, _ = start(db, request, tmp_path, "plain", 5)
    try:
        assert wait_until(lambda: len(db.archived_jobs()) == 5, timeout=30)
        assert process.poll() is None, "the process exited with the worker still running"
        enqueue_committed(db, "life/plain", "late")  # still polling after main returned
        assert wait_until(lambda: len(db.archived_jobs()) == 6, timeout=30)
        process.send_signal(signal.SIGTERM)
        code, events, _ = finish(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert code == -signal.SIGTERM
    assert "main-returns" in events and ev.SHUTTING_DOWN not in events
    assert db.jobs() == []


@pytest.mark.parametrize(
    ("mode", "signum"),
    [("hooked", signal.SIGTERM), ("hooked", signal.SIGINT), ("hooked-main", signal.SIGTERM)],
    ids=["sigterm-after-main-returned", "sigint-after-main-returned", "sigterm-while-main-runs"],
)
def test_a_signal_with_the_hook_stops_the_worker_gracefully_and_ends_the_process(
    db: Harness, request: pytest.FixtureRequest, tmp_path: Path, mode: str, signum: int
) -> None:
    """The handler sees interrupted() and gives its job back (attempts unchanged); the worker completes
    its shutdown and the process exits with 128 + the signal, whether main returned or not.
    """
    assert isinstance(db, SqlHarness)
    enqueue_committed(db, "life/hooked", "interruptible")
    process, marker = start(db, request, tmp_path, mode, 1)
    try:
        assert wait_until(marker.exists, timeout=30)
        process.send_signal(signum)
        code, events, err = finish(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert code == 128 + signum, err[-2000:]
    assert marker.read_text() == "started\nsaw interrupted\n"
    assert ev.JOB_INTERRUPTED in events and ev.COMPLETED_SHUTDOWN in events
    assert [job.attempts for job in db.jobs()] == [0]
    assert db.archived_jobs() == []


def test_a_with_block_stops_the_worker_and_the_process_exits(
    db: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    assert isinstance(db, SqlHarness)
    for n in range(3):
        enqueue_committed(db, "life/with", n)
    process, _ = start(db, request, tmp_path, "with", 3)
    code, events, err = finish(process, timeout=30)
    assert code == 0, err[-2000:]
    assert events[-1] == ev.COMPLETED_SHUTDOWN
    assert len(db.archived_jobs()) == 3


def test_a_worker_that_stops_itself_lets_the_process_exit(
    db: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A worker error stops the worker from a helper thread; nothing is left to keep the process."""
    assert isinstance(db, SqlHarness)
    enqueue_committed(db, "life/self-stop", 0)
    process, _ = start(db, request, tmp_path, "self-stop", 1)
    code, events, err = finish(process, timeout=30)
    assert code == 0, err[-2000:]
    assert ev.JOB_WORKER_ERROR in events and ev.COMPLETED_SHUTDOWN in events
    assert [job.attempts for job in db.jobs()] == [0]


def test_worker_threads_inherit_daemon_ness_from_the_thread_that_starts_them() -> None:
    """As JVM threads do: started by a plain thread (like main) they are no daemons; by a daemon they are."""
    from conformance import builtin
    from proletarian_ref import create_queue_worker

    memory = builtin.memory()
    seen: dict[str, bool] = {}
    for label, daemon in (("plain", False), ("daemon", True)):
        worker = create_queue_worker(memory.backend(), lambda job_type, payload: None, worker_threads=2)
        starter = threading.Thread(target=worker.start, daemon=daemon)
        starter.start()
        starter.join()
        seen[label] = all(thread.daemon for thread in worker._threads)
        assert worker.stop() is True
    assert seen == {"plain": False, "daemon": True}
