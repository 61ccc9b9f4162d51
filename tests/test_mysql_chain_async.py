"""MySQL's chained plan on asyncio (AsyncMySQLBackend(chain=True)): a finished job's checked archive and
delete, its COMMIT and the next claim in one query on aiomysql, as the threaded MySQLBackend sends them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pymysql
import pytest
from mysql_chain_support import (
    BATCH,
    CHAIN,
    JOBS,
    WITHIN_S,
    archiving_nothing,
    assert_one_query_a_job,
    enqueue,
    refused,
    tables,
)
from support import aclaim_finish_and_chain, assert_kept_or_lost, drain_asyncio

from conformance.harness import SqlHarness
from proletarian_ref import DatabaseError
from proletarian_ref.backends import mysql_chain
from proletarian_ref.backends.dsn import mysql_connect_kwargs
from proletarian_ref.backends.mysql import MySQLBackend
from proletarian_ref.backends.mysql_async import (
    AsyncMySQLBackend,
    _Cursor,
    _quote,
    aiomysql_connection_factory,
)


def _connect(mysql_dsn: str, sent: list[str] | None = None) -> Callable[[], Awaitable[Any]]:
    """aiomysql connections to the test server; with `sent`, each notes every query it sends."""
    connect = aiomysql_connection_factory(mysql_dsn)

    async def factory() -> Any:
        conn = await connect()
        if sent is not None:
            query = conn.query

            async def recorded(text: Any, unbuffered: bool = False) -> Any:
                sent.append(text if isinstance(text, str) else text.decode())
                return await query(text, unbuffered)

            conn.query = recorded
        return conn

    return factory


async def _drain(
    db: SqlHarness, backend: Any, batch_size: int, until: Callable[[], bool] = lambda: False
) -> list[Any]:
    """Run one asyncio worker task on `backend` until every queued job is gone (or `until()`), then close
    the backend; the payloads it ran."""
    ran: list[Any] = []

    async def handler(job_type: str, payload: Any) -> None:
        ran.append(payload)

    def over() -> bool:
        return until() or not db.jobs()

    await drain_asyncio(db, backend, handler, batch_size=batch_size, until=over, timeout=WITHIN_S)
    return ran


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_an_asyncio_mysql_chain_sends_each_finished_job_with_its_commit_and_the_next_claim_in_one_query(
    mysql_db: SqlHarness, mysql_dsn: str, batch_size: int
) -> None:
    job_ids = enqueue(mysql_db, JOBS)
    sent: list[str] = []
    backend = AsyncMySQLBackend(_connect(mysql_dsn, sent), **CHAIN)
    asyncio.run(_drain(mysql_db, backend, batch_size))
    # As the threaded backend's (tests/test_mysql_chain.py).
    assert_one_query_a_job(mysql_db, sent, job_ids, batch_size)


def test_the_asyncio_chains_query_is_the_threaded_backends_byte_for_byte(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    """The same job's kept-back writes: the same text from either API (the values written in by aiomysql's
    escaping, made PyMySQL's own by mysql_async._literal), an id's bytes with a quote and a backslash."""
    job_table, archived = tables(mysql_db)
    codec = MySQLBackend(None, **CHAIN)
    params = codec._archive_params(b"\x00\x01'\\id", ":success", datetime(2026, 12, 6, 12, 0, 0, 123456, UTC))

    async def asyncio_text() -> str:
        conn = await _connect(mysql_dsn)()
        try:
            deferred = mysql_chain.deferred_job(_quote(conn), codec._statements, job_table, archived, params)
            return deferred.text
        finally:
            conn.close()

    threaded_conn = pymysql.connect(**mysql_connect_kwargs(mysql_dsn))
    try:
        threaded = mysql_chain.deferred_job(
            threaded_conn.escape, codec._statements, job_table, archived, params
        ).text
    finally:
        threaded_conn.close()
    assert asyncio.run(asyncio_text()) == threaded
    assert "X'0001275c6964'" in threaded


class _ArchivesNothing(AsyncMySQLBackend):
    """The chain's kept-back archive archives no row (the delete still deletes the jobs); with `checked`
    False, the server's checks taken out too."""

    checked = True

    async def _keep_back(self, conn: Any, pending: Any, deferred: mysql_chain.Deferred) -> None:
        deferred.text = archiving_nothing(deferred.text, checked=self.checked)
        await super()._keep_back(conn, pending, deferred)


