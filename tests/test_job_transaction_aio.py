"""aio.current_job() on psycopg's AsyncConnection: asyncio handlers write in the job's transaction."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import psycopg
import pytest
from support import enqueue_committed

import proletarian_ref
from conformance.harness import SqlHarness
from proletarian_ref import JobTransactionError, aio
from proletarian_ref.backend import STATUS_FAILURE, STATUS_SUCCESS
from proletarian_ref.backends.postgres_async import AsyncPostgresBackend

pytestmark = pytest.mark.postgresql

# The backend each test runs on: the one process_next_job makes of the factory, and the asyncio backend's
# chained pipeline (AsyncPostgresBackend(pipeline=True, compact=True, chain=True)), whose handler writes on
# a connection in psycopg's pipeline mode.
PLANS = ["default", "pipeline-chain"]


@pytest.fixture(params=PLANS)
def plan(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def process(db: SqlHarness, dsn: str, handler: Any, plan: str = "default", **options: Any) -> bool | None:
    source = functools.partial(psycopg.AsyncConnection.connect, dsn)

    async def run() -> bool | None:
        if plan == "default":
            return await aio.process_next_job(source, handler, **{**db.table_options, **options})
        backend = AsyncPostgresBackend(source, pipeline=True, compact=True, chain=True)
        try:
            return await aio.process_next_job(
                None, handler, backend=backend, **{**db.table_options, **options}
            )
        finally:
            await backend.close()

    return asyncio.run(run())


async def write(db: SqlHarness, conn: Any, marker: int) -> None:
    async with conn.cursor() as cursor:
        await cursor.execute(f"INSERT INTO {db.caller_table} (marker) VALUES (%s)", (marker,))


def test_an_async_handlers_write_and_follow_up_commit_with_the_archive_row(
    pg_db: SqlHarness, pg_dsn: str, plan: str
) -> None:
    enqueue_committed(pg_db, "app/first", None)

    async def handler(job_type: str, payload: Any) -> None:
        tx = aio.current_job()
        await write(pg_db, await tx.connection(), 3)
        await tx.enqueue("app/second", {"from": job_type})

    assert process(pg_db, pg_dsn, handler, plan) is True
    assert pg_db.caller_markers() == [3]
    assert [row.status for row in pg_db.archived_jobs()] == [STATUS_SUCCESS]
    assert [job.job_type for job in pg_db.jobs()] == [":app/second"]


def test_an_async_handlers_failure_rolls_its_writes_back(pg_db: SqlHarness, pg_dsn: str, plan: str) -> None:
    enqueue_committed(pg_db, "app/first", None)
    seen: list[BaseException] = []

    async def handler(job_type: str, payload: Any) -> None:
        tx = aio.current_job()
        await write(pg_db, await tx.connection(), 3)
        await tx.enqueue("app/second", None)
        await (await tx.connection()).commit()

    assert process(pg_db, pg_dsn, handler, plan, failed_job_fn=lambda job, exc: seen.append(exc)) is True
    assert pg_db.caller_markers() == []
    assert pg_db.jobs() == []
    assert [row.status for row in pg_db.archived_jobs()] == [STATUS_FAILURE]
    assert isinstance(seen[0], JobTransactionError)


def test_an_async_commit_behind_the_guard_is_found(pg_db: SqlHarness, pg_dsn: str, plan: str) -> None:
    enqueue_committed(pg_db, "app/first", None)

    async def handler(job_type: str, payload: Any) -> None:
        conn = await aio.current_job().connection()
        await write(pg_db, conn, 1)
        await conn.execute("COMMIT")
        await write(pg_db, conn, 2)

    with pytest.raises(JobTransactionError, match="ended the job's transaction"):
        process(pg_db, pg_dsn, handler, plan)
    assert pg_db.caller_markers() == [1]
    assert pg_db.archived_jobs() == []
    assert [job.attempts for job in pg_db.jobs()] == [0]


def test_the_threaded_current_job_in_an_async_handler_names_the_right_one(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    enqueue_committed(pg_db, "app/first", None)
    seen: list[BaseException] = []

    async def handler(job_type: str, payload: Any) -> None:
        proletarian_ref.current_job()

    process(pg_db, pg_dsn, handler, failed_job_fn=lambda job, exc: seen.append(exc))
    assert "proletarian_ref.aio.current_job()" in str(seen[0])


def test_concurrent_async_handlers_each_see_their_own_job(pg_db: SqlHarness, pg_dsn: str) -> None:
    """The asyncio worker runs several jobs at once on one loop: each task's current_job() is its own."""
    for n in range(4):
        enqueue_committed(pg_db, "app/job", {"n": n})
    seen: list[tuple[int, int]] = []

    async def handler(job_type: str, payload: Any) -> None:
        tx = aio.current_job()
        await asyncio.sleep(0)  # let the other tasks run in between
        await write(pg_db, await tx.connection(), payload["n"])
        seen.append((payload["n"], tx.job.payload["n"]))

    async def main() -> None:
        source = functools.partial(psycopg.AsyncConnection.connect, pg_dsn)
        worker = aio.create_queue_worker(source, handler, worker_threads=4, **pg_db.table_options)
        await worker.start()
        try:
            for _ in range(1200):  # a bound so a broken worker fails the test instead of hanging it
                if len(pg_db.archived_jobs()) == 4:
                    break
                await asyncio.sleep(0.05)
        finally:
            await worker.stop()

    asyncio.run(main())
    assert sorted(seen) == [(n, n) for n in range(4)]
    assert pg_db.caller_markers() == [0, 1, 2, 3]


def test_an_async_sqlalchemy_session_on_the_job_commits_with_the_archive_row(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from proletarian_ref.integrations.sqlalchemy import async_job_session

    enqueue_committed(pg_db, "app/first", None)
    enqueue_committed(pg_db, "app/fails", None)
    insert = text(f"INSERT INTO {pg_db.caller_table} (marker) VALUES (:m)")
    refused: list[BaseException] = []

    async def handler(job_type: str, payload: Any) -> None:
        async with async_job_session(engine) as session:
            await session.execute(insert, {"m": 1 if job_type == "app/first" else 2})
            if job_type == "app/fails":
                try:
                    await (await session.connection()).commit()
                except JobTransactionError as exc:
                    refused.append(exc)
                raise RuntimeError("rolled back")

    async def main() -> None:
        source = functools.partial(psycopg.AsyncConnection.connect, pg_dsn)
        try:
            while await aio.process_next_job(source, handler, **pg_db.table_options):
                pass
        finally:
            await engine.dispose()

    engine = create_async_engine("postgresql+psycopg" + pg_dsn[pg_dsn.index("://") :])
    asyncio.run(main())
    assert pg_db.caller_markers() == [1]
    assert sorted(row.status for row in pg_db.archived_jobs()) == [STATUS_FAILURE, STATUS_SUCCESS]
    assert len(refused) == 1
