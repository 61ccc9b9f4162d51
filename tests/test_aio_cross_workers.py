"""Jobs enqueued by each API are run by the other API's queue worker (not only by process_next_job)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import psycopg
import pytest
from support import RecordingLog, wait_until

from conformance.harness import SqlHarness
from proletarian_ref import aio, create_queue_worker, enqueue

pytestmark = pytest.mark.postgresql


def test_the_threaded_worker_runs_async_enqueued_jobs_and_the_async_worker_sync_enqueued_ones(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    db = pg_db
    seen: list[tuple[str, str, Any]] = []

    async def enqueue_async() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
            await aio.enqueue(aconn, "from-async", 1, queue="for-threaded", **db.table_options)

    asyncio.run(enqueue_async())
    conn = db.connect()
    enqueue(conn, "from-sync", 2, queue="for-asyncio", **db.table_options)
    conn.commit()
    conn.close()

    def threaded(job_type: str, payload: Any) -> None:
        seen.append(("threaded", job_type, payload))

    options = {"polling_interval_ms": 20, "log": RecordingLog(), **db.table_options}
    with create_queue_worker(db.data_source, threaded, queue="for-threaded", **options):
        assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=30)

    async def run_async_worker() -> None:
        ran = asyncio.Event()

        async def coroutine(job_type: str, payload: Any) -> None:
            seen.append(("asyncio", job_type, payload))
            ran.set()

        connect = functools.partial(psycopg.AsyncConnection.connect, pg_dsn)
        async with aio.create_queue_worker(connect, coroutine, queue="for-asyncio", **options):
            await asyncio.wait_for(ran.wait(), 30)

    asyncio.run(run_async_worker())
    assert seen == [("threaded", "from-async", 1), ("asyncio", "from-sync", 2)]
    archived = sorted((job.job_type, job.status, job.attempts) for job in db.archived_jobs())
    assert archived == [(":from-async", ":success", 1), (":from-sync", ":success", 1)]
    assert db.jobs() == []
