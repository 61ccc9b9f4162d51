"""Deliberately broken asyncio backends, each wrong in one way, and the suite tests that must catch each."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from mutants import Mutant, MySQLClaimWithoutSkipLocked, _rewrite
from mutants_protocols import BOUND_AT_THE_NEWEST, BOUND_LOCKS, BOUND_PAST_THE_OLDEST, rewrite_bound

from proletarian_ref import side_tables
from proletarian_ref._async.unique_claims import AsyncSqlUniqueStore
from proletarian_ref.backend import JobRecord
from proletarian_ref.backends._aio_dbapi import _nothing
from proletarian_ref.backends.mysql import _ISOLATION_SQL
from proletarian_ref.backends.mysql_async import AsyncMySQLBackend
from proletarian_ref.backends.postgres_async import AsyncPostgresBackend
from proletarian_ref.tables import TableName


class AsyncCommitBeforeHandler(AsyncPostgresBackend):
    """Commits the claim at once, so the row lock is gone while the handler runs."""

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        job = await super().get_next_job(conn, job_table, queue, now)
        await conn.commit()
        return job


class AsyncClaimWithoutSkipLocked(AsyncPostgresBackend):
    """Claims with FOR UPDATE alone (its codec's statement rewritten): a second worker waits for the first."""

    def __init__(self, data_source: Any = None, *, compact: bool = False) -> None:
        super().__init__(data_source, compact=compact)
        self.codec = _rewrite("get_next_job", "FOR UPDATE SKIP LOCKED", "FOR UPDATE")(None)


class AsyncArchiveWithoutDelete(AsyncPostgresBackend):
    """Archives, but never deletes: the job stays queued after it finished."""

    async def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        return None


class AsyncSavepointKeepsWrites(AsyncPostgresBackend):
    """Batch mode's savepoint does nothing: a failed job whose failed_job_fn raises keeps its archive."""

    @contextlib.asynccontextmanager
    async def savepoint(self, conn: Any) -> AsyncIterator[None]:
        yield


class AsyncNeverCommits(AsyncPostgresBackend):
    """The transaction rolls back where it should commit: no job is ever archived or retried."""

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with super().transaction() as conn:
            yield conn
            await conn.rollback()


class AsyncHandlerWritesCommitEarly(AsyncPostgresBackend):
    """The job's savepoint commits the transaction when it is released: a handler's writes (and its
    follow-up jobs) commit before, and apart from, the job's archive row."""

    @contextlib.asynccontextmanager
    async def savepoint(self, conn: Any) -> AsyncIterator[None]:
        async with super().savepoint(conn):
            yield
        await conn.commit()


class AsyncChainRollsBack(AsyncPostgresBackend):
    """Chained claims whose commit_and_get_next_job sends ROLLBACK where COMMIT belongs: the finished job's
    archive is undone and it runs again."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "chain": True})

    async def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        await self._execute(conn, "ROLLBACK; BEGIN", None, _nothing)
        return await self.get_next_job(conn, job_table, queue, now)


class AsyncBatchChainRollsBack(AsyncPostgresBackend):
    """Chained batches whose commit_and_get_next_jobs sends ROLLBACK where COMMIT belongs: the finished
    batch's archive is undone and its jobs run again."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "chain": True})

    async def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        await self._execute(conn, "ROLLBACK; BEGIN", None, _nothing)
        return await self.get_next_jobs(conn, job_table, queue, now, limit)


POSTGRESQL_ASYNC_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "aio_commit_before_handler",
        "the async claim commits at once, so the handler runs without the row lock",
        AsyncCommitBeforeHandler,
        ("S5", "P1"),
    ),
    Mutant(
        "aio_claim_without_skip_locked",
        "the async claim locks without SKIP LOCKED: a second worker waits for the first",
        AsyncClaimWithoutSkipLocked,
        ("S5", "S6"),
    ),
    Mutant(
        "aio_archive_without_delete",
        "the async delete_job does nothing",
        AsyncArchiveWithoutDelete,
        ("A3", "D1", "P1"),
    ),
    Mutant(
        "aio_batch_savepoint_keeps_writes",
        "the async savepoint rolls nothing back, so a failed job's undone writes commit",
        AsyncSavepointKeepsWrites,
        ("T3",),
        batch_size=8,
    ),
    Mutant(
        "aio_handler_writes_commit_early",
        "the async job's savepoint commits at its release: a handler's writes commit apart from its archive",
        AsyncHandlerWritesCommitEarly,
        ("H1",),
        fault=("write", "committed"),
    ),
    Mutant(
        "aio_handler_savepoint_keeps_writes",
        "the async job's savepoint rolls nothing back: a failed handler's writes commit with its failure",
        AsyncSavepointKeepsWrites,
        ("H2",),
        fault=("savepoint",),
    ),
    Mutant(
        "aio_never_commits",
        "the async transaction rolls back at its end: nothing a job wrote stays",
        AsyncNeverCommits,
        ("A1", "P1"),
    ),
    Mutant(
        "aio_chain_rolls_back",
        "the async commit_and_get_next_job sends ROLLBACK where COMMIT belongs: the archive is undone",
        AsyncChainRollsBack,
        ("J1", "J2", "J3"),
    ),
    Mutant(
        "aio_batch_chain_rolls_back",
        "the async commit_and_get_next_jobs sends ROLLBACK, not COMMIT: the batch's archive is undone",
        AsyncBatchChainRollsBack,
        ("J5", "J6"),
    ),
)


