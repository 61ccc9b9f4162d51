"""The asyncio PostgreSQL backend's own exchange (pg_exchange): one pipeline, one Sync, then out of it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import pq

from proletarian_ref.backends.pg_exchange import Command, Session, exchange, numbered

pytestmark = pytest.mark.postgresql


def test_placeholders_are_numbered_in_order_of_first_use() -> None:
    assert numbered("SELECT %(a)s, %(b)s, %(a)s") == (b"SELECT $1, $2, $1", ("a", "b"))
    assert numbered("SELECT %s, %s") == (b"SELECT $1, $2", 2)
    with pytest.raises(ValueError, match="mixes named and positional"):
        numbered("SELECT %(a)s, %s")


def _run(pg_dsn: str, body: Any) -> None:
    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(pg_dsn)
        conn.prepare_threshold = None
        try:
            await body(conn, Session(conn))
        finally:
            await conn.close()

    asyncio.run(main())


def test_an_exchange_returns_each_statements_result_and_leaves_pipeline_mode(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], session: Session) -> None:
        job_id = uuid.uuid4()
        echo = Command("SELECT %(id)s::uuid, %(n)s::int + 1, %(text)s", {"id": job_id, "n": 41, "text": "é"})
        await exchange(conn, session, [Command("BEGIN"), echo])
        assert conn.pgconn.pipeline_status == pq.PipelineStatus.OFF
        assert conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS
        assert echo.rowcount == 1
        session.loader.set_pgresult(echo.result)
        assert session.loader.load_row(0, tuple) == (job_id, 42, "é")
        # Prepared once, then executed by name.
        assert list(session.prepared.values()) == [b"_proletarian_0"]
        again = Command(echo.statement, {"id": job_id, "n": 1, "text": "x"})
        await exchange(conn, session, [again])
        assert len(session.prepared) == 1 and again.rowcount == 1
        # psycopg carries on in the same transaction.
        await conn.execute("SELECT 1")
        await conn.rollback()

    _run(pg_dsn, body)


def test_a_refused_statement_is_raised_after_every_result_is_in_and_the_transaction_rolls_back(
    pg_dsn: str,
) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], session: Session) -> None:
        after = Command("SELECT %(n)s::int", {"n": 1})
        with pytest.raises(psycopg.errors.DivisionByZero):
            await exchange(conn, session, [Command("BEGIN"), Command("SELECT 1 / 0"), after])
        # Skipped, not run: the pipeline was aborted at the error, and the prepare with it.
        assert after.result is not None and after.result.status == pq.ExecStatus.PIPELINE_ABORTED
        assert session.prepared == {}
        assert conn.pgconn.pipeline_status == pq.PipelineStatus.OFF
        assert conn.pgconn.transaction_status == pq.TransactionStatus.INERROR
        await conn.rollback()
        await exchange(conn, session, [after])
        assert after.rowcount == 1

    _run(pg_dsn, body)


def test_statements_a_handlers_discard_all_took_away_are_prepared_again_after_one_refusal(
    pg_dsn: str,
) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], session: Session) -> None:
        claim = Command("SELECT %(n)s::int", {"n": 1})
        await exchange(conn, session, [Command("BEGIN"), claim])
        await conn.rollback()
        await conn.set_autocommit(True)
        await conn.execute("DISCARD ALL")
        await conn.set_autocommit(False)
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            await exchange(conn, session, [Command("BEGIN"), claim])
        await conn.rollback()
        assert session.prepared == {}
        await exchange(conn, session, [Command("BEGIN"), claim])
        assert claim.rowcount == 1
        await conn.rollback()

    _run(pg_dsn, body)


def test_a_cancelled_exchange_closes_its_connection(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], session: Session) -> None:
        slow = asyncio.ensure_future(exchange(conn, session, [Command("SELECT pg_sleep(5)")]))
        await asyncio.sleep(0.2)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        # Left in pipeline mode with a result on the way, it could not be used again: closed.
        assert conn.closed

    _run(pg_dsn, body)
