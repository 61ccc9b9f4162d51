"""proletarian_ref.aio's enqueue on asyncpg connections: the sync API's rows, in the caller's transaction."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from aio_support import SequentialIds as _Ids
from aio_support import pg_raw_rows as _raw_rows
from aio_support import run
from support import FakeClock

from conformance.harness import SqlHarness
from proletarian_ref import aio, enqueue, enqueue_many, process_next_job
from proletarian_ref.backends.asyncpg_enqueue import numbered
from proletarian_ref.errors import ConfigurationError, SchemaMissingError
from proletarian_ref.job import JobSpec

pytestmark = pytest.mark.postgresql


def _jobs(db: SqlHarness, clock: FakeClock) -> tuple[dict[str, Any], list[Any]]:
    return {"job_id_strategy": _Ids(), "clock": clock, **db.table_options}, [
        ("a", [1, 2]),
        JobSpec("b", "text", queue="other"),
    ]


def test_numbered_turns_positional_placeholders_into_dollar_numbers() -> None:
    assert numbered("INSERT INTO t VALUES (%s, %s, now(), %s)") == "INSERT INTO t VALUES ($1, $2, now(), $3)"


def test_asyncpg_enqueue_writes_the_rows_the_sync_api_writes(pg_db: SqlHarness, pg_dsn: str) -> None:
    db, clock = pg_db, FakeClock()
    conn = db.connect()
    options, batch = _jobs(db, clock)
    enqueue(conn, "send-email", {"to": "a@example.com", "n": 1}, queue="mail", **options)
    enqueue_many(conn, batch, **options)
    conn.commit()
    conn.close()
    written_by_sync = _raw_rows(db, db.job_table)
    db.clear()

    async def scenario() -> None:
        aconn = await asyncpg.connect(pg_dsn)
        try:
            options, batch = _jobs(db, clock)
            async with aconn.transaction():
                await aio.enqueue(
                    aconn, "send-email", {"to": "a@example.com", "n": 1}, queue="mail", **options
                )
                await aio.enqueue_many(aconn, batch, **options)
        finally:
            await aconn.close()

    run(scenario())
    assert len(written_by_sync) == 3
    assert _raw_rows(db, db.job_table) == written_by_sync


def test_asyncpg_enqueue_joins_the_callers_transaction_and_never_commits(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    db = pg_db

    async def scenario() -> bool:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)
        try:
            async with pool.acquire() as aconn:
                transaction = aconn.transaction()
                await transaction.start()
                await aio.enqueue(aconn, "t", 1, **db.table_options)
                await aio.enqueue_many(aconn, [("t", 2), ("t", 3)], **db.table_options)
                still_open: bool = aconn.is_in_transaction()
                await transaction.rollback()
                return still_open
        finally:
            await pool.close()

    assert run(scenario()) is True
    assert db.jobs() == []


def test_a_bad_job_in_asyncpg_enqueue_many_writes_none(pg_db: SqlHarness, pg_dsn: str) -> None:
    db = pg_db

    async def scenario() -> None:
        aconn = await asyncpg.connect(pg_dsn)
        try:
            with pytest.raises(ConfigurationError, match=r"jobs\[1\]"):
                bad = JobSpec("t", 2, "q", "not a time")  # type: ignore[arg-type]
                await aio.enqueue_many(aconn, [("t", 1), bad], **db.table_options)
        finally:
            await aconn.close()

    run(scenario())
    assert db.jobs() == []


def test_asyncpg_enqueue_names_a_missing_table(pg_db: SqlHarness, pg_dsn: str) -> None:
    async def scenario() -> None:
        aconn = await asyncpg.connect(pg_dsn)
        try:
            with pytest.raises(SchemaMissingError, match="install the schema"):
                await aio.enqueue(aconn, "t", 1, job_table="aiodrv_no_such_table")
        finally:
            await aconn.close()

    run(scenario())


def test_a_job_enqueued_through_asyncpg_is_run_by_the_sync_worker(pg_db: SqlHarness, pg_dsn: str) -> None:
    db = pg_db
    seen: list[tuple[str, Any]] = []

    async def scenario() -> None:
        aconn = await asyncpg.connect(pg_dsn)
        try:
            await aio.enqueue(aconn, "from-asyncpg", {"n": 2}, **db.table_options)
        finally:
            await aconn.close()

    run(scenario())
    assert process_next_job(db.data_source, lambda t, p: seen.append((t, p)), **db.table_options) is True
    assert seen == [("from-asyncpg", {"n": 2})]
