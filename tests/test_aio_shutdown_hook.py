"""aio.create_queue_worker(install_shutdown_hook=True): SIGTERM/SIGINT drain, release, then end it."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import RecordingLog, enqueue_committed, has_started, wait_until

import proletarian_ref
from conformance.harness import SqlHarness
from proletarian_ref import aio
from proletarian_ref import log as ev

pytestmark = pytest.mark.postgresql

# The worker process, under asyncio.run. Its coroutine handler writes "started" to a file and then, by mode:
#   quick        finishes well within the drain timeout (10 s),
#   cooperative  waits for worker.stopping() and gives its job back (JobInterrupted),
#   stubborn     awaits past the drain timeout (0.5 s), so stop() cancels it there.
# main's `finally` writes a second file: the process unwound rather than died. Log events go to stdout.
WORKER_SCRIPT = """
import asyncio, functools, json, sys
import psycopg
from proletarian_ref import aio
from proletarian_ref.errors import JobInterrupted

dsn, job_table, archived_job_table, mode, marker, unwound = sys.argv[1:7]
worker = None

async def handler(job_type, payload):
    with open(marker, "a") as f:
        f.write("started\\n")
    if mode == "cooperative":
        while not worker.stopping():
            await asyncio.sleep(0.02)
        raise JobInterrupted("the worker is stopping")
    await asyncio.sleep(60 if mode == "stubborn" else 0.3)

def log(event, data):
    sys.stdout.write(json.dumps({"event": event}) + "\\n")
    sys.stdout.flush()

async def main():
    global worker
    worker = aio.create_queue_worker(
        functools.partial(psycopg.AsyncConnection.connect, dsn), handler, job_table=job_table,
        archived_job_table=archived_job_table, polling_interval_ms=10, log=log,
        await_termination_timeout_ms=500 if mode == "stubborn" else 10_000, install_shutdown_hook=True,
    )
    try:
        async with worker:
            await asyncio.Event().wait()
    finally:
        with open(unwound, "w") as f:
            f.write("unwound")

asyncio.run(main())
"""


def _start(db: SqlHarness, dsn: str, tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], Path, Path]:
    script = tmp_path / "aio_hooked_worker.py"
    script.write_text(WORKER_SCRIPT)
    marker, unwound = tmp_path / "started", tmp_path / "unwound"
    process = subprocess.Popen(
        [
            sys.executable,
            str(script),
            dsn,
            db.job_table,
            db.archived_job_table,
            mode,
            str(marker),
            str(unwound),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(proletarian_ref.__file__).resolve().parents[1])},
    )
    return process, marker, unwound


def _finish(process: subprocess.Popen[str], timeout: float = 30) -> tuple[int, list[str], str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate(timeout=timeout)
        pytest.fail(f"the worker process did not exit within {timeout} s: {err[-2000:]}")
    events = [json.loads(line)["event"] for line in out.splitlines() if line.startswith("{")]
    return process.returncode, events, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("mode", ["quick", "cooperative", "stubborn"])
def test_a_signal_with_the_async_hook_drains_gives_back_or_releases_then_exits_128_plus_signal(
    pg_db: SqlHarness, pg_dsn: str, tmp_path: Path, mode: str, signum: signal.Signals
) -> None:
    """The threaded hook's promises on the loop: stop() runs before the process ends with 128 + signal,
    by SystemExit, so main's `finally` runs (SIGINT too, over asyncio.run's own handler)."""
    db = pg_db
    enqueue_committed(db, "fault/terminated", "payload")
    process, marker, unwound = _start(db, pg_dsn, tmp_path, mode)
    try:
        assert wait_until(lambda: has_started(marker), timeout=30), "the worker process never started the job"
        process.send_signal(signum)
        code, events, err = _finish(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert code == 128 + signum, err[-2000:]
    assert unwound.read_text() == "unwound", "main's finally block ran"
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
    assert db.archived_jobs() == []
    assert marker.read_text() == "started\n", "the job ran once in that process"


def _worker(dsn: str, db: SqlHarness, **options: Any) -> aio.AsyncQueueWorker:
    async def handler(job_type: str, payload: Any) -> None:
        await asyncio.sleep(0)

    connect = functools.partial(psycopg.AsyncConnection.connect, dsn)
    return aio.create_queue_worker(connect, handler, log=RecordingLog(), **db.table_options, **options)


def test_the_async_hook_gives_the_signals_their_previous_handlers_back_when_the_worker_stops(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        seen["runner_sigint"] = signal.getsignal(signal.SIGINT)  # asyncio.run's own: it is hooked over
        async with _worker(pg_dsn, pg_db, install_shutdown_hook=True):
            seen["while_running"] = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        seen["after"] = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    asyncio.run(scenario())
    assert seen["while_running"][signal.SIGTERM] is not signal.SIG_DFL
    assert seen["while_running"][signal.SIGINT] is not seen["runner_sigint"]
    assert seen["after"] == {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: seen["runner_sigint"]}
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_the_async_hook_leaves_an_applications_own_signal_handler_alone(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    received: list[int] = []

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def own(signum: int) -> None:
            received.append(signum)
            done.set()

        loop.add_signal_handler(signal.SIGTERM, own, signal.SIGTERM)
        try:
            worker = _worker(pg_dsn, pg_db, install_shutdown_hook=True)
            async with worker:
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.wait_for(done.wait(), 30)
                return worker.running
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    assert asyncio.run(scenario()) is True, "the application's handler ran, and the worker was not stopped"
    assert received == [signal.SIGTERM]
