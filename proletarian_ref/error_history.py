"""Error history: each failed attempt's error in an optional side table, written with the retry or archive."""

from __future__ import annotations

import inspect
import socket
import threading
import traceback as tb
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Final, NamedTuple, Protocol

from proletarian_ref import log as ev
from proletarian_ref import side_tables
from proletarian_ref.tables import TableName

FEATURE: Final = "errors"
# Bounds of one job's history (docs/errors.md): longer text is cut to these many characters, ending in
# TRUNCATED, and only the newest KEEP_ATTEMPTS rows of a job stay.
MAX_MESSAGE: Final = 2000
MAX_TRACEBACK: Final = 16000
KEEP_ATTEMPTS: Final = 20
TRUNCATED: Final = "... [truncated]"
_HOST: Final = socket.gethostname()


class ErrorEntry(NamedTuple):
    """One failed attempt as stored (job_id in its database form, failed_at aware UTC)."""

    job_id: Any
    attempt: int
    error_type: str
    message: str
    traceback: str
    queue_worker_id: str
    host: str
    thread: str
    failed_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "error_type": self.error_type,
            "message": self.message,
            "traceback": self.traceback,
            "queue_worker_id": self.queue_worker_id,
            "host": self.host,
            "thread": self.thread,
            "failed_at": self.failed_at.isoformat(),
        }


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(TRUNCATED)] + TRUNCATED


def entry(
    stored_job_id: Any,
    attempt: int,
    exception: BaseException,
    failed_at: datetime,
    context: Mapping[str, Any],
) -> ErrorEntry:
    """The row of one failure: the exception's type, message and traceback (bounded) and who failed it."""
    kind = type(exception)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    thread = context.get(ev.WORKER_THREAD_ID)
    return ErrorEntry(
        job_id=stored_job_id,
        attempt=attempt,
        error_type=_cut(name, 255),
        message=_cut(str(exception), MAX_MESSAGE),
        traceback=_cut("".join(tb.format_exception(exception)), MAX_TRACEBACK),
        queue_worker_id=_cut(str(context.get(ev.QUEUE_WORKER_ID) or ""), 255),
        host=_cut(_HOST, 255),
        thread="" if thread is None else str(thread),
        failed_at=failed_at,
    )


class ErrorStore(Protocol):
    """The side table's writes, each in the caller's transaction: a failed attempt's row on the worker's
    connection in the job's transaction; the purged archive rows' history in the purge's batch."""

    def record(self, conn: Any, row: ErrorEntry) -> None: ...

    def purge(self, conn: Any, job_ids: list[Any]) -> None: ...


class AsyncErrorStore(Protocol):
    """ErrorStore's worker side, awaited (the asyncio worker's)."""

    async def record(self, conn: Any, row: ErrorEntry) -> None: ...


def _params(dialect: str, row: ErrorEntry) -> dict[str, Any]:
    return {**row._asdict(), "failed_at": side_tables.db_time(dialect, row.failed_at)}


def history_of(rows: list[tuple[Any, ...]], job_id: Any) -> list[ErrorEntry]:
    """The entries of the `history` statement's rows."""
    return [
        ErrorEntry(job_id, int(r[0]), r[1], r[2], r[3], r[4], r[5], r[6], side_tables.from_db_time(r[7]))
        for r in rows
    ]


class SqlErrorStore(side_tables.SqlStore):
    """ErrorStore over sql/<dialect>/errors.sql: insert the row, then drop the job's rows past the kept."""

    feature = FEATURE

    def record(self, conn: Any, row: ErrorEntry) -> None:
        self._run(conn, "insert", _params(self.dialect, row), side_tables.count)
        past = self._run(conn, "oldest_kept", {"job_id": row.job_id, "keep": KEEP_ATTEMPTS}, side_tables.rows)
        if past:
            self._run(conn, "trim", {"job_id": row.job_id, "error_id": past[0][0]}, side_tables.count)

    def history(self, conn: Any, job_id: Any) -> list[ErrorEntry]:
        return history_of(self._run(conn, "history", {"job_id": job_id}, side_tables.rows), job_id)

    def purge(self, conn: Any, job_ids: list[Any]) -> None:
        # MySQL's `IN %(job_ids)s` takes a tuple, PostgreSQL's `= ANY(%(job_ids)s)` a list.
        ids = tuple(job_ids) if self.dialect == "mysql" else list(job_ids)
        self._run(conn, "purge_batch", {"job_ids": ids}, side_tables.count)


