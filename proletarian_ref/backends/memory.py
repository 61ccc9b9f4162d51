"""The in-memory backend: an executable specification of the backend protocol, row locks included."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any, ClassVar

from proletarian_ref.backend import ArchivedJobRecord, Capabilities, JobRecord
from proletarian_ref.errors import DatabaseError, TransientDatabaseError
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName


_DELETED = object()


class MemoryDatabase:
    """Committed tables and row locks shared by the connections of one process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tables: dict[str, dict[Any, Any]] = {}
        self.row_locks: dict[tuple[str, Any], MemoryConnection] = {}

    def connect(self, *, autocommit: bool = False) -> MemoryConnection:
        return MemoryConnection(self, autocommit=autocommit)

    def jobs(self, job_table: str = DEFAULT_JOB_TABLE) -> list[JobRecord]:
        """Committed rows of the job table."""
        with self.lock:
            return list(self.tables.get(job_table, {}).values())

    def archived_jobs(self, archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE) -> list[ArchivedJobRecord]:
        """Committed rows of the archived job table."""
        with self.lock:
            return list(self.tables.get(archived_job_table, {}).values())


class MemoryConnection:
    """A connection with its own uncommitted changes, visible to it alone until commit (READ COMMITTED)."""

    def __init__(self, db: MemoryDatabase, *, autocommit: bool = False) -> None:
        self.db = db
        self.autocommit = autocommit
        self.closed = False
        self._changes: dict[str, dict[Any, Any]] = {}

    def proletarian_backend(self) -> MemoryBackend:
        return MemoryBackend(self.db)

    # -- DB-API-like transaction control ---------------------------------------------------------------

    def commit(self) -> None:
        with self.db.lock:
            for table, changes in self._changes.items():
                committed = self.db.tables.setdefault(table, {})
                for key, row in changes.items():
                    if row is _DELETED:
                        committed.pop(key, None)
                    else:
                        committed[key] = row
            self._release()

    def rollback(self) -> None:
        with self.db.lock:
            self._release()

    def close(self) -> None:
        self.rollback()
        self.closed = True

    def _release(self) -> None:
        self._changes = {}
        for key in [k for k, owner in self.db.row_locks.items() if owner is self]:
            del self.db.row_locks[key]

    # -- reads and writes, called with db.lock held ----------------------------------------------------

    def _view(self, table: str) -> dict[Any, Any]:
        rows = dict(self.db.tables.get(table, {}))
        for key, row in self._changes.get(table, {}).items():
            if row is _DELETED:
                rows.pop(key, None)
            else:
                rows[key] = row
        return rows

    def _lock_row(self, table: str, key: Any) -> None:
        owner = self.db.row_locks.get((table, key))
        if owner is not None and owner is not self:
            # A real database would wait for the lock; the core never writes rows it has not locked.
            raise TransientDatabaseError(f"row {key!r} of {table} is locked by another transaction")
        self.db.row_locks[(table, key)] = self

    def _write(self, table: str, key: Any, row: Any) -> None:
        self._changes.setdefault(table, {})[key] = row
        if self.autocommit:
            self.db.lock.release()
            try:
                self.commit()
            finally:
                self.db.lock.acquire()


class MemoryBackend:
    """The backend protocol over a MemoryDatabase; passes the same conformance suite as the SQL backends."""

    dialect: ClassVar[str] = "memory"
    capabilities: ClassVar[Capabilities] = Capabilities(multi_process=False)

    def __init__(self, db: MemoryDatabase | None = None) -> None:
        self.db = db if db is not None else MemoryDatabase()

    def proletarian_backend(self) -> MemoryBackend:
        return self

    @contextmanager
    def transaction(self) -> Iterator[MemoryConnection]:
        conn = self.db.connect()
        try:
            yield conn
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    def enqueue(self, conn: MemoryConnection, job_table: TableName, job: JobRecord) -> Any:
        table = str(job_table)
        with self.db.lock:
            job_id = job.job_id
            if job_id is None:
                job_id = 1 + max((k for k in self.db.tables.get(table, {}) if isinstance(k, int)), default=0)
                job = replace(job, job_id=job_id)
            if job_id in conn._view(table) or (table, job_id) in self.db.row_locks:
                raise DatabaseError(f"duplicate key: job {job_id!r} already exists in {table}")
            conn._lock_row(table, job_id)
            conn._write(table, job_id, job)
        return job_id

    def get_next_job(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        table = str(job_table)
        with self.db.lock:
            due = [
                job
                for key, job in conn._view(table).items()
                if job.queue == queue
                and job.process_at <= now
                and self.db.row_locks.get((table, key), conn) is conn
            ]
            if not due:
                return None
            job = min(due, key=lambda j: j.process_at)
            conn._lock_row(table, job.job_id)
            return job

    def _locked_job(self, conn: MemoryConnection, table: str, job_id: Any) -> JobRecord:
        job = conn._view(table).get(job_id)
        if job is None:
            raise DatabaseError(f"job {job_id!r} is not in {table}")
        conn._lock_row(table, job_id)
        assert isinstance(job, JobRecord)
        return job

    def archive_job(
        self,
        conn: MemoryConnection,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        archive = str(archived_job_table)
        with self.db.lock:
            job = self._locked_job(conn, str(job_table), job_id)
            if job_id in conn._view(archive):
                raise DatabaseError(f"duplicate key: job {job_id!r} is already in {archive}")
            conn._write(
                archive,
                job_id,
                ArchivedJobRecord(
                    job_id=job.job_id,
                    queue=job.queue,
                    job_type=job.job_type,
                    payload=job.payload,
                    attempts=job.attempts + 1,
                    status=status,
                    enqueued_at=job.enqueued_at,
                    process_at=job.process_at,
                    finished_at=finished_at,
                ),
            )

    def delete_job(self, conn: MemoryConnection, job_table: TableName, job_id: Any) -> None:
        with self.db.lock:
            self._locked_job(conn, str(job_table), job_id)
            conn._write(str(job_table), job_id, _DELETED)

    def retry_at(self, conn: MemoryConnection, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        table = str(job_table)
        with self.db.lock:
            job = self._locked_job(conn, table, job_id)
            conn._write(table, job_id, replace(job, process_at=retry_at, attempts=job.attempts + 1))

    def close(self) -> None:
        return None
