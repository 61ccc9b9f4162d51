"""unique_key on proletarian_ref.aio's enqueue and enqueue_many: the threaded API's rows and answers."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from aio_support import SequentialIds as _Ids
from aio_support import pg_raw_rows as _raw_rows
from aio_support import run
from support import FakeClock

from conformance.harness import SqlHarness
from conformance.side_tables import harness_payload, prepare
from proletarian_ref import JobSpec, aio, enqueue, enqueue_many, side_tables
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.tables import table_name
from proletarian_ref.unique import UniqueKey, UniqueKeyHeldError

pytestmark = pytest.mark.postgresql


def _unique_key_table_rows(db: SqlHarness) -> list[tuple[Any, ...]]:
    table = side_tables.side_table(table_name(db.job_table), "unique")
    return db.select(f"SELECT t::text FROM {table} t ORDER BY unique_key")


def _sync_keyed(db: SqlHarness, clock: FakeClock) -> list[Any]:
    conn = db.connect()
    options = {"job_id_strategy": _Ids(), "clock": clock, **db.table_options}
    first = enqueue(conn, "t/u", {"n": 1}, unique_key="k1", **options)
    again = enqueue(conn, "t/u", {"n": 2}, unique_key="k1", **options)
    batch = enqueue_many(
        conn, [JobSpec("t/u", 3, unique_key="k2"), JobSpec("t/u", 4, unique_key="k2"), ("t/u", 5)], **options
    )
    conn.commit()
    conn.close()
    return [first, again, *batch]


async def _async_keyed(db: SqlHarness, dsn: str, clock: FakeClock) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        options = {"job_id_strategy": _Ids(), "clock": clock, **db.table_options}
        first = await aio.enqueue(conn, "t/u", {"n": 1}, unique_key="k1", **options)
        again = await aio.enqueue(conn, "t/u", {"n": 2}, unique_key="k1", **options)
        batch = await aio.enqueue_many(
            conn,
            [JobSpec("t/u", 3, unique_key="k2"), JobSpec("t/u", 4, unique_key="k2"), ("t/u", 5)],
            **options,
        )
        await conn.commit()
        return [first, again, *batch]


def test_async_unique_keys_write_the_rows_and_give_the_answers_of_the_sync_api(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    prepare(pg_db)
    clock = FakeClock()
    sync_answers = _sync_keyed(pg_db, clock)
    sync_jobs, sync_keys = _raw_rows(pg_db, pg_db.job_table), _unique_key_table_rows(pg_db)
    pg_db.clear()
    prepare(pg_db)
    async_answers = run(_async_keyed(pg_db, pg_dsn, clock))
    # A held key answers with its holder; a key twice in one batch gives the later job the earlier's id.
    assert sync_answers[1] == sync_answers[0] and sync_answers[3] == sync_answers[2]
    assert async_answers == sync_answers
    assert len(sync_jobs) == 3 and len(sync_keys) == 2
    assert _raw_rows(pg_db, pg_db.job_table) == sync_jobs
    assert _unique_key_table_rows(pg_db) == sync_keys


def test_a_key_held_by_a_job_of_either_api_answers_the_other(pg_db: SqlHarness, pg_dsn: str) -> None:
    prepare(pg_db)
    conn = pg_db.connect()
    by_sync = enqueue(conn, "t/u", 1, unique_key="from-sync", **pg_db.table_options)
    conn.commit()

    async def scenario() -> tuple[Any, Any, Any]:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
            answer = await aio.enqueue(aconn, "t/u", 2, unique_key="from-sync", **pg_db.table_options)
            by_async = await aio.enqueue(aconn, "t/u", 3, unique_key="from-async", **pg_db.table_options)
            with pytest.raises(UniqueKeyHeldError) as held:
                await aio.enqueue(
                    aconn,
                    "t/u",
                    4,
                    unique_key=UniqueKey("from-sync", conflict="raise"),
                    **pg_db.table_options,
                )
            await aconn.rollback()
            by_async = await aio.enqueue(aconn, "t/u", 3, unique_key="from-async", **pg_db.table_options)
            await aconn.commit()
            return answer, by_async, held.value.job_id

    answer, by_async, holder = run(scenario())
    assert answer == by_sync and holder == by_sync
    assert enqueue(conn, "t/u", 5, unique_key="from-async", **pg_db.table_options) == by_async
    conn.commit()
    conn.close()
    assert sorted(harness_payload(job.payload) for job in pg_db.jobs()) == [1, 3]


def test_a_rolled_back_async_keyed_enqueue_leaves_no_key(pg_db: SqlHarness, pg_dsn: str) -> None:
    prepare(pg_db)

    async def scenario() -> tuple[Any, Any]:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
            rolled_back = await aio.enqueue(aconn, "t/u", 1, unique_key="k", **pg_db.table_options)
            await aconn.rollback()
            kept = await aio.enqueue(aconn, "t/u", 2, unique_key="k", **pg_db.table_options)
            await aconn.commit()
            return rolled_back, kept

    rolled_back, kept = run(scenario())
    assert rolled_back != kept
    assert [harness_payload(job.payload) for job in pg_db.jobs()] == [2]


def test_async_unique_keys_need_their_side_table_and_a_backend_that_runs_statements(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    missing = {**pg_db.table_options, "job_table": "aiocli_no_side_table_job"}

    async def without_table() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
            with pytest.raises(ConfigurationError, match=r"side table .* is missing"):
                await aio.enqueue(aconn, "t/u", 1, unique_key="k", **missing)

    run(without_table())
    asyncpg = pytest.importorskip("asyncpg")
    from proletarian_ref.backends.asyncpg_enqueue import AsyncpgEnqueueBackend

    async def on_asyncpg() -> None:
        aconn = await asyncpg.connect(pg_dsn)
        try:
            # asyncpg's enqueue-only backend runs no statement of ours (AsyncpgBackend, the default, does).
            only: Any = AsyncpgEnqueueBackend()
            with pytest.raises(ConfigurationError, match="AsyncpgEnqueueBackend has none"):
                await aio.enqueue(aconn, "t/u", 1, unique_key="k", backend=only, **pg_db.table_options)
        finally:
            await aconn.close()

    prepare(pg_db)
    run(on_asyncpg())