def _on_asyncpg(mutant: Mutant) -> Mutant:
    """The same mistake on AsyncpgBackend: the mutant's override first, then asyncpg's connections."""
    from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend

    backend_class = type(
        f"Asyncpg{mutant.backend_class.__name__}", (mutant.backend_class, AsyncpgBackend), {}
    )
    return dataclasses.replace(mutant, name=f"asyncpg_{mutant.name}", backend_class=backend_class)


# Not the claim without SKIP LOCKED: its rewritten codec is psycopg's, whose times asyncpg does not bind.
ASYNCPG_MUTANTS: tuple[Mutant, ...] = tuple(
    _on_asyncpg(mutant)
    for mutant in POSTGRESQL_ASYNC_MUTANTS
    if mutant.name != "aio_claim_without_skip_locked"
)


# -- MySQL (aiomysql): the same kinds of fault, and MySQL's own: sessions, zones, isolation, reconnects ----


async def _run_on(conn: Any, statement: str) -> None:
    async with conn.cursor() as cursor:
        await cursor.execute(statement)


class AsyncMySQLCommitBeforeHandler(AsyncMySQLBackend):
    """Commits the claim at once, so the row lock is gone while the handler runs."""

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        job = await super().get_next_job(conn, job_table, queue, now)
        await conn.commit()
        return job


class AsyncMySQLClaimWithoutSkipLocked(AsyncMySQLBackend):
    """Claims with FOR UPDATE alone (the threaded mutant as codec): a second worker waits for the first."""

    def __init__(self, data_source: Any = None, *, compact: bool = False) -> None:
        super().__init__(data_source, compact=compact)
        self.codec = MySQLClaimWithoutSkipLocked(None)


class AsyncMySQLArchiveWithoutDelete(AsyncMySQLBackend):
    """Archives, but never deletes: the job stays queued after it finished."""

    async def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        return None


class AsyncMySQLCompactArchiveOnly(AsyncMySQLBackend):
    """On the compact plan, sends the archive INSERT alone: the finished job stays queued."""

    def __init__(self, data_source: Any = None, *, compact: bool = True) -> None:
        super().__init__(data_source, compact=compact)

    async def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        await self.archive_job(conn, job_table, archived_job_table, job_id, status, finished_at)


class AsyncMySQLRepeatableRead(AsyncMySQLBackend):
    """Runs its own transactions at InnoDB's default REPEATABLE READ: claims take gap locks."""

    async def _begin(self, conn: Any) -> bool:
        state = await super()._begin(conn)
        await _run_on(conn, _ISOLATION_SQL.replace("READ COMMITTED", "REPEATABLE READ"))
        return state


class AsyncMySQLWorkerSessionZone(AsyncMySQLBackend):
    """Leaves its own sessions in the connection's time zone: TIMESTAMP values are read and written there."""

    async def _begin(self, conn: Any) -> bool:
        was_autocommit = bool(conn.get_autocommit())
        await _run_on(conn, _ISOLATION_SQL)
        if was_autocommit:
            await conn.autocommit(False)
        return was_autocommit


