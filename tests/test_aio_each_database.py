"""proletarian_ref.aio on each database's asyncio driver (psycopg, aiomysql): the threaded API's rows, byte
for byte, and jobs of each API run by the other."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aio_support import AsyncDatabase, run
from fix_db import selected_backends
from support import FakeClock

from proletarian_ref import aio, enqueue, enqueue_many, process_next_job
from proletarian_ref.job import JobSpec

_DIALECTS = ("postgresql", "mysql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The databases --backends chose (tox runs one an env), as the `db` fixture's parametrization does.
    if "adb" in metafunc.fixturenames:
        chosen = [d for d in _DIALECTS if d in selected_backends(metafunc.config)]
        params = [pytest.param(d, marks=getattr(pytest.mark, d)) for d in chosen]
        metafunc.parametrize("adb", params, indirect=True)


@pytest.fixture
def adb(request: pytest.FixtureRequest) -> Iterator[AsyncDatabase]:
    dialect = request.param
    db = request.getfixturevalue("pg_db" if dialect == "postgresql" else "mysql_db")
    dsn = request.getfixturevalue("pg_dsn" if dialect == "postgresql" else "mysql_dsn")
    yield AsyncDatabase(db, dsn, dialect)


_PAYLOAD = {"to": "a@example.com", "n": 1, "q": "it's"}
_JOBS: list[JobSpec | tuple[str, Any]] = [("a", [1, 2]), JobSpec("b", "text\n\\ é", queue="other")]


def test_async_enqueue_writes_the_bytes_the_sync_api_writes(adb: AsyncDatabase) -> None:
    clock = FakeClock()
    conn = adb.db.connect()
    options = {"job_id_strategy": adb.ids(), "clock": clock, **adb.db.table_options}
    enqueue(conn, "send-email", _PAYLOAD, queue="mail", **options)
    enqueue_many(conn, _JOBS, **options)
    conn.commit()
    conn.close()
    written_by_sync = adb.raw_rows()
    adb.db.clear()

    async def enqueue_async() -> None:
        aconn = await adb.connect()
        try:
            options = {"job_id_strategy": adb.ids(), "clock": clock, **adb.db.table_options}
            await aio.enqueue(aconn, "send-email", _PAYLOAD, queue="mail", **options)
            await aio.enqueue_many(aconn, _JOBS, **options)
            await aconn.commit()
        finally:
            await adb.close(aconn)

    run(enqueue_async())
    assert len(written_by_sync) == 3
    assert adb.raw_rows() == written_by_sync


def test_jobs_of_each_api_are_run_by_the_other(adb: AsyncDatabase) -> None:
    db = adb.db
    seen: list[tuple[str, Any]] = []
    conn = db.connect()
    enqueue(conn, "from-sync", 1, **db.table_options)
    conn.commit()
    conn.close()

    async def handler(job_type: str, payload: Any) -> None:
        await asyncio.sleep(0)
        seen.append((job_type, payload))

    assert run(aio.process_next_job(adb.factory(), handler, **db.table_options)) is True

    async def enqueue_async() -> None:
        aconn = await adb.connect()
        try:
            await aio.enqueue(aconn, "from-async", 2, **db.table_options)
            await aconn.commit()
        finally:
            await adb.close(aconn)

    run(enqueue_async())
    ran = process_next_job(db.data_source, lambda t, p: seen.append((t, p)), **db.table_options)
    assert ran is True
    assert seen == [("from-sync", 1), ("from-async", 2)]
    archived = sorted((job.job_type, job.status) for job in db.archived_jobs())
    assert archived == [(":from-async", ":success"), (":from-sync", ":success")]
