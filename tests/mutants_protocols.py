"""Broken backends of the optional protocols (batch claim, enqueue_many, release, notifications, chain)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Final

from proletarian_ref import sql
from proletarian_ref.backend import JobRecord
from proletarian_ref.backends.memory import MemoryBackend, MemoryConnection, MemoryListener
from proletarian_ref.backends.mysql import MySQLBackend
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.errors import DatabaseError
from proletarian_ref.tables import TableName, table_name

# The one channel PgOneChannelForEveryTable announces on and listens to, whatever the job table.
_ANY_TABLE: Final = table_name("conformance_any_table")

# -- batch claim (BatchClaim) ----------------------------------------------------------------------------


class PgOneSavepointPerBatch(PostgresBackend):
    """Batch mode's savepoint is set once, at the batch's first failure, and every later job's error rolls
    back to it: an earlier failed job's retry is undone with the later job's writes."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **options)
        self._savepoint_set: set[int] = set()

    def _begin(self, conn: Any) -> Any:
        self._savepoint_set.discard(id(conn))
        return super()._begin(conn)

    @contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        statements = sql.queries(self.dialect)
        if id(conn) not in self._savepoint_set:
            self._savepoint_set.add(id(conn))
            self._execute(conn, statements["job_savepoint"], None, _ignore)
        try:
            yield
        except BaseException:
            self._execute(conn, statements["job_savepoint_rollback"], None, _ignore)
            raise


class MemoryOneSavepointPerBatch(MemoryBackend):
    """The in-memory savepoint of the batch's first failure, which every later job's error restores."""

    @contextmanager
    def savepoint(self, conn: MemoryConnection) -> Iterator[None]:
        with self.db.lock:
            if not hasattr(conn, "batch_savepoint"):
                conn.batch_savepoint = {t: dict(c) for t, c in conn._changes.items()}  # type: ignore[attr-defined]
        try:
            yield
        except BaseException:
            with self.db.lock:
                saved = conn.batch_savepoint  # type: ignore[attr-defined]
                conn._changes = {t: dict(c) for t, c in saved.items()}
            raise


