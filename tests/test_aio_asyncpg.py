"""proletarian_ref.aio on asyncpg: enqueue (unique keys too) writes the sync API's rows in the caller's
transaction, and the asyncpg worker and the sync one run each other's jobs."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from aio_support import SequentialIds as _Ids
from aio_support import pg_raw_rows as _raw_rows
from aio_support import run
from support import FakeClock
from test_aio_unique import _sync_keyed, _unique_key_table_rows

from conformance.harness import SqlHarness
from conformance.side_tables import harness_payload, prepare
from proletarian_ref import aio, enqueue, enqueue_many, process_next_job
from proletarian_ref.backends.asyncpg_enqueue import numbered
from proletarian_ref.errors import ConfigurationError, SchemaMissingError
from proletarian_ref.job import JobSpec
from proletarian_ref.unique import UniqueKey, UniqueKeyHeldError

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


def test_the_asyncpg_worker_and_the_sync_worker_run_each_others_jobs(pg_db: SqlHarness, pg_dsn: str) -> None:
    db = pg_db
    seen: list[tuple[str, Any]] = []

    async def handle(job_type: str, payload: Any) -> None:
        seen.append((job_type, payload))

    conn = db.connect()
    enqueue(conn, "from-sync", {"n": 1}, **db.table_options)
    conn.commit()
    conn.close()

    async def scenario() -> bool | None:
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
        try:
            ran = await aio.process_next_job(pool, handle, **db.table_options)
            async with pool.acquire() as aconn:
                await aio.enqueue(aconn, "from-asyncpg", {"n": 2}, **db.table_options)
            return ran
        finally:
            await pool.close()

    assert run(scenario()) is True
    assert seen == [("from-sync", {"n": 1})]
    assert process_next_job(db.data_source, lambda t, p: seen.append((t, p)), **db.table_options) is True
    assert seen == [("from-sync", {"n": 1}), ("from-asyncpg", {"n": 2})]
    assert db.jobs() == []


def test_asyncpg_unique_keys_write_the_rows_and_give_the_answers_of_the_sync_api(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    db, clock = pg_db, FakeClock()
    prepare(db)
    sync_answers = _sync_keyed(db, clock)
    sync_jobs, sync_keys = _raw_rows(db, db.job_table), _unique_key_table_rows(db)
    db.clear()
    prepare(db)

    async def keyed() -> list[Any]:
        conn = await asyncpg.connect(pg_dsn)
        try:
            options = {"job_id_strategy": _Ids(), "clock": clock, **db.table_options}
            async with conn.transaction():
                first = await aio.enqueue(conn, "t/u", {"n": 1}, unique_key="k1", **options)
                again = await aio.enqueue(conn, "t/u", {"n": 2}, unique_key="k1", **options)
                batch = await aio.enqueue_many(
                    conn,
                    [JobSpec("t/u", 3, unique_key="k2"), JobSpec("t/u", 4, unique_key="k2"), ("t/u", 5)],
                    **options,
                )
            return [first, again, *batch]
        finally:
            await conn.close()

    assert run(keyed()) == sync_answers
    assert _raw_rows(db, db.job_table) == sync_jobs
    assert _unique_key_table_rows(db) == sync_keys


def test_a_key_held_on_asyncpg_answers_the_sync_api_and_a_rolled_back_one_is_free(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    db = pg_db
    prepare(db)
    conn = db.connect()
    by_sync = enqueue(conn, "t/u", 1, unique_key="from-sync", **db.table_options)
    conn.commit()

    async def scenario() -> tuple[Any, Any, Any]:
        aconn = await asyncpg.connect(pg_dsn)
        try:
            answer = await aio.enqueue(aconn, "t/u", 2, unique_key="from-sync", **db.table_options)
            held_key = UniqueKey("from-sync", conflict="raise")
            with pytest.raises(UniqueKeyHeldError) as held:
                async with aconn.transaction():
                    await aio.enqueue(aconn, "t/u", 3, unique_key="from-asyncpg", **db.table_options)
                    await aio.enqueue(aconn, "t/u", 4, unique_key=held_key, **db.table_options)
            # The transaction that claimed "from-asyncpg" rolled back: the key is free again.
            async with aconn.transaction():
                by_asyncpg = await aio.enqueue(aconn, "t/u", 5, unique_key="from-asyncpg", **db.table_options)
            return answer, by_asyncpg, held.value.job_id
        finally:
            await aconn.close()

    answer, by_asyncpg, holder = run(scenario())
    assert answer == by_sync and holder == by_sync
    assert enqueue(conn, "t/u", 6, unique_key="from-asyncpg", **db.table_options) == by_asyncpg
    conn.commit()
    conn.close()
    assert sorted(harness_payload(job.payload) for job in db.jobs()) == [1, 5]