class AsyncMySQLCallerTimeZone(AsyncMySQLBackend):
    """Sets the caller's session time zone before its INSERT and leaves it so."""

    async def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        await _run_on(conn, "SET time_zone = '+00:00'")
        return await super().enqueue(conn, job_table, job)


class AsyncMySQLEnqueueInAutocommit(AsyncMySQLBackend):
    """Inserts in autocommit mode and turns it off again: SET autocommit = 1 commits what was pending."""

    async def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        was = conn.get_autocommit()
        await conn.autocommit(True)
        try:
            return await super().enqueue(conn, job_table, job)
        finally:
            await conn.autocommit(was)


class AsyncMySQLSilentReconnect(AsyncMySQLBackend):
    """Pings with reconnect=True before each statement and the commit: a killed session goes on in a
    fresh one, outside the claim's transaction."""

    async def _execute(self, conn: Any, statement: str, params: Any, read: Any) -> Any:
        await conn.ping(reconnect=True)
        return await super()._execute(conn, statement, params, read)


class AsyncMySQLTruncatesOversizedPayloads(AsyncMySQLBackend):
    """Checks no payload size and cuts a payload to the TEXT column's 65,535 bytes."""

    async def check_payload(self, *args: Any) -> None:
        return None

    async def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        cut = job.payload.encode("utf-8")[:65_535].decode("utf-8", "ignore")
        return await super().enqueue(conn, job_table, job._replace(payload=cut))


MYSQL_ASYNC_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "aio_mysql_commit_before_handler",
        "the async claim commits at once, so the handler runs without the row lock",
        AsyncMySQLCommitBeforeHandler,
        ("S5", "P1"),
    ),
    Mutant(
        "aio_mysql_claim_without_skip_locked",
        "the async claim locks without SKIP LOCKED: a second worker waits for the first",
        AsyncMySQLClaimWithoutSkipLocked,
        ("S5", "S6"),
    ),
    Mutant(
        "aio_mysql_archive_without_delete",
        "the async delete_job does nothing",
        AsyncMySQLArchiveWithoutDelete,
        ("A3", "D1", "P1"),
    ),
    Mutant(
        "aio_mysql_compact_archive_only",
        "the compact plan's query archives but does not delete",
        AsyncMySQLCompactArchiveOnly,
        ("A3", "P1"),
    ),
    Mutant(
        "aio_mysql_repeatable_read",
        "its transactions run at InnoDB's default REPEATABLE READ: claims take gap locks",
        AsyncMySQLRepeatableRead,
        ("I1", "I2"),
    ),
    Mutant(
        "aio_mysql_worker_session_zone",
        "its own sessions keep the connection's time zone for TIMESTAMP values",
        AsyncMySQLWorkerSessionZone,
        ("Z1",),
    ),
    Mutant(
        "aio_mysql_caller_time_zone",
        "async enqueue sets the caller's time_zone",
        AsyncMySQLCallerTimeZone,
        ("C4",),
    ),
    Mutant(
        "aio_mysql_enqueue_in_autocommit",
        "the async INSERT runs in autocommit: SET autocommit = 1 commits the caller's writes, then the job",
        AsyncMySQLEnqueueInAutocommit,
        ("E7", "C1"),
    ),
    Mutant(
        "aio_mysql_silent_reconnect",
        "ping(reconnect=True) before each statement: a killed session goes on in a fresh one",
        AsyncMySQLSilentReconnect,
        ("K1",),
    ),
    Mutant(
        "aio_mysql_truncates_oversized_payloads",
        "a payload over the TEXT column's 65,535 bytes is cut to fit",
        AsyncMySQLTruncatesOversizedPayloads,
        ("B1",),
    ),
)


# -- MySQL's chained plan on aiomysql: the threaded chain's five faults (mutants.MYSQL_CHAIN_MUTANTS) ------


