"""Shared test helpers: a settable clock, a recording logger, waiting with a deadline, draining a queue."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import proletarian_ref as pr
from conformance.harness import Harness
from proletarian_ref import aio, enqueue

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# The vectors and pages the tests read, in the repository (tests/data/README.md says where each came from).
DATA_DIR = Path(__file__).resolve().parent / "data"


def data_path(*parts: str) -> Path:
    """A file or folder of tests/data; a missing one fails the test (a clone must hold every vector)."""
    path = DATA_DIR.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"test data missing: {path} (it belongs in the repository, see tests/data/README.md)")
    return path


class FakeClock:
    """A clock the test moves by hand; whole seconds by default so MySQL stores it exactly."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, **delta: float) -> datetime:
        with self._lock:
            self.now += timedelta(**delta)
            return self.now


class RecordingLog:
    """A `log` function that keeps every (event, data) pair."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        with self._lock:
            self.events.append((event, dict(data)))

    def named(self, event: str) -> list[dict[str, Any]]:
        with self._lock:
            return [data for name, data in self.events if name == event]


def has_started(marker: Path) -> bool:
    """Whether a worker process's handler has written its "started" line to `marker`.

    Not marker.exists(): open(marker, "a") creates the file before its line is written, and a SIGKILL in
    between left an empty marker in a clean-clone CI run.
    """
    return marker.exists() and marker.read_text() == "started\n"


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.02) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; the caller asserts on the result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def enqueue_committed(db: Harness, job_type: str, payload: Any, **options: Any) -> Any:
    """Enqueue one job on a fresh connection of `db` and commit it."""
    conn = db.connect()
    try:
        job_id = enqueue(conn, job_type, payload, job_table=db.job_table, **options)
        conn.commit()
        return job_id
    finally:
        conn.close()


def drain_threaded(
    db: Harness,
    backend: Any,
    handler: Any,
    *,
    threads: int = 1,
    batch_size: int = 1,
    until: Callable[[], bool] = lambda: False,
    timeout: float = 30.0,
) -> None:
    """Run a threaded worker on `backend` over `db`'s tables until its queue is empty or `until()` holds
    (or `timeout` seconds pass), then stop it; the backend stays open, the caller's to close."""
    worker = pr.create_queue_worker(
        None,
        handler,
        backend=backend,
        worker_threads=threads,
        polling_interval_ms=20,
        batch_size=batch_size,
        **db.table_options,
    )
    with worker:
        wait_until(lambda: until() or not db.jobs(), timeout)


def claim_finish_and_chain(
    backend: Any, conn: Any, tables: tuple[Any, Any], queue: str, now: datetime, batch_size: int
) -> None:
    """On a chained backend's transaction: claim a job (batch_size 1) or a batch, archive it as a
    success, then commit it and claim the next (ChainedClaim, ChainedBatchClaim)."""
    job_table, archived = tables
    if batch_size == 1:
        record = backend.get_next_job(conn, job_table, queue, now)
        assert record is not None
        backend.archive_and_delete_job(conn, job_table, archived, record.job_id, ":success", now)
        backend.commit_and_get_next_job(conn, job_table, queue, now)
    else:
        records = backend.get_next_jobs(conn, job_table, queue, now, batch_size)
        ids = [record.job_id for record in records]
        backend.archive_and_delete_jobs(conn, job_table, archived, ids, ":success", now)
        backend.commit_and_get_next_jobs(conn, job_table, queue, now, batch_size)


async def drain_asyncio(
    db: Harness, backend: Any, handler: Any, *, batch_size: int, until: Callable[[], bool], timeout: float
) -> None:
    """Run an asyncio worker, one task, on `backend` over `db`'s tables until `until()` holds (read from a
    thread: the loop goes on running the worker meanwhile) or `timeout` seconds pass, then stop it and
    close the backend."""
    worker = aio.create_queue_worker(
        None,
        handler,
        backend=backend,
        worker_threads=1,
        polling_interval_ms=20,
        batch_size=batch_size,
        **db.table_options,
    )
    try:
        await worker.start()
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(until) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await worker.stop()
    finally:
        await backend.close()


async def aclaim_finish_and_chain(
    backend: Any, conn: Any, tables: tuple[Any, Any], queue: str, now: datetime, batch_size: int
) -> None:
    """claim_finish_and_chain on an asyncio backend's transaction."""
    job_table, archived = tables
    if batch_size == 1:
        record = await backend.get_next_job(conn, job_table, queue, now)
        assert record is not None
        await backend.archive_and_delete_job(conn, job_table, archived, record.job_id, ":success", now)
        await backend.commit_and_get_next_job(conn, job_table, queue, now)
    else:
        records = await backend.get_next_jobs(conn, job_table, queue, now, batch_size)
        ids = [record.job_id for record in records]
        await backend.archive_and_delete_jobs(conn, job_table, archived, ids, ":success", now)
        await backend.commit_and_get_next_jobs(conn, job_table, queue, now, batch_size)


def assert_kept_or_lost(
    db: Harness, job_ids: list[Any], logged: str, refused: str, *, checked: bool, all_lost: bool
) -> None:
    """After a worker ran a chain whose archive writes no row: with the server's check the worker logged the
    refusal (`refused`, the client's own check's words) and every job is queued, attempts unchanged (the
    COMMIT sent with the archive did nothing); without it the COMMIT went through and jobs are gone,
    deleted and never archived (`all_lost`: every one), which is what the check is for."""
    assert db.archived_jobs() == []
    if checked:
        assert refused in logged
        decode = db.job_id_strategy().decode_id
        queued = sorted((str(decode(job.job_id)), job.attempts) for job in db.jobs())
        assert queued == sorted((str(job_id), 0) for job_id in job_ids)
    elif all_lost:
        assert refused not in logged and db.jobs() == []
    else:
        assert refused not in logged and len(db.jobs()) < len(job_ids)
