"""proletarian_ref.aio on aiomysql: its transaction and session left as they were, and its worker's promises
(the rows and the jobs both APIs run: tests/test_aio_each_database.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiomysql
import pytest
from aio_support import SequentialIds, run

from conformance.harness import SqlHarness
from proletarian_ref import aio, enqueue, enqueue_many, process_next_job
from proletarian_ref.backends.mysql_async import (
    AsyncMySQLBackend,
    aiomysql_connect_kwargs,
    aiomysql_connection_factory,
)
from proletarian_ref.errors import ConfigurationError, PayloadTooLargeError, ShutdownTimeoutError

pytestmark = pytest.mark.mysql


def test_async_enqueue_joins_the_callers_transaction_and_leaves_its_session(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    async def scenario() -> tuple[bool, str, bool, int]:
        conn = await aiomysql.connect(**aiomysql_connect_kwargs(mysql_dsn))
        try:
            async with conn.cursor() as cursor:
                await cursor.execute("SET time_zone = '+05:00'")
            await aio.enqueue(conn, "t", 1, **mysql_db.table_options)
            await aio.enqueue_many(conn, [("t", 2), ("t", 3)], **mysql_db.table_options)
            in_transaction = conn.get_transaction_status()
            async with conn.cursor() as cursor:
                await cursor.execute("SELECT @@session.time_zone")
                (zone,) = await cursor.fetchone()
                await cursor.execute(f"SELECT COUNT(*) FROM {mysql_db.job_table}")
                (seen,) = await cursor.fetchone()
            autocommit = conn.get_autocommit()
            await conn.rollback()
            return in_transaction, zone, autocommit, seen
        finally:
            conn.close()

    assert run(scenario()) == (True, "+05:00", False, 3)
    assert mysql_db.jobs() == []


def test_async_enqueue_refuses_a_payload_the_column_cannot_hold_and_writes_nothing(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    async def scenario() -> None:
        conn = await aiomysql.connect(**aiomysql_connect_kwargs(mysql_dsn))
        try:
            with pytest.raises(PayloadTooLargeError):
                await aio.enqueue(conn, "t", "x" * 70_000, **mysql_db.table_options)
            with pytest.raises(PayloadTooLargeError) as caught:
                await aio.enqueue_many(conn, [("t", 1), ("t", "x" * 70_000)], **mysql_db.table_options)
            assert caught.value.index == 1
            await conn.commit()
        finally:
            conn.close()

    run(scenario())
    assert mysql_db.jobs() == []


def test_async_enqueue_many_refuses_database_generated_ids_on_mysql(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    class Generated(SequentialIds):
        def generate_id(self) -> Any:
            return None

    async def scenario() -> None:
        conn = await aiomysql.connect(**aiomysql_connect_kwargs(mysql_dsn))
        try:
            with pytest.raises(ConfigurationError, match="database-generated"):
                await aio.enqueue_many(
                    conn, [("t", 1)], job_id_strategy=Generated(), **mysql_db.table_options
                )
            await conn.commit()
        finally:
            conn.close()

    run(scenario())
    assert mysql_db.jobs() == []


@pytest.mark.parametrize("batch_size", [1, 4])
def test_the_async_worker_on_an_aiomysql_pool_runs_every_job_and_gives_the_pool_back(
    mysql_db: SqlHarness, mysql_dsn: str, batch_size: int
) -> None:
    conn = mysql_db.connect()
    enqueue_many(conn, [("t", n) for n in range(6)], **mysql_db.table_options)
    conn.commit()
    conn.close()
    done: list[int] = []

    async def scenario() -> tuple[int, int]:
        pool = await aiomysql.create_pool(minsize=0, maxsize=2, **aiomysql_connect_kwargs(mysql_dsn))

        async def handler(job_type: str, payload: int) -> None:
            await asyncio.sleep(0)
            done.append(payload)

        try:
            worker = aio.create_queue_worker(
                pool,
                handler,
                polling_interval_ms=20,
                worker_threads=2,
                batch_size=batch_size,
                **mysql_db.table_options,
            )
            assert isinstance(worker.backend, AsyncMySQLBackend)
            async with worker:
                for _ in range(1500):
                    if len(done) == 6:
                        break
                    await asyncio.sleep(0.02)
            return pool.size, pool.freesize
        finally:
            pool.close()
            await pool.wait_closed()

    size, free = run(scenario())
    assert sorted(done) == list(range(6))
    assert size == free  # every connection the worker took is back in the pool
    assert mysql_db.jobs() == []
    assert sorted(job.status for job in mysql_db.archived_jobs()) == [":success"] * 6


def test_a_functools_partial_of_aiomysql_connect_gets_the_mysql_backend(mysql_dsn: str) -> None:
    worker = aio.create_queue_worker(aiomysql_connection_factory(mysql_dsn), _noop)
    assert isinstance(worker.backend, AsyncMySQLBackend)


async def _noop(job_type: str, payload: Any) -> None:
    return None


def test_stop_releases_a_stuck_handlers_job_on_mysql_and_the_sync_worker_runs_it(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    conn = mysql_db.connect()
    enqueue(conn, "stubborn", 1, **mysql_db.table_options)
    conn.commit()
    conn.close()
    started: list[str] = []

    async def scenario() -> None:
        async def handler(job_type: str, payload: int) -> None:
            started.append(job_type)
            await asyncio.sleep(3600)  # ignores stop(): cancelled at the deadline

        worker = aio.create_queue_worker(
            aiomysql_connection_factory(mysql_dsn),
            handler,
            polling_interval_ms=20,
            await_termination_timeout_ms=300,
            **mysql_db.table_options,
        )
        await worker.start()
        for _ in range(1500):
            if started:
                break
            await asyncio.sleep(0.02)
        with pytest.raises(ShutdownTimeoutError, match="released back to the queue"):
            await worker.stop()

    run(scenario())
    assert started == ["stubborn"]
    # Rolled back by the server as the closed connection went: as it was, and claimable by the other API.
    assert [(job.job_type, job.attempts) for job in mysql_db.jobs()] == [(":stubborn", 0)]
    seen: list[str] = []
    assert process_next_job(mysql_db.data_source, lambda t, p: seen.append(t), **mysql_db.table_options)
    assert seen == ["stubborn"]