@pytest.mark.parametrize("batch_size", [1, BATCH])
@pytest.mark.parametrize("checked", [True, False], ids=["server-checked", "check-taken-out"])
def test_an_asyncio_mysql_chains_archive_that_changes_no_row_rolls_back_its_commit_and_keeps_the_jobs(
    mysql_db: SqlHarness,
    mysql_dsn: str,
    checked: bool,
    batch_size: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db = mysql_db
    # One batch more than the worker's first, so that the broken archive goes with a chain's COMMIT.
    job_ids = enqueue(db, 2 * batch_size)
    backend = _ArchivesNothing(_connect(mysql_dsn), **CHAIN)
    backend.checked = checked
    assert asyncio.run(_drain(db, backend, batch_size, until=lambda: refused(batch_size) in caplog.text))
    assert_kept_or_lost(db, job_ids, caplog.text, refused(batch_size), checked=checked, all_lost=False)


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_an_asyncio_mysql_chains_refused_count_raises_before_its_commit_in_the_clients_check_words(
    mysql_db: SqlHarness, mysql_dsn: str, batch_size: int
) -> None:
    db = mysql_db
    enqueue(db, batch_size)
    queued = db.jobs()
    queue = queued[0].queue
    backend = _ArchivesNothing(_connect(mysql_dsn), **CHAIN)
    now = datetime.now(UTC) + timedelta(minutes=1)

    async def main() -> None:
        try:
            async with backend.transaction() as conn:
                await aclaim_finish_and_chain(backend, conn, tables(db), queue, now, batch_size)
        finally:
            await backend.close()

    with pytest.raises(DatabaseError, match=f"^{re.escape(refused(batch_size))}"):
        asyncio.run(main())
    assert db.jobs() == queued and db.archived_jobs() == []


@pytest.mark.parametrize("ending", ["commit", "raise"])
def test_an_asyncio_kept_back_archive_goes_before_the_next_statement_and_the_blocks_own_commit(
    mysql_db: SqlHarness, mysql_dsn: str, ending: str
) -> None:
    """Outside a chain the kept-back write still goes first: the next statement on the connection sees it
    done, and the block's COMMIT writes it, or its rollback undoes it."""
    db = mysql_db
    enqueue(db, 2)
    queue = db.jobs()[0].queue
    job_table, archived = tables(db)
    backend = AsyncMySQLBackend(_connect(mysql_dsn), **CHAIN)
    now = datetime.now(UTC) + timedelta(minutes=1)
    claimed: list[Any] = []

    async def main() -> None:
        try:
            async with backend.transaction() as conn:
                first = await backend.get_next_job(conn, job_table, queue, now)
                assert first is not None
                await backend.archive_and_delete_job(conn, job_table, archived, first.job_id, ":success", now)
                second = await backend.get_next_job(conn, job_table, queue, now)
                assert second is not None and second.job_id != first.job_id
                claimed.extend((first.job_id, second.job_id))
                async with conn.cursor(_Cursor) as cursor:
                    await cursor.execute(
                        f"SELECT COUNT(*) FROM {archived} WHERE job_id = %s", (first.job_id,)
                    )
                    assert await cursor.fetchone() == (1,)
                if ending == "raise":
                    raise RuntimeError("planted")
        finally:
            await backend.close()

    if ending == "raise":
        with pytest.raises(RuntimeError):
            asyncio.run(main())
        assert db.archived_jobs() == [] and len(db.jobs()) == 2
    else:
        asyncio.run(main())
        assert [job.job_id for job in db.archived_jobs()] == [claimed[0]]
        assert [job.job_id for job in db.jobs()] == [claimed[1]]


def test_two_asyncio_kept_back_archives_in_a_row_are_both_written(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    """A finished job kept back while another is (two archives with no statement between, which the
    worker never sends): the first goes before the second is kept, so neither is dropped."""
    db = mysql_db
    enqueue(db, 2)
    queue = db.jobs()[0].queue
    job_table, archived = tables(db)
    backend = AsyncMySQLBackend(_connect(mysql_dsn), **CHAIN)
    now = datetime.now(UTC) + timedelta(minutes=1)

    async def main() -> None:
        try:
            async with backend.transaction() as conn:
                records = await backend.get_next_jobs(conn, job_table, queue, now, 2)
                for record in records:
                    await backend.archive_and_delete_job(
                        conn, job_table, archived, record.job_id, ":success", now
                    )
        finally:
            await backend.close()

    asyncio.run(main())
    assert db.jobs() == [] and len(db.archived_jobs()) == 2


def test_asyncio_commit_and_get_next_job_on_a_callers_connection_commits_then_claims(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    """Outside the backend's own transaction (a caller's connection) the COMMIT and the claim go apart."""
    db = mysql_db
    enqueue(db, 1)
    queue = db.jobs()[0].queue
    job_table, _ = tables(db)
    backend = AsyncMySQLBackend(None, **CHAIN)

    async def main() -> Any:
        conn = await _connect(mysql_dsn)()
        try:
            await conn.autocommit(False)
            async with conn.cursor() as cursor:
                await cursor.execute("SET time_zone = '+00:00'")
            record = await backend.commit_and_get_next_job(
                conn, job_table, queue, datetime.now(UTC) + timedelta(minutes=1)
            )
            await conn.rollback()
            return record
        finally:
            conn.close()

    record = asyncio.run(main())
    assert record is not None and record.job_id == db.jobs()[0].job_id


def test_the_asyncio_backend_is_chained_only_with_chain() -> None:
    assert AsyncMySQLBackend(None).chained_claims is False
    assert AsyncMySQLBackend(None, chain=True).chained_claims is True
