"""Chained claims (chain=True, ChainedClaim): fewer round trips a job, each job its own transaction."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import psycopg
import pytest
from support import (
    aclaim_finish_and_chain,
    assert_kept_or_lost,
    claim_finish_and_chain,
    drain_asyncio,
    drain_threaded,
    enqueue_committed,
)

import proletarian_ref as pr
from conformance.harness import SqlHarness
from proletarian_ref import ConfigurationError, DatabaseError, aio, sql
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend
from proletarian_ref.backends.pg_exchange import Command
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.backends.postgres_async import AsyncPostgresBackend
from proletarian_ref.tables import TableName, table_name

JOBS = 12
# Each chained plan's backend options: psycopg outside and inside pipeline mode, with and without the
# compact plan.
PLANS = [
    {"chain": True},
    {"chain": True, "compact": True},
    {"chain": True, "pipeline": True, "compact": True},
]
WITHIN_S = 30.0
# Jobs a batch in batch mode's chain: JOBS is three whole batches.
BATCH = 4


def _plan_id(options: dict[str, bool]) -> str:
    return "-".join(sorted(options))


class _Counting(PostgresBackend):
    """Records the statements the backend sends through _execute, in order, with the thread that sent each
    (the worker's listener sends its probe from a thread of its own)."""

    statements: list[tuple[int, str]]

    def _execute(self, conn: Any, statement: str, params: Any, read: Any, *, copy: bool = False) -> Any:
        self.statements.append((threading.get_ident(), statement))
        return super()._execute(conn, statement, params, read, copy=copy)

    def _queue_write(self, lease: Any, statement: str, params: Any, what: str, job_id: Any) -> None:
        # A pipelined connection's one-row writes: queued, and settled by the next statement.
        self.statements.append((threading.get_ident(), statement))
        super()._queue_write(lease, statement, params, what, job_id)


_CountingT = TypeVar("_CountingT", bound=_Counting)


def _named_factory(dsn: str, name: str) -> Any:
    """Connections that pg_stat_activity can tell apart from every other test's."""
    return functools.partial(psycopg.connect, dsn, application_name=name)


def _open_transactions(db: SqlHarness, name: str) -> list[str]:
    """The states of the sessions named `name`, but those idle outside a transaction."""
    rows = db.select(
        "SELECT state FROM pg_stat_activity WHERE application_name = %s AND state <> 'idle'", (name,)
    )
    return [str(state) for (state,) in rows]


def _all_idle_at_some_moment(db: SqlHarness, name: str) -> bool:
    """Whether, within WITHIN_S, one reading finds every session named `name` idle outside a transaction.

    One such moment is the proof: a transaction the chain left open would show in every reading, while
    the worker's own polls (a short transaction each) may show in any one reading, so a second reading
    after the first could catch a poll in flight.
    """
    deadline = time.monotonic() + WITHIN_S
    while _open_transactions(db, name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _enqueue(db: SqlHarness, count: int) -> list[Any]:
    return [enqueue_committed(db, "chain/job", {"n": n}) for n in range(count)]


def _archived_once(db: SqlHarness, job_ids: list[Any]) -> None:
    decode = db.job_id_strategy().decode_id
    archived = db.archived_jobs()
    assert sorted(str(decode(job.job_id)) for job in archived) == sorted(str(i) for i in job_ids)
    assert {(job.attempts, job.status) for job in archived} == {(1, ":success")}
    assert db.jobs() == []


def _drain(db: SqlHarness, backend: Any, handler: Any, threads: int, batch_size: int = 1) -> None:
    """Run a threaded worker on `backend` until every queued job is archived, then stop it."""
    drain_threaded(db, backend, handler, threads=threads, batch_size=batch_size, timeout=WITHIN_S)


def _drained_counting(db: SqlHarness, backend: _CountingT, batch_size: int) -> _CountingT:
    """`backend` after one worker thread drained JOBS no-op jobs through it, each archived once."""
    job_ids = _enqueue(db, JOBS)
    backend.statements = []
    try:
        _drain(db, backend, lambda job_type, payload: None, threads=1, batch_size=batch_size)
    finally:
        backend.close()
    _archived_once(db, job_ids)
    return backend


@pytest.mark.parametrize("batch_size", [1, BATCH])
@pytest.mark.parametrize("options", PLANS, ids=_plan_id)
def test_a_chained_worker_sends_commit_and_begin_together_and_claims_again_in_the_new_transaction(
    pg_db: SqlHarness, options: dict[str, bool], batch_size: int
) -> None:
    backend = _drained_counting(pg_db, _Counting(pg_db.data_source, **options), batch_size)
    claims = [(thread, s) for thread, s in backend.statements if "FOR UPDATE SKIP LOCKED" in s]
    poller, claim = claims[0]
    # Batch mode's claim, get_next_jobs, takes up to batch_size jobs.
    assert ("LIMIT %(limit)s" in claim) == (batch_size > 1)
    sent = [s for thread, s in backend.statements if thread == poller]
    assert sent[0] == claim
    # The archive of a job, or of a batch: one statement on the compact plan, two otherwise.
    archive = sent[1:2] if options.get("compact") else sent[1:3]
    assert "INSERT INTO" in archive[0] and "DELETE FROM" in archive[-1]
    chain = ["COMMIT AND CHAIN"]
    # One block: the first claim, then for every job (or batch) its archive, its COMMIT AND CHAIN, the
    # next claim. The chain ends at the claim that finds the queue empty; the worker's idle polls follow.
    per_claim = [*archive, *chain, claim]
    claimed = JOBS // batch_size
    assert sent[1 : 1 + claimed * len(per_claim)] == per_claim * claimed


class _CountingSyncs(_Counting):
    """_Counting, and each settle of queued writes (a round trip of its own, before the next statement)."""

    syncs: int = 0

    def _settle(self, conn: Any, pending: list[tuple[Any, str, Any]]) -> None:
        self.syncs += 1
        super()._settle(conn, pending)


# The chained pipeline's archives, a job's and a batch's, whose row counts the server checks.
CHECKED = ("archive_and_delete_job_checked", "archive_and_delete_jobs_checked")


class _ArchivesNothingChecked(PostgresBackend):
    """The chained pipeline's archive, whose count the server checks, deletes the jobs but archives no row."""

    def _queue_write(self, lease: Any, statement: str, params: Any, what: str, job_id: Any) -> None:
        if what in CHECKED:
            assert "FROM moved\n" in statement
            statement = statement.replace("FROM moved\n", "FROM moved WHERE false\n", 1)
        super()._queue_write(lease, statement, params, what, job_id)


class _ArchivesNothingUnchecked(_ArchivesNothingChecked):
    """The same, and the server's check taken out: what the chain would commit without it."""

    def _queue_write(self, lease: Any, statement: str, params: Any, what: str, job_id: Any) -> None:
        if what in CHECKED:
            # The batch statement's last two placeholders were the check's: bound, and checking nothing.
            select = "SELECT %s, %s FROM archived" if what == CHECKED[1] else "SELECT 1 FROM archived"
            statement = statement[: statement.index("SELECT CAST(CASE")] + select
        super()._queue_write(lease, statement, params, what, job_id)


PIPELINE_CHAIN = {"chain": True, "pipeline": True, "compact": True}


def _tables(db: SqlHarness) -> tuple[TableName, TableName]:
    return table_name(db.job_table), table_name(db.archived_job_table)


def _refused(batch_size: int) -> str:
    """How a chained pipeline's refused archive count is reported: in the client's own check's words."""
    if batch_size == 1:
        return "archive_and_delete_job changed 0 rows; expected exactly 1"
    return f"archive_and_delete_jobs changed 0 rows of {batch_size} jobs; expected {batch_size}"


def _kept_or_lost(db: SqlHarness, job_ids: list[Any], logged: str, *, checked: bool, batch_size: int) -> None:
    """After a chained pipeline's archive that wrote no row: kept, or (the check taken out) all lost."""
    assert_kept_or_lost(db, job_ids, logged, _refused(batch_size), checked=checked, all_lost=True)


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_a_chained_pipeline_sends_a_finished_archive_with_its_commit_and_the_next_claim_in_one_exchange(
    pg_db: SqlHarness, batch_size: int
) -> None:
    backend = _drained_counting(pg_db, _CountingSyncs(pg_db.data_source, **PIPELINE_CHAIN), batch_size)
    archives = [statement for _thread, statement in backend.statements if "INSERT INTO" in statement]
    # The server checks every archive's count (sql/postgresql/queries.sql), so none was settled on its own:
    # each went with COMMIT AND CHAIN and the claim after it.
    if batch_size == 1:
        checked = PostgresBackend(pg_db.data_source)._render(CHECKED[0], *_tables(pg_db))
    else:
        checked = sql.render_ids("postgresql", CHECKED[1], *_tables(pg_db), batch_size)
    assert archives == [checked] * (JOBS // batch_size)
    assert backend.syncs == 0


@pytest.mark.parametrize("batch_size", [1, BATCH])
@pytest.mark.parametrize("checked", [True, False], ids=["server-checked", "check-taken-out"])
def test_a_chained_pipelines_archive_that_changes_no_row_rolls_back_its_commit_and_keeps_the_jobs(
    pg_db: SqlHarness, checked: bool, batch_size: int, caplog: pytest.LogCaptureFixture
) -> None:
    job_ids = _enqueue(pg_db, batch_size)
    cls = _ArchivesNothingChecked if checked else _ArchivesNothingUnchecked
    backend = cls(pg_db.data_source, **PIPELINE_CHAIN)
    ran: list[Any] = []
    refused = _refused(batch_size)
    try:
        drain_threaded(
            pg_db,
            backend,
            lambda job_type, payload: ran.append(payload),
            batch_size=batch_size,
            until=lambda: refused in caplog.text,
            timeout=WITHIN_S,
        )
    finally:
        backend.close()
    assert sorted(payload["n"] for payload in ran) == list(range(batch_size))
    _kept_or_lost(pg_db, job_ids, caplog.text, checked=checked, batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_a_chained_pipelines_refused_count_is_reported_as_the_clients_check_words_it(
    pg_db: SqlHarness, batch_size: int
) -> None:
    _enqueue(pg_db, batch_size)
    queued = pg_db.jobs()
    queue = queued[0].queue
    job_table, archived = _tables(pg_db)
    backend = _ArchivesNothingChecked(pg_db.data_source, **PIPELINE_CHAIN)
    now = datetime.now(UTC) + timedelta(minutes=1)
    refused = rf"^{re.escape(_refused(batch_size))} \("
    try:
        with pytest.raises(DatabaseError, match=refused), backend.transaction() as conn:
            claim_finish_and_chain(backend, conn, (job_table, archived), queue, now, batch_size)
    finally:
        backend.close()
    assert pg_db.jobs() == queued


def test_a_failed_job_does_not_end_a_chain_of_batches_and_its_failure_commits_with_its_batch(
    pg_db: SqlHarness,
) -> None:
    # Proletarian's default retry strategy retries nothing: the failed job is archived as a failure in
    # its savepoint, the batch is whole, and the next batch is claimed in the chain.
    _enqueue(pg_db, 2 * BATCH)
    ran: list[int] = []

    def handler(job_type: str, payload: Any) -> None:
        ran.append(payload["n"])
        if payload["n"] == 1:
            raise RuntimeError("planted failure")

    backend = _Counting(pg_db.data_source, chain=True, compact=True)
    backend.statements = []
    try:
        _drain(pg_db, backend, handler, threads=1, batch_size=BATCH)
    finally:
        backend.close()
    assert sorted(ran) == list(range(2 * BATCH))
    statuses = sorted(job.status for job in pg_db.archived_jobs())
    assert statuses == [":failure"] + [":success"] * (2 * BATCH - 1)
    assert pg_db.jobs() == []
    # Two chained claims: the second batch's and the one that found the queue empty.
    assert [s for _, s in backend.statements].count("COMMIT AND CHAIN") == 2


@pytest.mark.parametrize("options", PLANS, ids=_plan_id)
def test_a_chained_worker_leaves_no_transaction_open_once_the_queue_is_drained(
    pg_db: SqlHarness, pg_dsn: str, options: dict[str, bool]
) -> None:
    job_ids = _enqueue(pg_db, JOBS)
    name = f"chain-{uuid.uuid4().hex[:12]}"
    backend = PostgresBackend(_named_factory(pg_dsn, name), **options)
    worker = pr.create_queue_worker(
        None,
        lambda job_type, payload: None,
        backend=backend,
        worker_threads=3,
        polling_interval_ms=200,
        **pg_db.table_options,
    )
    try:
        with worker:
            deadline = time.monotonic() + WITHIN_S
            while pg_db.jobs() and time.monotonic() < deadline:
                time.sleep(0.02)
            # The chain's last claim found nothing: its transaction ended with the block, so between
            # polls every connection of the worker is idle, none idle in a transaction holding a snapshot.
            assert _all_idle_at_some_moment(pg_db, name)
    finally:
        backend.close()
    _archived_once(pg_db, job_ids)


def _shown_by_each_job(db: SqlHarness, backend: PostgresBackend, setting: str) -> list[str]:
    """What SHOW `setting` read in each of three jobs' transactions, drained by one thread on `backend`
    (closed after)."""
    _enqueue(db, 3)
    seen: list[str] = []

    def handler(job_type: str, payload: Any) -> None:
        with pr.current_job().connection().cursor() as cursor:
            cursor.execute(f"SHOW {setting}")
            row = cursor.fetchone()
            seen.append(str(row[0]) if row else "")

    try:
        _drain(db, backend, handler, threads=1)
    finally:
        backend.close()
    return seen


def test_every_transaction_of_a_chain_commits_asynchronously_with_synchronous_commit_off(
    pg_db: SqlHarness,
) -> None:
    backend = PostgresBackend(pg_db.data_source, chain=True, synchronous_commit_off=True)
    # The first job's transaction begins as transaction() begins it; the next ones as the chain does.
    assert _shown_by_each_job(pg_db, backend, "synchronous_commit") == ["off", "off", "off"]


@pytest.mark.parametrize("options", [{"chain": True}, PIPELINE_CHAIN], ids=["chain", "pipelined-chain"])
def test_every_transaction_of_a_chain_keeps_the_isolation_level_its_connection_was_given(
    pg_db: SqlHarness, pg_dsn: str, options: dict[str, bool]
) -> None:
    # COMMIT AND CHAIN begins the next job's transaction as the finished one began, at the level the
    # connection's factory set; a plain BEGIN after COMMIT took the server's default from the second job on.
    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(pg_dsn)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        return conn

    backend = PostgresBackend(connect, **options)
    assert _shown_by_each_job(pg_db, backend, "transaction_isolation") == ["repeatable read"] * 3


@pytest.mark.parametrize(
    "options", [{"pipeline": True}, PIPELINE_CHAIN], ids=["pipelined-exact-plan", "pipelined-chain"]
)
def test_the_asyncio_pipeline_begins_at_the_isolation_level_its_connection_was_given(
    pg_db: SqlHarness, pg_dsn: str, options: dict[str, bool]
) -> None:
    # Its own BEGIN, queued with the claim, states the connection's level as psycopg's would; a chain keeps
    # it (COMMIT AND CHAIN). A plain BEGIN took the server's default.
    _enqueue(pg_db, 3)
    seen: list[str] = []

    async def handler(job_type: str, payload: Any) -> None:
        conn = await aio.current_job().connection()
        cursor = await conn.execute("SHOW transaction_isolation")
        row = await cursor.fetchone()
        seen.append(str(row[0]) if row else "")

    async def connect() -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(pg_dsn)
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await conn.set_read_only(False)
        return conn

    backend = AsyncPostgresBackend(connect, **options)
    asyncio.run(_adrain(pg_db, backend, handler, 1, lambda: not pg_db.jobs()))
    assert seen == ["repeatable read"] * 3


class _ServerBefore12:
    """A connection as the chain reads it, of a PostgreSQL 11 server, given an isolation level."""

    isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    read_only = None
    deferrable = None

    class info:  # noqa: N801 (psycopg's attribute)
        server_version = 110022


class _AsyncpgServerBefore12:
    """An AsyncpgSession as the chain reads it, of a PostgreSQL 11 server: no transaction characteristics."""

    class info:  # noqa: N801 (psycopg's attribute, the session's own)
        server_version = 110022


def test_asyncpgs_chain_on_a_server_before_postgresql_12_gets_commit_and_a_plain_begin() -> None:
    backend = PostgresBackend(lambda: None, chain=True)
    assert backend._chain_commit_statements(_AsyncpgServerBefore12(), None, False) == ("COMMIT; BEGIN",)


def test_a_server_before_postgresql_12_gets_commit_and_a_begin_stating_the_connections_level() -> None:
    backend = PostgresBackend(lambda: None, chain=True, synchronous_commit_off=True)
    setting = sql.queries("postgresql")["synchronous_commit_off"]
    begin = "BEGIN ISOLATION LEVEL SERIALIZABLE"
    assert backend._chain_commit_statements(_ServerBefore12(), None, False) == (
        f"COMMIT; {begin}; {setting}",
    )
    assert backend._chain_commit_statements(_ServerBefore12(), None, True) == ("COMMIT", begin, setting)


def _async_backend(driver: str, dsn: str, name: str) -> Any:
    if driver == "asyncpg":
        return AsyncpgBackend(
            functools.partial(asyncpg.connect, dsn, server_settings={"application_name": name}),
            compact=True,
            chain=True,
        )
    return AsyncPostgresBackend(
        functools.partial(psycopg.AsyncConnection.connect, dsn, application_name=name),
        compact=True,
        chain=True,
        pipeline=driver == "psycopg-pipeline",
    )


@pytest.mark.parametrize("batch_size", [1, BATCH])
@pytest.mark.parametrize("driver", ["psycopg", "psycopg-pipeline", "asyncpg"])
def test_an_asyncio_chained_worker_runs_every_job_once_and_leaves_no_transaction_open(
    pg_db: SqlHarness, pg_dsn: str, driver: str, batch_size: int
) -> None:
    job_ids = _enqueue(pg_db, JOBS)
    name = f"achain-{uuid.uuid4().hex[:12]}"
    ran: list[Any] = []

    async def handler(job_type: str, payload: Any) -> None:
        ran.append(payload)

    async def main() -> None:
        backend = _async_backend(driver, pg_dsn, name)
        worker = aio.create_queue_worker(
            None,
            handler,
            backend=backend,
            worker_threads=3,
            polling_interval_ms=200,
            batch_size=batch_size,
            **pg_db.table_options,
        )
        try:
            await worker.start()
            deadline = time.monotonic() + WITHIN_S
            while pg_db.jobs() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            # Read from a thread: the event loop must go on running the worker's transactions meanwhile.
            assert await asyncio.to_thread(_all_idle_at_some_moment, pg_db, name)
            await worker.stop()
        finally:
            await backend.close()

    asyncio.run(main())
    assert len(ran) == JOBS
    _archived_once(pg_db, job_ids)


def test_chain_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="chain must be True or False"):
        PostgresBackend(lambda: None, chain=1)  # type: ignore[arg-type]


def test_a_sql_backend_without_chained_claims_refuses_chain() -> None:
    # chain=True on a SqlBackend whose dialect has no ChainedClaim would be a promise the worker ignores.
    class Plain(SqlBackend):
        dialect = "postgresql"

    with pytest.raises(ConfigurationError, match=r"Plain has no chained claims: chain=True is refused"):
        Plain(None, chain=True)
    assert Plain(None).chained_claims is False


def test_a_backend_without_chain_is_not_chained() -> None:
    # The worker chains only on chained_claims True: the default is Proletarian's transaction a poll.
    assert PostgresBackend(None).chained_claims is False
    assert AsyncPostgresBackend(None).chained_claims is False
    assert AsyncPostgresBackend(None, chain=True).chained_claims is True


class _AsyncCountingExchanges(AsyncPostgresBackend):
    """The asyncio backend's exchanges on its pipelined connections, each the statements it sent, in
    order; and the statements it ran outside them."""

    exchanges: list[list[str]]
    statements: list[str]

    async def _execute(self, conn: Any, statement: str, params: Any, read: Any) -> Any:
        self.statements.append(statement)
        return await super()._execute(conn, statement, params, read)

    async def _exchange(self, conn: Any, commands: list[Command]) -> None:
        self.exchanges.append([command.statement for command in commands])
        await super()._exchange(conn, commands)


class _AsyncArchivesNothingChecked(AsyncPostgresBackend):
    """_ArchivesNothingChecked on the asyncio backend: its checked archive archives no row."""

    async def _queue_write(
        self, conn: Any, pending: Any, statement: str, params: Any, what: str, job_id: Any
    ) -> None:
        if what in CHECKED:
            assert "FROM moved\n" in statement
            statement = statement.replace("FROM moved\n", "FROM moved WHERE false\n", 1)
        await super()._queue_write(conn, pending, statement, params, what, job_id)


class _AsyncArchivesNothingUnchecked(_AsyncArchivesNothingChecked):
    """The same, and the server's check taken out."""

    async def _queue_write(
        self, conn: Any, pending: Any, statement: str, params: Any, what: str, job_id: Any
    ) -> None:
        if what in CHECKED:
            select = "SELECT %s, %s FROM archived" if what == CHECKED[1] else "SELECT 1 FROM archived"
            statement = statement[: statement.index("SELECT CAST(CASE")] + select
        await super()._queue_write(conn, pending, statement, params, what, job_id)


def _async_pipeline_chain(cls: type[_AsyncT], dsn: str) -> _AsyncT:
    return cls(functools.partial(psycopg.AsyncConnection.connect, dsn), **PIPELINE_CHAIN)


_AsyncT = TypeVar("_AsyncT", bound=AsyncPostgresBackend)


async def _adrain(db: SqlHarness, backend: Any, handler: Any, batch_size: int, until: Any) -> None:
    await drain_asyncio(db, backend, handler, batch_size=batch_size, until=until, timeout=WITHIN_S)


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_an_asyncio_chained_pipeline_sends_a_finished_archive_with_the_next_claim_in_one_exchange(
    pg_db: SqlHarness, pg_dsn: str, batch_size: int
) -> None:
    job_ids = _enqueue(pg_db, JOBS)
    backend = _async_pipeline_chain(_AsyncCountingExchanges, pg_dsn)
    backend.statements, backend.exchanges = [], []

    async def handler(job_type: str, payload: Any) -> None:
        return None

    asyncio.run(_adrain(pg_db, backend, handler, batch_size, lambda: not pg_db.jobs()))
    _archived_once(pg_db, job_ids)
    sent = [statement for exchange in backend.exchanges for statement in exchange]
    archives = [statement for statement in sent + backend.statements if "INSERT INTO" in statement]
    if batch_size == 1:
        checked = PostgresBackend(pg_db.data_source)._render(CHECKED[0], *_tables(pg_db))
    else:
        checked = sql.render_ids("postgresql", CHECKED[1], *_tables(pg_db), batch_size)
    assert archives == [checked] * (JOBS // batch_size)
    # The first claim goes with its BEGIN; then each archive with COMMIT AND CHAIN and the next claim, one
    # exchange a job (or batch), none settled on its own.
    claim = backend.exchanges[0][-1]
    assert "FOR UPDATE SKIP LOCKED" in claim
    claimed = JOBS // batch_size
    assert backend.exchanges[0] == ["BEGIN", claim]
    assert backend.exchanges[1 : 1 + claimed] == [[checked, "COMMIT AND CHAIN", claim]] * claimed


def test_an_asyncio_chained_pipelines_close_leaves_no_socket_of_its_own_open(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    job_ids = _enqueue(pg_db, JOBS)
    backend = _async_pipeline_chain(AsyncPostgresBackend, pg_dsn)

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def handler(job_type: str, payload: Any) -> None:
        return None

    async def main() -> tuple[int, int]:
        # Counted on the running loop, whose watches would keep a session's socket number open: _adrain
        # closes the backend, its connections and each exchange session's own number for their sockets.
        before = open_fds()
        await _adrain(pg_db, backend, handler, 1, lambda: not pg_db.jobs())
        return before, open_fds()

    before, after = asyncio.run(main())
    _archived_once(pg_db, job_ids)
    assert after == before


@pytest.mark.parametrize("batch_size", [1, BATCH])
@pytest.mark.parametrize("checked", [True, False], ids=["server-checked", "check-taken-out"])
def test_an_asyncio_chained_pipelines_archive_that_changes_no_row_rolls_back_its_commit_and_keeps_the_jobs(
    pg_db: SqlHarness, pg_dsn: str, checked: bool, batch_size: int, caplog: pytest.LogCaptureFixture
) -> None:
    job_ids = _enqueue(pg_db, batch_size)
    cls = _AsyncArchivesNothingChecked if checked else _AsyncArchivesNothingUnchecked
    backend = _async_pipeline_chain(cls, pg_dsn)
    ran: list[Any] = []
    refused = _refused(batch_size)

    async def handler(job_type: str, payload: Any) -> None:
        ran.append(payload)

    def over() -> bool:
        return refused in caplog.text or not pg_db.jobs()

    asyncio.run(_adrain(pg_db, backend, handler, batch_size, over))
    # Each job ran; a refused batch may run again before the worker stops, its jobs still queued.
    assert sorted({payload["n"] for payload in ran}) == list(range(batch_size))
    _kept_or_lost(pg_db, job_ids, caplog.text, checked=checked, batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_an_asyncio_chained_pipelines_refused_count_is_reported_as_the_clients_check_words_it(
    pg_db: SqlHarness, pg_dsn: str, batch_size: int
) -> None:
    _enqueue(pg_db, batch_size)
    queued = pg_db.jobs()
    queue = queued[0].queue
    job_table, archived = _tables(pg_db)
    backend = _async_pipeline_chain(_AsyncArchivesNothingChecked, pg_dsn)
    now = datetime.now(UTC) + timedelta(minutes=1)
    refused = rf"^{re.escape(_refused(batch_size))} \("

    async def main() -> None:
        try:
            with pytest.raises(DatabaseError, match=refused):
                async with backend.transaction() as conn:
                    tables = (job_table, archived)
                    await aclaim_finish_and_chain(backend, conn, tables, queue, now, batch_size)
        finally:
            await backend.close()

    asyncio.run(main())
    assert pg_db.jobs() == queued


def test_an_asyncio_pipelined_transaction_counts_a_queued_write_before_its_commit(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    # A chain's last archive (the worker stops, or the claim after it finds nothing) is not sent with a
    # claim: the transaction settles it, its count checked by the client, before COMMIT.
    _enqueue(pg_db, 1)
    queued = pg_db.jobs()
    job_table, archived = _tables(pg_db)
    backend = _async_pipeline_chain(_AsyncCountingExchanges, pg_dsn)
    backend.statements, backend.exchanges = [], []
    now = datetime.now(UTC) + timedelta(minutes=1)
    checked = PostgresBackend(pg_db.data_source)._render(CHECKED[0], job_table, archived)

    async def main() -> None:
        try:
            async with backend.transaction() as conn:
                record = await backend.get_next_job(conn, job_table, queued[0].queue, now)
                assert record is not None
                await backend.archive_and_delete_job(
                    conn, job_table, archived, record.job_id, ":success", now
                )
                assert len(backend.exchanges) == 1
            # Settled in an exchange of its own before the COMMIT.
            assert backend.exchanges[1:] == [[checked]]
            # A job whose archive changes no row (archived already, by this same transaction): refused.
            with pytest.raises(DatabaseError, match="archive_and_delete_job changed 0 rows"):
                async with backend.transaction() as conn:
                    await backend.archive_and_delete_job(
                        conn, job_table, archived, record.job_id, ":success", now
                    )
        finally:
            await backend.close()

    asyncio.run(main())
    assert pg_db.jobs() == [] and len(pg_db.archived_jobs()) == 1
