"""The in-memory backend: an executable specification of the backend protocol, row locks included."""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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
        # The (queue, process_at) index of the seed, per job table: committed jobs in claim order, so a
        # claim does not scan the table. Entries are (process_at, sequence, job_id); the sequence keeps
        # ids, which need not be comparable, out of the comparison.
        self.due_index: dict[tuple[str, str], list[tuple[datetime, int, Any]]] = {}
        self._sequence = itertools.count()
        # Open listeners, each told of the (job table, queue) announcements of every commit, as LISTEN is.
        self.listeners: list[MemoryListener] = []

    def _put(self, table: str, key: Any, row: Any) -> None:
        """Commit one row (or _DELETED), keeping due_index in step; called with the lock held."""
        committed = self.tables.setdefault(table, {})
        old = committed.get(key)
        if isinstance(old, JobRecord):
            entries = self.due_index[(table, old.queue)]
            position = bisect.bisect_left(entries, (old.process_at,))
            while entries[position][2] != key:
                position += 1
            del entries[position]
        if row is _DELETED:
            committed.pop(key, None)
            return
        committed[key] = row
        if isinstance(row, JobRecord):
            entries = self.due_index.setdefault((table, row.queue), [])
            bisect.insort(entries, (row.process_at, next(self._sequence), key))

    def clear(self, *tables: str) -> None:
        with self.lock:
            for table in tables:
                self.tables.pop(table, None)
                for index_key in [k for k in self.due_index if k[0] == table]:
                    del self.due_index[index_key]

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
        # Set by kill(): the server ended this session, as pg_terminate_backend or MySQL's KILL would.
        self.killed = False
        self._changes: dict[str, dict[Any, Any]] = {}
        # notify_enqueued's announcements, sent at commit and dropped on rollback, as NOTIFY's are.
        self._announced: list[tuple[str, str]] = []

    def proletarian_backend(self) -> MemoryBackend:
        return MemoryBackend(self.db)

    # -- DB-API-like transaction control ---------------------------------------------------------------

    def commit(self) -> None:
        with self.db.lock:
            self.check_alive()
            for table, changes in self._changes.items():
                for key, row in changes.items():
                    self.db._put(table, key, row)
            announced, listeners = self._announced, list(self.db.listeners)
            self._release()
        for listener in listeners:
            listener.deliver(announced)

    def rollback(self) -> None:
        with self.db.lock:
            self._release()

    def close(self) -> None:
        self.rollback()
        self.closed = True

    def kill(self) -> None:
        """End the session from outside: its transaction rolls back and every later use fails."""
        with self.db.lock:
            self._release()
            self.killed = True

    def check_alive(self) -> None:
        """Raise, as a driver does on a session the server ended; called with db.lock held."""
        if self.killed:
            raise TransientDatabaseError("the session was killed; its transaction was rolled back")

    def _release(self) -> None:
        self._changes = {}
        self._announced = []
        for key in [k for k, owner in self.db.row_locks.items() if owner is self]:
            del self.db.row_locks[key]

    # -- reads and writes, called with db.lock held ----------------------------------------------------

    def _get(self, table: str, key: Any) -> Any:
        """The row this connection sees: its own change if any, else the committed row, else None."""
        row = self._changes.get(table, {}).get(key, self.db.tables.get(table, {}).get(key))
        return None if row is _DELETED else row

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
            conn.check_alive()
            job_id = job.job_id
            if job_id is None:
                job_id = 1 + max((k for k in self.db.tables.get(table, {}) if isinstance(k, int)), default=0)
                job = job._replace(job_id=job_id)
            if conn._get(table, job_id) is not None or (table, job_id) in self.db.row_locks:
                raise DatabaseError(f"duplicate key: job {job_id!r} already exists in {table}")
            conn._lock_row(table, job_id)
            conn._write(table, job_id, job)
        return job_id

    def enqueue_many(
        self, conn: MemoryConnection, job_table: TableName, jobs: Sequence[JobRecord]
    ) -> list[Any]:
        """(E) for a batch, as one statement: a duplicate id anywhere writes none of the jobs."""
        table = str(job_table)
        with self.db.lock:
            if jobs and jobs[0].job_id is None:
                first = 1 + max((k for k in self.db.tables.get(table, {}) if isinstance(k, int)), default=0)
                jobs = [job._replace(job_id=first + n) for n, job in enumerate(jobs)]
            seen: set[Any] = set()
            for job in jobs:
                job_id = job.job_id
                if (
                    job_id in seen
                    or conn._get(table, job_id) is not None
                    or (table, job_id) in self.db.row_locks
                ):
                    raise DatabaseError(f"duplicate key: job {job_id!r} already exists in {table}")
                seen.add(job_id)
            for job in jobs:
                conn._lock_row(table, job.job_id)
                conn._write(table, job.job_id, job)
        return [job.job_id for job in jobs]

    def get_next_job(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        jobs = self.get_next_jobs(conn, job_table, queue, now, 1)
        return jobs[0] if jobs else None

    def _locked_job(self, conn: MemoryConnection, table: str, job_id: Any) -> JobRecord:
        conn.check_alive()
        job = conn._get(table, job_id)
        if job is None:
            raise DatabaseError(f"job {job_id!r} is not in {table}")
        conn._lock_row(table, job_id)
        assert isinstance(job, JobRecord)
        return job

    def get_next_jobs(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        """(S) for batch mode: up to `limit` due jobs, oldest first, skipping rows other connections lock."""
        table = str(job_table)
        with self.db.lock:
            conn.check_alive()
            own = conn._changes.get(table, {})
            candidates: list[JobRecord] = [
                job
                for job in own.values()
                if job is not _DELETED and job.queue == queue and job.process_at <= now
            ]
            taken = 0
            for process_at, _, key in self.db.due_index.get((table, queue), ()):
                if process_at > now or taken == limit:
                    break
                if key not in own and self.db.row_locks.get((table, key), conn) is conn:
                    candidates.append(self.db.tables[table][key])
                    taken += 1
            jobs = sorted(candidates, key=lambda j: j.process_at)[:limit]
            for job in jobs:
                conn._lock_row(table, job.job_id)
            return jobs

    def _archive(
        self,
        conn: MemoryConnection,
        table: str,
        archive: str,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        """Archive every job of `job_ids` or, if one cannot be, none; called with db.lock held."""
        jobs = [self._locked_job(conn, table, job_id) for job_id in job_ids]
        for job in jobs:
            if conn._get(archive, job.job_id) is not None:
                raise DatabaseError(f"duplicate key: job {job.job_id!r} is already in {archive}")
        if len({job.job_id for job in jobs}) != len(jobs):
            raise DatabaseError(f"duplicate key: a job appears twice in the batch archived to {archive}")
        for job in jobs:
            conn._write(
                archive,
                job.job_id,
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

    def archive_job(
        self,
        conn: MemoryConnection,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        with self.db.lock:
            self._archive(conn, str(job_table), str(archived_job_table), (job_id,), status, finished_at)

    def archive_jobs(
        self,
        conn: MemoryConnection,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        """(A) for batch mode, as one statement: every job or, if one is missing, none."""
        with self.db.lock:
            self._archive(conn, str(job_table), str(archived_job_table), job_ids, status, finished_at)

    def delete_job(self, conn: MemoryConnection, job_table: TableName, job_id: Any) -> None:
        self.delete_jobs(conn, job_table, (job_id,))

    def delete_jobs(self, conn: MemoryConnection, job_table: TableName, job_ids: Sequence[Any]) -> None:
        """(D) for batch mode, as one statement: every job or, if one is missing, none."""
        table = str(job_table)
        with self.db.lock:
            for job_id in job_ids:
                self._locked_job(conn, table, job_id)
            if len(set(job_ids)) != len(job_ids):
                raise DatabaseError(f"a job appears twice in the batch deleted from {table}")
            for job_id in job_ids:
                conn._write(table, job_id, _DELETED)

    @contextmanager
    def savepoint(self, conn: MemoryConnection) -> Iterator[None]:
        """Batch mode's savepoint: an error in the block puts back the changes the connection had before."""
        with self.db.lock:
            saved = {table: dict(changes) for table, changes in conn._changes.items()}
        try:
            yield
        except BaseException:
            with self.db.lock:
                conn.check_alive()
                conn._changes = saved
            raise

    def retry_at(self, conn: MemoryConnection, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        table = str(job_table)
        with self.db.lock:
            job = self._locked_job(conn, table, job_id)
            conn._write(table, job_id, job._replace(process_at=retry_at, attempts=job.attempts + 1))

    def notify_enqueued(self, conn: MemoryConnection, job_table: TableName, queues: Sequence[str]) -> None:
        with self.db.lock:
            conn.check_alive()
            conn._announced.extend((str(job_table), queue) for queue in queues)
        if conn.autocommit:
            conn.commit()

    def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> MemoryListener:
        listener = MemoryListener(self.db, (str(job_table), queue))
        with self.db.lock:
            self.db.listeners.append(listener)
        return listener

    def close(self) -> None:
        return None


class MemoryListener:
    """The in-memory LISTEN: announcements of one (job table, queue) since the last wait."""

    def __init__(self, db: MemoryDatabase, key: tuple[str, str]) -> None:
        self._db = db
        self._key = key
        self._condition = threading.Condition()
        self._pending = False
        self._interrupted = False
        self.confirmed = True
        # Set by kill(), as pg_terminate_backend ends a listening session: every later wait raises.
        self.killed = False

    def deliver(self, announced: Sequence[tuple[str, str]]) -> None:
        if self._key in announced:
            with self._condition:
                self._pending = True
                self._condition.notify_all()

    def kill(self) -> None:
        with self._condition:
            self.killed = True
            self._condition.notify_all()

    def interrupt(self) -> None:
        with self._condition:
            self._interrupted = True
            self._condition.notify_all()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._condition:
            while not (self._pending or self.killed or self._interrupted):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._condition.wait(remaining)
            if self._interrupted:
                return False
            if self.killed:
                raise TransientDatabaseError("the listening session was killed")
            self._pending = False
            return True

    def close(self) -> None:
        with self._db.lock:
            if self in self._db.listeners:
                self._db.listeners.remove(self)