class MemoryBatchClaimOverLimit(MemoryBackend):
    """get_next_jobs claims one job more than its limit."""

    def get_next_jobs(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        return super().get_next_jobs(conn, job_table, queue, now, limit + 1)


class MemoryBatchClaimInInsertOrder(MemoryBackend):
    """get_next_jobs claims the first due free jobs in insertion order, not the oldest process_at."""

    def get_next_jobs(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        table = str(job_table)
        jobs: list[JobRecord] = []
        with self.db.lock:
            for key, job in self.db.tables.get(table, {}).items():
                if len(jobs) == limit:
                    break
                free = self.db.row_locks.get((table, key), conn) is conn
                if job.queue == queue and job.process_at <= now and free:
                    conn._lock_row(table, key)
                    jobs.append(job)
        return jobs


# -- enqueue_many (BatchEnqueue, StreamEnqueue) ----------------------------------------------------------


class PgCopyUnescaped(PostgresBackend):
    """Writes enqueue_many's COPY rows as plain text, tab-separated, without COPY's escapes."""

    def _copy(self, cursor: Any, statement: str, rows: Iterable[tuple[Any, ...]]) -> None:
        with cursor.copy(statement) as copy:
            for row in rows:
                copy.write("\t".join(str(value) for value in row) + "\n")


class MySQLChunksWithoutSavepoint(MySQLBackend):
    """enqueue_many's statements of one batch run without their savepoint: a failed later statement leaves
    the earlier ones in the caller's transaction."""

    def _all_or_none(self, conn: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


# -- release_connection -----------------------------------------------------------------------------------


class PgReleasesNothing(PostgresBackend):
    """release_connection does nothing: a stuck handler keeps its job's transaction open after stop()."""

    def release_connection(self, thread_id: int) -> bool:
        return False


class PgReleasesAnotherThread(PostgresBackend):
    """release_connection releases the transaction of another thread of the backend, when there is one."""

    def release_connection(self, thread_id: int) -> bool:
        with self._lock:
            others = [n for n, lease in self._leases.items() if n != thread_id and not lease.released]
        return super().release_connection(others[0] if others else thread_id)


class PgEndsNoTimedOutTransaction(PostgresBackend):
    """end_transaction does nothing: a job past job_timeout_ms keeps its transaction as its handler runs."""

    def end_transaction(self, thread_id: int) -> bool:
        return False


class MySQLEndsNoTimedOutTransaction(MySQLBackend):
    """end_transaction does nothing: a job past job_timeout_ms keeps its transaction as its handler runs."""

    def end_transaction(self, thread_id: int) -> bool:
        return False


# -- notifications (Notifications) ------------------------------------------------------------------------


class PgOneChannelForEveryTable(PostgresBackend):
    """Announces and listens on one channel whatever the job table: a table's listeners wake for another's."""

    def notify_enqueued(self, conn: Any, job_table: TableName, queues: Sequence[str]) -> None:
        super().notify_enqueued(conn, _ANY_TABLE, queues)

    def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> Any:
        return super().listen(_ANY_TABLE, queue, data_source)


class _QuietWhenBroken:
    """A listener whose wait answers False instead of raising when its connection is gone."""

    def __init__(self, listener: Any) -> None:
        self._listener = listener

    def __getattr__(self, name: str) -> Any:
        return getattr(self._listener, name)

    def wait(self, timeout: float) -> bool:
        try:
            return bool(self._listener.wait(timeout))
        except DatabaseError:
            return False


class PgListenerQuietWhenBroken(PostgresBackend):
    """A listener whose session died answers every wait with False: its worker never listens anew."""

    def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> Any:
        return _QuietWhenBroken(super().listen(job_table, queue, data_source))


class MemoryListenerQuietWhenKilled(MemoryBackend):
    """The in-memory listener answers False once killed, instead of raising."""

    def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> MemoryListener:
        listener: MemoryListener = _QuietWhenBroken(super().listen(job_table, queue, data_source))  # type: ignore[assignment]
        return listener


def _ignore(cursor: Any) -> None:
    return None


# -- chained claims (ChainedClaim): PostgresBackend(chain=True) wrong in one way each ------------------------


class _PgChained(PostgresBackend):
    """PostgresBackend with chained claims whatever it is given: a harness makes its backend plain."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "chain": True})


class PgChainWithoutCommit(_PgChained):
    """commit_and_get_next_job claims the next job in the same transaction: nothing commits until the
    chain ends, and a later job's rollback undoes the earlier ones."""

    def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        return self.get_next_job(conn, job_table, queue, now)


class PgChainRollsBack(_PgChained):
    """commit_and_get_next_job sends ROLLBACK where COMMIT belongs: the finished job's archive is undone."""

    def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        self._execute(conn, "ROLLBACK; BEGIN", None, _ignore)
        return self.get_next_job(conn, job_table, queue, now)


class PgChainClaimsBeforeCommit(_PgChained):
    """commit_and_get_next_job claims the next job before its COMMIT: the commit ends that lock at once,
    and the next job's handler runs with no row lock."""

    def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        record = self.get_next_job(conn, job_table, queue, now)
        self._execute(conn, "COMMIT; BEGIN", None, _ignore)
        return record


class PgBatchChainWithoutCommit(_PgChained):
    """commit_and_get_next_jobs claims the next batch in the same transaction: nothing commits until the
    chain ends, and a later batch's rollback undoes the earlier ones."""

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        return self.get_next_jobs(conn, job_table, queue, now, limit)


class PgBatchChainRollsBack(_PgChained):
    """commit_and_get_next_jobs sends ROLLBACK where COMMIT belongs: the batch's archive is undone."""

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        self._execute(conn, "ROLLBACK; BEGIN", None, _ignore)
        return self.get_next_jobs(conn, job_table, queue, now, limit)


class PgBatchChainOverLimit(_PgChained):
    """commit_and_get_next_jobs claims one job more than its limit: chained batches grow past batch_size."""

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        return super().commit_and_get_next_jobs(conn, job_table, queue, now, limit + 1)


class PgBatchChainClaimsBeforeCommit(_PgChained):
    """commit_and_get_next_jobs claims the next batch before its COMMIT: the commit ends those locks at
    once, and the batch's handlers run with no row lock."""

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        records = self.get_next_jobs(conn, job_table, queue, now, limit)
        self._execute(conn, "COMMIT; BEGIN", None, _ignore)
        return records


# -- chained claims on MySQL: MySQLBackend(compact=True, chain=True) wrong in one way each -------------------


class _MySQLChained(MySQLBackend):
    """MySQLBackend on the compact plan with chained claims whatever it is given; its harness
    (conformance.builtin:mysql_chain) opens connections with CLIENT.MULTI_STATEMENTS, which both need."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "compact": True, "chain": True})


class MySQLChainWithoutCommit(_MySQLChained):
    """commit_and_get_next_job claims the next job in the same transaction: nothing commits until the chain
    ends, and a later job's rollback undoes the earlier ones."""

    def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        return self.get_next_job(conn, job_table, queue, now)


class MySQLChainClaimsBeforeCommit(_MySQLChained):
    """commit_and_get_next_job claims the next job before its COMMIT: the commit ends that lock at once."""

    def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        record = self.get_next_job(conn, job_table, queue, now)
        self._execute(conn, "COMMIT", None, _ignore)
        return record


class MySQLChainDropsKeptBackWrite(_MySQLChained):
    """A finished job's (or batch's) archive and delete, kept back for the next chained query, are dropped
    when the transaction ends without one (the worker stopping): the job stays queued and runs again."""

    def _send_deferred(self, conn: Any, lease: Any) -> None:
        lease.deferred = None


class MySQLBatchChainWithoutCommit(_MySQLChained):
    """commit_and_get_next_jobs claims the next batch in the same transaction: nothing commits until the
    chain ends, and a later batch's rollback undoes the earlier ones."""

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        return self.get_next_jobs(conn, job_table, queue, now, limit)


class _MySQLBoundRewritten(_MySQLChained):
    """The chained plan, whose claims are bounded (queries.sql, claim_bounded), with one piece of the
    bounded claims' text replaced."""

    old: str
    new: str

    def _claim_statement(self, conn: Any, name: str, job_table: TableName) -> str:
        return rewrite_bound(type(self), super()._claim_statement(conn, name, job_table))


def rewrite_bound(mutant: type[Any], text: str) -> str:
    """`text`, a bounded claim, with `mutant.old` replaced by `mutant.new`."""
    # A claim that is not bounded, or a rewrite that no longer matches, would leave the mutant a lie.
    assert "FORCE INDEX" in text, f"{mutant.__name__}: the claim is not bounded: {text}"
    assert mutant.old in text, f"{mutant.__name__}: {mutant.old!r} is not in the claim {text}"
    return text.replace(mutant.old, mutant.new)


# The bounded claims' three faults, each as (old, new): the bound one second past the oldest due job; the
# bound read with a lock, which waits for the rows other transactions hold; the newest due job as the bound.
BOUND_PAST_THE_OLDEST: Final = ("SELECT process_at FROM", "SELECT process_at + INTERVAL 1 SECOND FROM")
BOUND_LOCKS: Final = ("ASC LIMIT 1)", "ASC LIMIT 1 FOR UPDATE)")
BOUND_AT_THE_NEWEST: Final = ("ORDER BY process_at ASC LIMIT 1)", "ORDER BY process_at DESC LIMIT 1)")


class MySQLBoundPastTheOldest(_MySQLBoundRewritten):
    old, new = BOUND_PAST_THE_OLDEST


class MySQLBoundLocks(_MySQLBoundRewritten):
    old, new = BOUND_LOCKS


class MySQLBoundAtTheNewest(_MySQLBoundRewritten):
    old, new = BOUND_AT_THE_NEWEST


class MySQLBatchChainOverLimit(_MySQLChained):
    """commit_and_get_next_jobs claims one job more than its limit: chained batches grow past batch_size."""

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        return super().commit_and_get_next_jobs(conn, job_table, queue, now, limit + 1)
