"""The asyncio PostgreSQL backend's own exchange (pg_exchange): one pipeline, one Sync, then out of it."""

from __future__ import annotations

import asyncio
import os
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
        session = Session(conn)
        try:
            await body(conn, session)
        finally:
            session.close()
            await conn.close()

    asyncio.run(main())


class _Watches:
    """Counts the event loop's watches for `session` (readers whose callback is the session's) and the
    calls of its reader."""

    def __init__(self, loop: asyncio.AbstractEventLoop, session: Session) -> None:
        self.added = self.removed = self.calls = 0
        add, remove = loop.add_reader, loop.remove_reader
        watched: set[Any] = set()

        def add_reader(fd: Any, callback: Any, *args: Any) -> None:
            if getattr(callback, "__self__", None) is not session:
                return add(fd, callback, *args)

            def counted(*args: Any) -> None:
                self.calls += 1
                callback(*args)

            self.added += 1
            watched.add(fd)
            return add(fd, counted, *args)

        def remove_reader(fd: Any) -> bool:
            if fd in watched:
                self.removed += 1
            return remove(fd)

        loop.add_reader = add_reader  # type: ignore[method-assign,assignment]
        loop.remove_reader = remove_reader  # type: ignore[method-assign]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


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
        assert list(session.prepared.values()) == [b"_proletarian_0", b"_proletarian_1"]
        again = Command(echo.statement, {"id": job_id, "n": 1, "text": "x"})
        await exchange(conn, session, [again])
        assert len(session.prepared) == 2 and again.rowcount == 1
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
        assert set(session.prepared) == {b"BEGIN", b"SELECT 1 / 0"}
        assert conn.pgconn.pipeline_status == pq.PipelineStatus.OFF
        assert conn.pgconn.transaction_status == pq.TransactionStatus.INERROR
        await conn.rollback()
        await exchange(conn, session, [after])
        assert after.rowcount == 1

    _run(pg_dsn, body)


def test_transaction_statements_are_prepared_once_and_run_by_name_as_the_claim_is(pg_dsn: str) -> None:
    # BEGIN and COMMIT go in every exchange of a chain: by name, the server parses them once a connection.
    async def body(conn: psycopg.AsyncConnection[Any], session: Session) -> None:
        for n in range(3):
            claim = Command("SELECT %(n)s::int", {"n": n})
            await exchange(conn, session, [Command("BEGIN"), claim, Command("COMMIT")])
            assert claim.rowcount == 1
            assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert session.prepared == {
            b"BEGIN": b"_proletarian_0",
            b"SELECT $1::int": b"_proletarian_1",
            b"COMMIT": b"_proletarian_2",
        }
        cursor = await conn.execute("SELECT name, statement FROM pg_prepared_statements ORDER BY name")
        assert await cursor.fetchall() == [
            ("_proletarian_0", "BEGIN"),
            ("_proletarian_1", "SELECT $1::int"),
            ("_proletarian_2", "COMMIT"),
        ]
        await conn.rollback()

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


def test_the_loop_watches_the_socket_once_for_many_exchanges_and_stops_at_close(pg_dsn: str) -> None:
    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(pg_dsn)
        conn.prepare_threshold = None
        before = _open_fds()
        try:
            session = Session(conn)
            watches = _Watches(asyncio.get_running_loop(), session)
            for n in range(50):
                claim = Command("SELECT %(n)s::int", {"n": n})
                await exchange(conn, session, [Command("BEGIN"), claim, Command("COMMIT")])
                assert claim.rowcount == 1
            # One watch for all fifty, not one a wait; each exchange's data woke its wait once.
            assert (watches.added, watches.removed) == (1, 0)
            assert session.watching and watches.calls == 50
            session.close()
            session.close()
            assert (watches.added, watches.removed) == (1, 1) and not session.watching
            # The session's own number for the socket is closed; the connection is not.
            assert _open_fds() == before
            assert (await (await conn.execute("SELECT 7")).fetchone()) == (7,)
        finally:
            await conn.close()

    asyncio.run(main())


def test_psycopgs_own_statements_between_exchanges_neither_wait_on_the_watch_nor_spin_the_loop(
    pg_dsn: str,
) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], session: Session) -> None:
        watches = _Watches(asyncio.get_running_loop(), session)
        for n in range(5):
            claim = Command("SELECT %(n)s::int", {"n": n})
            await exchange(conn, session, [Command("BEGIN"), claim])
            assert session.watching
            # A handler's statements on the job's connection, through psycopg's own waits.
            for _ in range(3):
                cursor = await asyncio.wait_for(conn.execute("SELECT pg_sleep(0.01), 1"), 5)
                assert (await cursor.fetchone()) == ("", 1)
            await exchange(conn, session, [Command("COMMIT")])
        # The first one's data woke the watch with no wait of ours: it stopped, and the exchange after them
        # watched again. Each exchange's data woke its wait once, read at once.
        assert (watches.added, watches.removed) == (6, 5)
        assert watches.calls == 10 + 5

    _run(pg_dsn, body)


def test_data_for_no_exchange_while_idle_stops_the_watch_rather_than_spin_the_loop(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], session: Session) -> None:
        watches = _Watches(asyncio.get_running_loop(), session)
        await conn.set_autocommit(True)
        await conn.execute("LISTEN proletarian_exchange_test")
        await exchange(conn, session, [Command("SELECT 1")])
        assert session.watching
        watches.calls = 0
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as other:
            await other.execute("NOTIFY proletarian_exchange_test")
        # Nobody reads the notification while the connection is idle: the watch saw it once and stopped,
        # where a watch kept would wake the loop at every turn for as long as it stays unread.
        await asyncio.sleep(0.3)
        assert not session.watching and watches.calls == 1
        # The next exchange watches again and reads its results past the notification.
        echo = Command("SELECT %(n)s::int", {"n": 5})
        await exchange(conn, session, [echo])
        assert echo.rowcount == 1 and session.watching

    _run(pg_dsn, body)


def test_a_server_that_ends_an_idle_connection_stops_the_watch_and_the_next_exchange_closes_it(
    pg_dsn: str,
) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], session: Session) -> None:
        watches = _Watches(asyncio.get_running_loop(), session)
        await exchange(conn, session, [Command("SELECT 1")])
        watches.calls = 0
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as other:
            await other.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        await asyncio.sleep(0.3)
        assert not session.watching and watches.calls == 1
        before = _open_fds()
        with pytest.raises(psycopg.OperationalError):
            await exchange(conn, session, [Command("SELECT 1")])
        # Closed with the connection, the session's number for the socket too.
        assert conn.closed and _open_fds() == before - 2

    _run(pg_dsn, body)
