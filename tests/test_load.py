"""Load: jobs through two worker processes of four threads while enqueuers keep adding: each archived once.

CI runs 5,000 jobs a database. The full run is one command:

    PROLETARIAN_LOAD_JOBS=100000 pytest tests/test_load.py -p no:cacheprovider -s

(-s shows the throughput line each test prints.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from conformance.harness import Harness, SqlHarness
from proletarian_ref import enqueue

JOBS = int(os.environ.get("PROLETARIAN_LOAD_JOBS", "5000"))
PROCESSES = 2
THREADS = 4
ENQUEUERS = 2
BATCH = 50
# The bound on the whole drain: generous for a loaded 2-core machine (about 300 jobs a second).
TIMEOUT_S = 60 + JOBS / 300

WORKER_SCRIPT = """
import json, sys, threading, time
from pathlib import Path
from proletarian_ref import create_queue_worker
from proletarian_ref import log as ev
from proletarian_ref.backends.dsn import connection_factory

dsn, job_table, archived_job_table, threads, stop_file = sys.argv[1:6]
lock = threading.Lock()
runs = []
problems = []

def handler(job_type, payload):
    with lock:
        runs.append(payload)

def log(event, data):
    if event in (ev.SQL_TRANSIENT_EXCEPTION, ev.JOB_WORKER_ERROR, ev.HANDLE_JOB_EXCEPTION):
        with lock:
            problems.append(f"{event}: {data.get(ev.THROWABLE) or data.get(ev.EXCEPTION)}")

worker = create_queue_worker(
    connection_factory(dsn), handler, job_table=job_table, archived_job_table=archived_job_table,
    worker_threads=int(threads), polling_interval_ms=10, log=log,
)
worker.start()
deadline = time.monotonic() + 3600
while not Path(stop_file).exists() and time.monotonic() < deadline:
    time.sleep(0.05)
worker.stop()
print(json.dumps({"runs": runs, "problems": problems, "running": worker.running}))
"""


def enqueue_batches(db: SqlHarness, numbers: range, failures: list[BaseException]) -> None:
    try:
        conn = db.connect()
        try:
            for start in range(numbers.start, numbers.stop, BATCH):
                for n in range(start, min(start + BATCH, numbers.stop)):
                    enqueue(conn, "fault/load", n, job_table=db.job_table)
                conn.commit()
        finally:
            conn.close()
    except BaseException as exc:
        failures.append(exc)
        raise


def archived_count(db: SqlHarness) -> int:
    return int(db.select(f"SELECT count(*) FROM {db.archived_job_table}")[0][0])


@pytest.mark.sql_only
def test_jobs_from_concurrent_enqueuers_through_two_worker_processes_are_each_archived_once(
    db: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    assert isinstance(db, SqlHarness)
    dsn = request.getfixturevalue("pg_dsn" if db.dialect == "postgresql" else "mysql_dsn")
    script = tmp_path / "fault_load_worker.py"
    script.write_text(WORKER_SCRIPT)
    stop_file = tmp_path / "stop"

    # Half the jobs are waiting when the workers start; enqueuers add the other half while they run.
    upfront = JOBS // 2
    failures: list[BaseException] = []
    enqueue_batches(db, range(upfront), failures)
    began = time.monotonic()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                dsn,
                db.job_table,
                db.archived_job_table,
                str(THREADS),
                str(stop_file),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        share = (JOBS - upfront) // ENQUEUERS
        bounds = [upfront + i * share for i in range(ENQUEUERS)] + [JOBS]
        enqueuers = [
            threading.Thread(target=enqueue_batches, args=(db, range(bounds[i], bounds[i + 1]), failures))
            for i in range(ENQUEUERS)
        ]
        for thread in enqueuers:
            thread.start()
        for thread in enqueuers:
            thread.join(TIMEOUT_S)
        assert not failures, failures
        assert wait_until(lambda: archived_count(db) >= JOBS, timeout=TIMEOUT_S, interval=0.2), (
            f"{archived_count(db)} of {JOBS} archived after {TIMEOUT_S:g} s"
        )
        elapsed = time.monotonic() - began
    finally:
        stop_file.touch()
        outputs: list[dict[str, Any]] = []
        for process in processes:
            try:
                out, err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            assert process.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))

    print(f"\n{db.dialect}: {JOBS} jobs in {elapsed:.1f} s, {JOBS / elapsed:.0f} jobs/s")
    runs = [n for output in outputs for n in output["runs"]]
    assert len(runs) == JOBS and set(runs) == set(range(JOBS)), "each job ran exactly once"
    assert all(len(output["runs"]) > 0 for output in outputs), "both processes took part"
    assert [output["problems"] for output in outputs] == [[]] * PROCESSES
    rows = db.select(f"SELECT count(*), count(DISTINCT job_id) FROM {db.archived_job_table}")
    assert rows == [(JOBS, JOBS)]
    assert db.select(f"SELECT DISTINCT status FROM {db.archived_job_table}") == [(":success",)]
    assert db.jobs() == []