class _AsyncMySQLChained(AsyncMySQLBackend):
    """AsyncMySQLBackend on the compact plan with chained claims whatever it is given."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "compact": True, "chain": True})


class AsyncMySQLChainWithoutCommit(_AsyncMySQLChained):
    """commit_and_get_next_job claims the next job in the same transaction: nothing commits until the chain
    ends, and a later job's rollback undoes the earlier ones."""

    async def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        return await self.get_next_job(conn, job_table, queue, now)


class AsyncMySQLChainClaimsBeforeCommit(_AsyncMySQLChained):
    """commit_and_get_next_job claims the next job before its COMMIT: the commit ends that lock at once."""

    async def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        record = await self.get_next_job(conn, job_table, queue, now)
        await self._execute(conn, "COMMIT", None, _nothing)
        return record


class AsyncMySQLChainDropsKeptBackWrite(_AsyncMySQLChained):
    """A finished job's (or batch's) archive and delete, kept back for the next chained query, are dropped
    when the transaction ends without one (the worker stopping): the job stays queued and runs again."""

    async def _settle(self, conn: Any, pending: list[tuple[Any, str, Any]]) -> None:
        pending.clear()


class AsyncMySQLBatchChainWithoutCommit(_AsyncMySQLChained):
    """commit_and_get_next_jobs claims the next batch in the same transaction."""

    async def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        return await self.get_next_jobs(conn, job_table, queue, now, limit)


class AsyncMySQLBatchChainOverLimit(_AsyncMySQLChained):
    """commit_and_get_next_jobs claims one job more than its limit: chained batches grow past batch_size."""

    async def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        return await super().commit_and_get_next_jobs(conn, job_table, queue, now, limit + 1)


class _AsyncMySQLBoundRewritten(_AsyncMySQLChained):
    """The async chained plan with one piece of its bounded claims replaced (as _MySQLBoundRewritten)."""

    old: str
    new: str

    async def _claim_statement(self, conn: Any, name: str, job_table: TableName) -> str:
        return rewrite_bound(type(self), await super()._claim_statement(conn, name, job_table))


class AsyncMySQLBoundPastTheOldest(_AsyncMySQLBoundRewritten):
    old, new = BOUND_PAST_THE_OLDEST


class AsyncMySQLBoundLocks(_AsyncMySQLBoundRewritten):
    old, new = BOUND_LOCKS


class AsyncMySQLBoundAtTheNewest(_AsyncMySQLBoundRewritten):
    old, new = BOUND_AT_THE_NEWEST


# Run on conformance.aio_bridge:mysql_async_chain's tables.
MYSQL_ASYNC_CHAIN_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "aio_mysql_chain_without_commit",
        "async MySQL: commit_and_get_next_job claims in the same transaction, nothing commits until the end",
        AsyncMySQLChainWithoutCommit,
        ("J1", "J2", "J3"),
    ),
    Mutant(
        "aio_mysql_chain_claims_before_commit",
        "async MySQL: commit_and_get_next_job claims before its COMMIT, which ends the next job's row lock",
        AsyncMySQLChainClaimsBeforeCommit,
        ("J2",),
    ),
    Mutant(
        "aio_mysql_chain_drops_kept_back_write",
        "async MySQL: a finished job's kept-back archive and delete are dropped when the worker stops",
        AsyncMySQLChainDropsKeptBackWrite,
        ("J4", "J7"),
    ),
    Mutant(
        "aio_mysql_batch_chain_without_commit",
        "async MySQL: commit_and_get_next_jobs claims in the same transaction, nothing commits until the end",
        AsyncMySQLBatchChainWithoutCommit,
        ("J5", "J6"),
    ),
    Mutant(
        "aio_mysql_batch_chain_over_limit",
        "async MySQL: commit_and_get_next_jobs claims one job more than its limit, outgrowing batch_size",
        AsyncMySQLBatchChainOverLimit,
        ("J5", "J6"),
    ),
    Mutant(
        "aio_mysql_bound_past_the_oldest",
        "async MySQL: the bounded claim's scan starts one second past the oldest due job",
        AsyncMySQLBoundPastTheOldest,
        ("S1",),
    ),
    Mutant(
        "aio_mysql_bound_locks",
        "async MySQL: the bounded claim reads its bound with a lock, which waits for other workers' rows",
        AsyncMySQLBoundLocks,
        ("S6",),
    ),
    Mutant(
        "aio_mysql_bound_at_the_newest",
        "async MySQL: the bounded claim's scan starts at the newest due job (DESC for ASC)",
        AsyncMySQLBoundAtTheNewest,
        ("S3",),
    ),
    Mutant(
        "aio_mysql_batch_bound_at_the_newest",
        "async MySQL: the bounded batch claim's scan starts at the newest due job (DESC for ASC)",
        AsyncMySQLBoundAtTheNewest,
        ("G1",),
        batch_size=8,
    ),
)