class AsyncSqlErrorStore:
    """SqlErrorStore on an asyncio backend's connection (its `_execute`, awaited)."""

    def __init__(self, backend: Any, job_table: TableName) -> None:
        self.backend = backend
        self.dialect: str = backend.dialect
        self.job_table = job_table

    async def _run(
        self, conn: Any, name: str, params: dict[str, Any], read: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        sql_text = side_tables.statement(self.dialect, FEATURE, name, self.job_table)
        return await self.backend._execute(conn, sql_text, params, read)

    async def record(self, conn: Any, row: ErrorEntry) -> None:
        await self._run(conn, "insert", _params(self.dialect, row), _arowcount)
        past = await self._run(conn, "oldest_kept", {"job_id": row.job_id, "keep": KEEP_ATTEMPTS}, _afetchall)
        if past:
            await self._run(conn, "trim", {"job_id": row.job_id, "error_id": past[0][0]}, _arowcount)

    async def exists(self, conn: Any) -> bool:
        table = side_tables.side_table(self.job_table, FEATURE)
        found = await self._run(conn, "table_exists", {"table": str(table)}, _afetchall)
        return bool(found and found[0][0])


async def _arowcount(cursor: Any) -> int:
    return int(cursor.rowcount)


async def _afetchall(cursor: Any) -> list[Any]:
    return list(await cursor.fetchall())


class MemoryErrorStore:
    """The in-memory twin of the side table, the executable specification: a job's rows are one row of
    the MemoryDatabase under the side table's name, written in the job's transaction, gone on rollback."""

    def __init__(self, backend: Any, job_table: TableName) -> None:
        self.backend = backend
        self.db = backend.db
        self.table = str(side_tables.side_table(job_table, FEATURE))

    def record(self, conn: Any, row: ErrorEntry) -> None:
        with self.db.lock:
            conn.check_alive()
            conn._lock_row(self.table, row.job_id)
            kept = (*(conn._get(self.table, row.job_id) or ()), row)
            conn._write(self.table, row.job_id, kept[-KEEP_ATTEMPTS:])

    def history(self, conn: Any, job_id: Any) -> list[ErrorEntry]:
        with self.db.lock:
            return list(conn._get(self.table, job_id) or ())

    def purge(self, conn: Any, job_ids: list[Any]) -> None:
        from proletarian_ref.backends.memory import _DELETED

        with self.db.lock:
            conn.check_alive()
            for job_id in job_ids:
                if conn._get(self.table, job_id) is not None:
                    conn._lock_row(self.table, job_id)
                    conn._write(self.table, job_id, _DELETED)


def find_store(backend: Any, conn: Any, job_table: TableName) -> ErrorStore | None:
    """The backend's store for `job_table`'s error history, or None when the side table is not there.

    The lookup is one read of the catalog (PostgreSQL's to_regclass, MySQL's information_schema), which
    cannot fail the transaction it runs in. A backend may bring its own store class as `error_store` (a
    fork; the conformance suite's mutants).
    """
    chosen = side_tables.store_class(backend, "error_store", MemoryErrorStore, SqlErrorStore)
    execute: Any = getattr(backend, "_execute", None)
    if chosen is SqlErrorStore and execute is None:
        # A backend of its own (a third party's, on its driver's paramstyle) has no statement runner of
        # ours: its failures go unrecorded, as without the table, rather than failing on our SQL.
        return None
    if chosen is SqlErrorStore and inspect.iscoroutinefunction(inspect.unwrap(execute)):
        return None  # an asyncio backend behind a blocking bridge: no statement of ours runs on it
    if chosen is SqlErrorStore and not side_tables.exists(backend, conn, FEATURE, job_table):
        return None
    store: ErrorStore = chosen(backend, job_table)
    return store


async def afind_store(backend: Any, conn: Any, job_table: TableName) -> AsyncErrorStore | None:
    """find_store for an asyncio backend: PostgreSQL's, or one with the same awaited `_execute`."""
    own = getattr(backend, "error_store", None)
    if own is not None:
        store: AsyncErrorStore = own(backend, job_table)
        return store
    if backend.dialect != "postgresql" or not callable(getattr(backend, "_execute", None)):
        return None  # a backend this module cannot run statements on: no history, as without the table
    found = AsyncSqlErrorStore(backend, job_table)
    return found if await found.exists(conn) else None


class ErrorHistory:
    """Where one worker's failures go: the side table's store, or None, found once and kept.

    Found at the worker's first failed job, inside that job's transaction, on the connection that writes
    the failure: never on the caller's thread, never on a connection or transaction of its own, and never
    for a job that succeeds. The answer is shared by the worker's threads (or tasks) and kept for the
    worker's life (docs/errors.md, "Found once, at the worker's first failure"). A lookup that raises is
    not kept: it fails that job's writes as any of their statements would, and the next failure looks
    again.
    """

    __slots__ = ("_found", "_lock", "_store")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found = False
        self._store: Any = None

    def _keep(self, store: Any) -> Any:
        # Threads whose first failures come together may each look; the first answer kept is everyone's.
        with self._lock:
            if not self._found:
                self._found, self._store = True, store
            return self._store

    def store_in(self, backend: Any, conn: Any, job_table: TableName) -> ErrorStore | None:
        """The store, looked up on `conn` (the failed job's transaction) the first time only."""
        if self._found:
            found: ErrorStore | None = self._store
            return found
        kept: ErrorStore | None = self._keep(find_store(backend, conn, job_table))
        return kept

    async def astore_in(self, backend: Any, conn: Any, job_table: TableName) -> AsyncErrorStore | None:
        """store_in, awaited (the asyncio worker's)."""
        if self._found:
            found: AsyncErrorStore | None = self._store
            return found
        kept: AsyncErrorStore | None = self._keep(await afind_store(backend, conn, job_table))
        return kept