# -- unique keys through aio.enqueue (conformance/side_tables.py's U clauses on the bridge) ---------------


class _AsyncCheckThenInsertStore(AsyncSqlUniqueStore):
    """Reads the key's row without a lock, then writes it over whatever another transaction put there."""

    async def claim(self, conn: Any, key: str, job_id: Any, now: datetime) -> Any:
        table = side_tables.side_table(self.job_table, "unique")
        async with conn.cursor() as cursor:
            await cursor.execute(f"SELECT job_id FROM {table} WHERE unique_key = %s", (key,))
            row = await cursor.fetchone()
            if row is not None:
                return row[0]
            await cursor.execute(
                f"INSERT INTO {table} (unique_key, job_id, claimed_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (unique_key) DO UPDATE SET job_id = EXCLUDED.job_id",
                (key, job_id, self._time(now)),
            )
        return job_id


class AsyncUniqueCheckThenInsert(AsyncPostgresBackend):
    """aio.enqueue checks a unique key before its row is locked: two open enqueues of one key both insert."""

    unique_store = _AsyncCheckThenInsertStore


class _AsyncReleasedWhileRunningStore(AsyncSqlUniqueStore):
    async def holder_live(self, conn: Any, key: str, holder_id: Any, until: Any) -> bool:
        return await super().holder_live(conn, key, holder_id, "started")


class AsyncKeyReleasedWhileRunning(AsyncPostgresBackend):
    """aio.enqueue frees a key once its job is claimed, before the archive commits: a retry has a twin."""

    unique_store = _AsyncReleasedWhileRunningStore


POSTGRESQL_ASYNC_SIDE_TABLE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "aio_unique_check_then_insert",
        AsyncUniqueCheckThenInsert.__doc__ or "",
        AsyncUniqueCheckThenInsert,
        ("U3",),
    ),
    Mutant(
        "aio_key_released_while_running",
        AsyncKeyReleasedWhileRunning.__doc__ or "",
        AsyncKeyReleasedWhileRunning,
        ("U2",),
    ),
)


# -- asynchronous commit (conformance/synchronous_commit.py, W), on psycopg's asyncio API and asyncpg ------


class AsyncSynchronousCommitSessionWide(AsyncPostgresBackend):
    """The worker's SET is session-wide, not LOCAL: the connection stays off after the job's transaction."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "synchronous_commit_off": True})
        local = self._job_transaction_setting
        assert local is not None and "SET LOCAL " in local, "the mutant no longer matches the statement"
        self._job_transaction_setting = local.replace("SET LOCAL ", "SET ")


class AsyncSynchronousCommitNeverSet(AsyncPostgresBackend):
    """The option is taken but the SET LOCAL never sent: the job's transaction commits synchronously."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "synchronous_commit_off": True})
        self._job_transaction_setting = None


POSTGRESQL_ASYNC_SYNCHRONOUS_COMMIT_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "aio_synchronous_commit_session_wide",
        "the worker's SET synchronous_commit = off is session-wide, so it outlives the job's transaction",
        AsyncSynchronousCommitSessionWide,
        ("W3",),
        fault=("session SET", "after the job"),
    ),
    Mutant(
        "aio_synchronous_commit_never_set",
        "synchronous_commit_off=True is taken but the SET LOCAL is never sent",
        AsyncSynchronousCommitNeverSet,
        ("W2",),
        fault=("in the job's transaction",),
    ),
)
ASYNCPG_SYNCHRONOUS_COMMIT_MUTANTS: tuple[Mutant, ...] = tuple(
    _on_asyncpg(mutant) for mutant in POSTGRESQL_ASYNC_SYNCHRONOUS_COMMIT_MUTANTS
)
