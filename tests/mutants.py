"""Deliberately broken backends, each wrong in one way, and the suite tests that must catch each of them."""

from __future__ import annotations

import unicodedata
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

from proletarian_ref import side_tables, sql
from proletarian_ref._sync.unique_claims import SqlUniqueStore
from proletarian_ref.backend import JobRecord
from proletarian_ref.backends._dbapi import _fetchone
from proletarian_ref.backends.memory import MemoryBackend, MemoryConnection
from proletarian_ref.backends.mysql import MySQLBackend
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.error_history import ErrorEntry, MemoryErrorStore, SqlErrorStore
from proletarian_ref.errors import DatabaseError, TransientDatabaseError
from proletarian_ref.job import default_serializer
from proletarian_ref.periodic import Advance, MemoryPeriodicStore, SqlPeriodicStore, TickRow
from proletarian_ref.tables import TableName
from proletarian_ref.unique import MemoryUniqueStore


@dataclass(frozen=True, slots=True)
class Mutant:
    """A broken backend class and the clauses ("S5", "P1", ...) whose tests must fail against it."""

    name: str
    what: str
    backend_class: type[Any]
    killed_by: tuple[str, ...]
    # > 1: a batch-mode mutant, run against the harness with_worker_options(batch_size=...).
    batch_size: int = 1
    # Words that name the fault (the verb at fault, the column it gets wrong): the failure of each clause
    # of killed_by but the property ones (P1, P2, M1, whose reports list broken invariants) must say them.
    fault: tuple[str, ...] = ()


def in_mode(harness: Any, mutant: Mutant) -> Any:
    """`harness` (already under the mutant's backend class) in the worker mode the mutant is wrong in."""
    return harness.with_worker_options(batch_size=mutant.batch_size) if mutant.batch_size > 1 else harness


# -- PostgreSQL: one statement rewritten, or one method made wrong ----------------------------------------


class _Rewritten(PostgresBackend):
    """PostgresBackend with one piece of one named statement replaced."""

    statement: ClassVar[str]
    old: ClassVar[str]
    new: ClassVar[str]

    def _render(self, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
        text = super()._render(name, job_table, archived_job_table)
        if name != self.statement:
            return text
        # A rewrite that no longer matches the SQL would leave the backend correct and the mutant a lie.
        assert self.old in text, f"{type(self).__name__}: {self.old!r} is not in the {name} statement"
        return text.replace(self.old, self.new)


def _rewrite(statement: str, old: str, new: str) -> type[PostgresBackend]:
    return type(f"Rewritten_{statement}", (_Rewritten,), {"statement": statement, "old": old, "new": new})


class CommitBeforeHandler(PostgresBackend):
    """Commits the claim at once, so the row lock is gone while the handler runs."""

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        job = super().get_next_job(conn, job_table, queue, now)
        conn.commit()
        return job


class ClaimLocksTheNextRecord(PostgresBackend):
    """Also locks the first job of the next queue in index order, as InnoDB does to end its scan."""

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        job = super().get_next_job(conn, job_table, queue, now)
        with conn.cursor() as cursor:
            cursor.execute(
                f"SELECT job_id FROM {job_table} WHERE queue > %s ORDER BY queue, process_at LIMIT 1 "
                "FOR UPDATE SKIP LOCKED",
                (queue,),
            )
        return job


class ArchiveWithoutDelete(PostgresBackend):
    """Archives, but never deletes: the job stays queued after it finished."""

    def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        return None


class DeleteWithoutArchive(PostgresBackend):
    """Deletes, but never archives: finished jobs vanish without a trace."""

    def archive_job(self, conn: Any, job_table: TableName, archived_job_table: TableName, *args: Any) -> None:
        return None


class StatusWithoutColon(PostgresBackend):
    """Writes "success" / "failure" instead of Proletarian's keyword text ":success" / ":failure"."""

    def archive_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        super().archive_job(conn, job_table, archived_job_table, job_id, status.lstrip(":"), finished_at)


class EnqueueIgnoresProcessAt(PostgresBackend):
    """Stores every job as due at once, whatever process_at it was given."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        return super().enqueue(conn, job_table, job._replace(process_at=job.enqueued_at))


class ArchiveReencodesPayload(PostgresBackend):
    """Decodes and re-encodes the payload on the way to the archive instead of copying its text."""

    def archive_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        serializer = default_serializer()
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT payload FROM {job_table} WHERE job_id = %s", (job_id,))
            (text,) = cursor.fetchone()
            again = serializer.encode(serializer.decode(text))
            cursor.execute(f"UPDATE {job_table} SET payload = %s WHERE job_id = %s", (again, job_id))
        super().archive_job(conn, job_table, archived_job_table, job_id, status, finished_at)


class EnqueueCommits(PostgresBackend):
    """Commits the caller's transaction after the insert: enqueue is no longer part of it."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        job_id = super().enqueue(conn, job_table, job)
        conn.commit()
        return job_id


class EnqueueMangles(PostgresBackend):
    """Stores the payload as ASCII, replacing what does not fit (a column or connection in latin1 would)."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        text = job.payload.encode("ascii", "replace").decode("ascii")
        return super().enqueue(conn, job_table, job._replace(payload=text))


class Autocommit(PostgresBackend):
    """Runs the "transaction" in autocommit: every statement commits alone, a rollback undoes nothing."""

    def _begin(self, conn: Any) -> Any:
        state = super()._begin(conn)
        conn.autocommit = True
        return state


class NotifyOutsideTheTransaction(PostgresBackend):
    """Sends the wake-up NOTIFY on a connection of its own in autocommit: at once, and on rollback too."""

    def notify_enqueued(self, conn: Any, job_table: TableName, queues: Sequence[str]) -> None:
        own = self._data_source()
        try:
            own.autocommit = True
            super().notify_enqueued(own, job_table, queues)
        finally:
            own.close()


class AnnouncesAnyQueue(PostgresBackend):
    """Announces every job under one payload, so every listener of the table wakes for any queue."""

    def notify_enqueued(self, conn: Any, job_table: TableName, queues: Sequence[str]) -> None:
        super().notify_enqueued(conn, job_table, [":n1/anything"])

    def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> Any:
        return super().listen(job_table, ":n1/anything", data_source)


# -- in memory: the executable specification can drift too --------------------------------------------------


class MemoryAnnouncesAtOnce(MemoryBackend):
    """Tells the listeners at enqueue, before the transaction commits (and whether or not it does)."""

    def notify_enqueued(self, conn: MemoryConnection, job_table: TableName, queues: Sequence[str]) -> None:
        announced = [(str(job_table), queue) for queue in queues]
        with self.db.lock:
            listeners = list(self.db.listeners)
        for listener in listeners:
            listener.deliver(announced)


class MemoryClaimIgnoresLocks(MemoryBackend):
    """Claims the oldest due committed job even while another transaction holds it."""

    def get_next_job(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        with self.db.lock:
            due = [
                j
                for j in self.db.tables.get(str(job_table), {}).values()
                if j.queue == queue and j.process_at <= now
            ]
        return min(due, key=lambda j: j.process_at) if due else None


class MemoryClaimInInsertOrder(MemoryBackend):
    """Claims the first due job in insertion order, not the oldest process_at."""

    def get_next_job(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        table = str(job_table)
        with self.db.lock:
            for key, job in self.db.tables.get(table, {}).items():
                if job.queue == queue and job.process_at <= now and (table, key) not in self.db.row_locks:
                    conn._lock_row(table, key)
                    result: JobRecord = job
                    return result
        return None


class MemoryRollbackCommits(MemoryBackend):
    """Commits whatever the transaction did, even when it ends with an error."""

    @contextmanager
    def transaction(self) -> Iterator[MemoryConnection]:
        conn = self.db.connect()
        try:
            yield conn
        finally:
            conn.commit()


class PgSavepointKeepsWrites(PostgresBackend):
    """Batch mode's savepoint does nothing: a failed job whose failed_job_fn raises keeps its archive."""

    @contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        yield


class PgHandlerWritesCommitEarly(PostgresBackend):
    """The job's savepoint commits the transaction when it is released: a handler's writes (and its
    follow-up jobs) commit before, and apart from, the job's archive row."""

    @contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        with super().savepoint(conn):
            yield
        conn.commit()


class MemorySavepointKeepsWrites(MemoryBackend):
    """Batch mode's savepoint does nothing: a failed job whose failed_job_fn raises keeps its archive."""

    @contextmanager
    def savepoint(self, conn: MemoryConnection) -> Iterator[None]:
        yield


class MemoryArchivesTheWholeBatch(MemoryBackend):
    """archive_jobs archives every claimed job still in the table, a failed one rescheduled included."""

    def get_next_jobs(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        jobs = super().get_next_jobs(conn, job_table, queue, now, limit)
        conn.claimed = [job.job_id for job in jobs]  # type: ignore[attr-defined]
        return jobs

    def archive_jobs(
        self,
        conn: MemoryConnection,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        claimed = getattr(conn, "claimed", job_ids)
        with self.db.lock:
            still_queued = [job_id for job_id in claimed if conn._get(str(job_table), job_id) is not None]
        super().archive_jobs(conn, job_table, archived_job_table, still_queued, status, finished_at)


class PgCompactBatchArchivesNothing(PostgresBackend):
    """On the compact plan, a batch's combined write deletes its jobs but archives none and is not counted."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "compact": True})

    def archive_and_delete_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        statement = sql.render_ids(
            self.dialect, "archive_and_delete_jobs", job_table, archived_job_table, len(job_ids)
        )
        assert statement.endswith("FROM moved"), "the mutant no longer matches the statement"
        params = [*job_ids, status, self._db_time(finished_at)]
        self._execute(conn, statement + " WHERE false", params, _uncounted)


def _uncounted(cursor: Any) -> None:
    return None


# -- sessions, isolation, zones and payloads: PostgreSQL ------------------------------------------------


def _run_on(conn: Any, *statements: str) -> None:
    with conn.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


class PgRetriesOnANewConnection(PostgresBackend):
    """Retries a statement that failed on a lost connection on a fresh one, which commits on its own."""

    def _execute(self, conn: Any, statement: str, params: Any, read: Any, *, copy: bool = False) -> Any:
        try:
            return super()._execute(conn, statement, params, read, copy=copy)
        except TransientDatabaseError:
            fresh = self._data_source()
            try:
                with fresh.cursor() as cursor:
                    cursor.execute(statement, params)
                    result = read(cursor)
                fresh.commit()
                return result
            finally:
                fresh.close()


class _PgWorkerIsolation(PostgresBackend):
    """Runs its own transactions at `level` instead of PostgreSQL's default READ COMMITTED."""

    level: ClassVar[str]

    def _prepare_session(self, conn: Any, *, worker: bool = False) -> None:
        super()._prepare_session(conn, worker=worker)
        if worker:
            _run_on(conn, f"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {self.level}")
            conn.commit()


class PgRepeatableRead(_PgWorkerIsolation):
    level = "REPEATABLE READ"


class PgSerializable(_PgWorkerIsolation):
    level = "SERIALIZABLE"


class _PgCallerSetting(PostgresBackend):
    """Runs one SET on the caller's connection before its INSERT."""

    setting: ClassVar[str]

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        _run_on(conn, self.setting)
        return super().enqueue(conn, job_table, job)


class PgCallerTimeZone(_PgCallerSetting):
    setting = "SET TIME ZONE 'UTC'"


class PgCallerSearchPath(_PgCallerSetting):
    setting = "SET search_path = proletarian, public"


class PgEnqueueRollsBackOnError(PostgresBackend):
    """Rolls the caller's transaction back when its INSERT fails, as if the transaction were its own."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        try:
            return super().enqueue(conn, job_table, job)
        except DatabaseError:
            conn.rollback()
            raise


class PgEnqueueCommitsEarlierWrites(PostgresBackend):
    """Commits whatever the caller had pending before inserting, to start from a clean transaction."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        conn.commit()
        return super().enqueue(conn, job_table, job)


class PgNaiveTimes(PostgresBackend):
    """Sends times as UTC wall-clock text without an offset: the server reads them in the session's zone."""

    def _db_time(self, value: datetime, *, what: str = "time") -> Any:
        return value.astimezone(UTC).replace(tzinfo=None).isoformat()


class PgReadsWallClock(PostgresBackend):
    """Takes the wall-clock time the session's zone shows for UTC."""

    def _from_db_time(self, value: Any) -> datetime:
        stored: datetime = value
        return stored.replace(tzinfo=UTC)


class PgNormalizesUnicode(PostgresBackend):
    """Stores the payload text in Unicode normal form C."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        return super().enqueue(
            conn, job_table, job._replace(payload=unicodedata.normalize("NFC", job.payload))
        )


# -- MySQL: its isolation default, implicit commits, session state, zones, character sets, ids ----------


class MySQLSilentReconnect(MySQLBackend):
    """Pings with reconnect=True before each statement and the commit (PyMySQL's well-known idiom): a
    killed session is replaced by a fresh one, outside the claim's transaction."""

    def _execute(self, conn: Any, statement: str, params: Any, read: Any, *, copy: bool = False) -> Any:
        _ping_and_reconnect(conn)
        return super()._execute(conn, statement, params, read, copy=copy)

    def _commit(self, conn: Any, lease: Any) -> None:
        _ping_and_reconnect(conn)
        super()._commit(conn, lease)


def _ping_and_reconnect(conn: Any) -> None:
    with warnings.catch_warnings():
        # PyMySQL 1.1 deprecates the argument; plenty of code still passes it.
        warnings.simplefilter("ignore", DeprecationWarning)
        conn.ping(reconnect=True)


class _MySQLWorkerIsolation(MySQLBackend):
    """Runs its own transactions at `level` instead of READ COMMITTED."""

    level: ClassVar[str]

    def _prepare_session(self, conn: Any, *, worker: bool = False) -> None:
        super()._prepare_session(conn, worker=worker)
        if worker:
            _run_on(conn, f"SET SESSION TRANSACTION ISOLATION LEVEL {self.level}")


class MySQLRepeatableRead(_MySQLWorkerIsolation):
    level = "REPEATABLE READ"


class MySQLSerializable(_MySQLWorkerIsolation):
    level = "SERIALIZABLE"


class MySQLTwoStepClaimReadUncommitted(_MySQLWorkerIsolation):
    """Finds the oldest due job with a plain read, then locks it by id, at READ UNCOMMITTED."""

    level = "READ UNCOMMITTED"

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        find = self._render("get_next_job", job_table).replace("FOR UPDATE SKIP LOCKED", "")
        params = {"queue": queue, "now": self._db_time(now, what="now")}
        found = self._execute(conn, find, params, _fetchone)
        if found is None:
            return None
        lock = (
            "SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at "
            f"FROM {job_table} WHERE job_id = %(job_id)s FOR UPDATE SKIP LOCKED"
        )
        row = self._execute(conn, lock, {"job_id": found[0]}, _fetchone)
        return None if row is None else self._job_record(row)


class _MySQLCallerSetting(MySQLBackend):
    """Runs one SET on the caller's connection before its INSERT."""

    setting: ClassVar[str]

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        _run_on(conn, self.setting)
        return super().enqueue(conn, job_table, job)


class MySQLCallerTimeZone(_MySQLCallerSetting):
    setting = "SET time_zone = '+00:00'"


class MySQLCallerIsolation(_MySQLCallerSetting):
    setting = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"


class MySQLCallerSqlMode(_MySQLCallerSetting):
    setting = "SET SESSION sql_mode = 'TRADITIONAL'"


class MySQLCallerCollation(_MySQLCallerSetting):
    setting = "SET NAMES utf8mb4 COLLATE utf8mb4_bin"


class MySQLCallerUserVariable(_MySQLCallerSetting):
    setting = "SET @proletarian_enqueued_at = UTC_TIMESTAMP()"


class MySQLEnqueueEnsuresTheTable(MySQLBackend):
    """Runs CREATE TABLE IF NOT EXISTS before the INSERT: DDL commits the caller's open transaction."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        _run_on(conn, f"CREATE TABLE IF NOT EXISTS {job_table} (job_id BINARY(16) PRIMARY KEY)")
        return super().enqueue(conn, job_table, job)


class MySQLEnqueueInAutocommit(MySQLBackend):
    """Inserts in autocommit mode and turns it off again: SET autocommit = 1 commits what was pending."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        was = conn.get_autocommit()
        conn.autocommit(True)
        try:
            return super().enqueue(conn, job_table, job)
        finally:
            conn.autocommit(was)


class MySQLEnqueueRollsBackOnError(MySQLBackend):
    """Rolls the caller's transaction back when its INSERT fails."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        try:
            return super().enqueue(conn, job_table, job)
        except DatabaseError:
            conn.rollback()
            raise


class MySQLWorkerSessionZone(MySQLBackend):
    """Leaves its own sessions in the connection's time zone: TIMESTAMP values are read and written there."""

    def _prepare_session(self, conn: Any, *, worker: bool = False) -> None:
        if not worker:
            super()._prepare_session(conn, worker=worker)
            return
        _run_on(conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")


class MySQLTruncatesOversizedPayloads(MySQLBackend):
    """Checks no payload size and cuts a payload to the TEXT column's 65,535 bytes, as a server outside
    strict mode does."""

    def check_payload(self, *args: Any) -> None:
        return None

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        cut = job.payload.encode("utf-8")[:65_535].decode("utf-8", "ignore")
        return super().enqueue(conn, job_table, job._replace(payload=cut))


class MySQLWorkerSessionUtf8mb3(MySQLBackend):
    """Talks utf8mb3 on its own sessions: characters outside the BMP come back as '?'."""

    def _prepare_session(self, conn: Any, *, worker: bool = False) -> None:
        super()._prepare_session(conn, worker=worker)
        if worker:
            _run_on(conn, "SET NAMES utf8mb3")


class MySQLIdByteOrder(MySQLBackend):
    """Stores the UUID in BINARY(16) in Microsoft's little-endian field order (bytes_le)."""

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        swapped = uuid.UUID(bytes=bytes(job.job_id)).bytes_le
        super().enqueue(conn, job_table, job._replace(job_id=swapped))
        return job.job_id


class MySQLHandlerWritesCommitEarly(MySQLBackend):
    """PgHandlerWritesCommitEarly on MySQL: the savepoint's release commits the handler's writes alone."""

    @contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        with super().savepoint(conn):
            yield
        conn.commit()


class MySQLSavepointKeepsWrites(MySQLBackend):
    """The job's savepoint does nothing: a failed handler's writes commit with its failure or retry."""

    @contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        yield


class MySQLAutocommit(MySQLBackend):
    """Runs its "transactions" in autocommit: every statement commits alone."""

    def _begin(self, conn: Any) -> Any:
        state = super()._begin(conn)
        conn.autocommit(True)
        return state


class _MySQLRewritten(MySQLBackend):
    """MySQLBackend with one piece of one named statement replaced."""

    statement: ClassVar[str]
    old: ClassVar[str]
    new: ClassVar[str]

    def _render(self, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
        text = super()._render(name, job_table, archived_job_table)
        if name != self.statement:
            return text
        assert self.old in text, f"{type(self).__name__}: {self.old!r} is not in the {name} statement"
        return text.replace(self.old, self.new)


class MySQLClaimWithoutSkipLocked(_MySQLRewritten):
    statement, old, new = "get_next_job", "FOR UPDATE SKIP LOCKED", "FOR UPDATE"


class MySQLFinishedAtFromDatabase(_MySQLRewritten):
    statement, old, new = "archive_job", "%(finished_at)s", "UTC_TIMESTAMP()"


# -- in memory ---------------------------------------------------------------------------------------------


class _RevivingConnection(MemoryConnection):
    def check_alive(self) -> None:
        # A killed session is silently replaced by a fresh one: its transaction is gone, the work goes on.
        self.killed = False


class MemoryGoesOnAfterAKill(MemoryBackend):
    """Goes on in a fresh session when its own was killed, as a reconnecting driver does."""

    @contextmanager
    def transaction(self) -> Iterator[MemoryConnection]:
        conn = _RevivingConnection(self.db)
        try:
            yield conn
            conn.commit()
        except BaseException:
            conn.rollback()
            raise


class MemoryDirtyReads(MemoryBackend):
    """Claims jobs other transactions enqueued but have not committed yet (READ UNCOMMITTED)."""

    def enqueue(self, conn: MemoryConnection, job_table: TableName, job: JobRecord) -> Any:
        job_id = super().enqueue(conn, job_table, job)
        _ENQUEUERS.setdefault(id(self.db), []).append(conn)
        return job_id

    def get_next_job(
        self, conn: MemoryConnection, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        committed = super().get_next_job(conn, job_table, queue, now)
        with self.db.lock:
            # What other open transactions inserted and have neither committed nor rolled back.
            dirty = [
                job
                for other in _ENQUEUERS.get(id(self.db), [])
                if other is not conn
                for job in other._changes.get(str(job_table), {}).values()
                if isinstance(job, JobRecord) and job.queue == queue and job.process_at <= now
            ]
        candidates = dirty + ([committed] if committed is not None else [])
        return min(candidates, key=lambda j: j.process_at) if candidates else None


# The connections that enqueued on each in-memory database, for MemoryDirtyReads.
_ENQUEUERS: dict[int, list[MemoryConnection]] = {}


class MemoryEnqueueRollsBackOnError(MemoryBackend):
    """Rolls the caller's transaction back when the insert fails."""

    def enqueue(self, conn: MemoryConnection, job_table: TableName, job: JobRecord) -> Any:
        try:
            return super().enqueue(conn, job_table, job)
        except DatabaseError:
            conn.rollback()
            raise


class MemoryEnqueueCommitsEarlierWrites(MemoryBackend):
    """Commits what the caller had pending before inserting."""

    def enqueue(self, conn: MemoryConnection, job_table: TableName, job: JobRecord) -> Any:
        conn.commit()
        return super().enqueue(conn, job_table, job)


POSTGRESQL_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "pg_compact_batch_archives_nothing",
        "on the compact plan a batch's one archive-and-delete statement deletes its jobs, archives none "
        "and is not counted",
        PgCompactBatchArchivesNothing,
        ("L1", "P1"),
        batch_size=8,
    ),
    Mutant(
        "batch_savepoint_keeps_writes",
        "batch mode's savepoint rolls nothing back, so a failed job's undone writes commit",
        PgSavepointKeepsWrites,
        ("T3", "G3", "G4"),
        batch_size=8,
    ),
    Mutant(
        "pg_handler_writes_commit_early",
        "the job's savepoint commits at its release: a handler's writes commit apart from its archive row",
        PgHandlerWritesCommitEarly,
        ("H1",),
        fault=("write", "committed"),
    ),
    Mutant(
        "pg_handler_savepoint_keeps_writes",
        "the job's savepoint rolls nothing back: a failed handler's writes commit with its failure",
        PgSavepointKeepsWrites,
        ("H2",),
        fault=("savepoint",),
    ),
    Mutant(
        "notify_outside_the_transaction",
        "the wake-up NOTIFY goes out on its own autocommit connection: before the commit, and on rollback",
        NotifyOutsideTheTransaction,
        ("N1",),
    ),
    Mutant(
        "notify_for_any_queue",
        "one NOTIFY payload for every queue, so listeners of other queues wake too",
        AnnouncesAnyQueue,
        ("N1",),
    ),
    Mutant(
        "claim_without_for_update",
        "the claim reads the row without locking it",
        _rewrite("get_next_job", "FOR UPDATE SKIP LOCKED", ""),
        ("S5", "S6", "P1", "M1"),
    ),
    Mutant(
        "claim_without_skip_locked",
        "FOR UPDATE without SKIP LOCKED: a second worker waits for the first",
        _rewrite("get_next_job", "FOR UPDATE SKIP LOCKED", "FOR UPDATE"),
        ("S5", "S6", "M1"),
        fault=("claim", "lock"),
    ),
    Mutant(
        "commit_before_handler",
        "the claim commits at once, so the handler runs without the row lock",
        CommitBeforeHandler,
        ("S5", "S6", "P1", "M1"),
    ),
    Mutant(
        "claim_locks_the_next_record",
        "the claim also locks the next queue's first job (what InnoDB does; MySQL declares it)",
        ClaimLocksTheNextRecord,
        ("S7", "M1"),
    ),
    Mutant(
        "archive_without_delete", "delete_job does nothing", ArchiveWithoutDelete, ("A3", "D1", "P1", "M1")
    ),
    Mutant("delete_without_archive", "archive_job does nothing", DeleteWithoutArchive, ("A1", "A3", "P1")),
    Mutant(
        "status_without_colon",
        'status "success" / "failure" instead of ":success" / ":failure"',
        StatusWithoutColon,
        ("A3", "A4", "K1", "P1"),
        fault=("archive_job", "status"),
    ),
    Mutant(
        "claim_ignores_process_at",
        "the claim has no process_at <= now condition",
        _rewrite("get_next_job", " AND process_at <= %(now)s", ""),
        # Not P1: it sees this only if a worker polls before a future job is due, which a starved machine
        # can prevent (its clock runs 600 times real time); S2 sees it every time.
        ("S2",),
    ),
    Mutant(
        "claim_due_only_after_process_at",
        "process_at < now instead of <=: a job is not due at its process_at",
        _rewrite("get_next_job", "process_at <= %(now)s", "process_at < %(now)s"),
        ("S2",),
    ),
    Mutant(
        "enqueue_ignores_process_at",
        "enqueue stores every job as due now",
        EnqueueIgnoresProcessAt,
        ("E5", "P1", "M1"),
    ),
    Mutant(
        "retry_keeps_attempts",
        "retry_at never adds one to attempts",
        _rewrite("retry_at", ", attempts = attempts + 1", ""),
        ("R1", "R2", "P1"),
        fault=("retry_at", "attempts"),
    ),
    Mutant(
        "retry_keeps_process_at",
        "retry_at never moves process_at",
        _rewrite("retry_at", "process_at = %(retry_at)s, ", ""),
        ("R1", "R2", "P1"),
    ),
    Mutant(
        "archive_keeps_attempts",
        "the archive copies attempts without adding one",
        _rewrite("archive_job", "attempts + 1,", "attempts,"),
        ("A1", "A3", "P1"),
        fault=("archive_job", "attempts"),
    ),
    Mutant(
        "archive_loses_process_at",
        "the archive stores enqueued_at as process_at",
        _rewrite(
            "archive_job",
            "enqueued_at, process_at, %(finished_at)s",
            "enqueued_at, enqueued_at, %(finished_at)s",
        ),
        ("A1", "P1"),
    ),
    Mutant(
        "finished_at_from_database",
        "finished_at is the database's now(), not the worker's clock",
        _rewrite("archive_job", "%(finished_at)s", "now()"),
        ("A1", "A3"),
    ),
    Mutant(
        "claim_without_order_by",
        "the claim has no ORDER BY, and its queue test cannot use the index, so rows come in heap order",
        # Without the index test the planner could still pick the (queue, process_at) index after earlier
        # tests' churn and hand rows over in the right order by luck: a CI run saw that once.
        _rewrite(
            "get_next_job",
            "WHERE queue = %(queue)s AND process_at <= %(now)s\nORDER BY process_at ASC",
            "WHERE queue || '' = %(queue)s AND process_at <= %(now)s",
        ),
        ("S3",),
    ),
    Mutant(
        "claim_newest_first",
        "ORDER BY process_at DESC",
        _rewrite("get_next_job", "ORDER BY process_at ASC", "ORDER BY process_at DESC"),
        ("S3", "S6", "M1"),
    ),
    Mutant(
        "claim_ignores_queue",
        "the claim has no queue condition",
        _rewrite("get_next_job", "queue = %(queue)s AND ", ""),
        ("S4", "P1", "M1"),
    ),
    Mutant(
        "archive_reencodes_payload",
        "the archive decodes and re-encodes the payload",
        ArchiveReencodesPayload,
        ("A2",),
    ),
    Mutant(
        "enqueue_commits",
        "enqueue commits the caller's transaction",
        EnqueueCommits,
        ("E7", "I3", "M1"),
        fault=("enqueue", "commit"),
    ),
    Mutant(
        "enqueue_mangles_unicode",
        "the payload loses what ASCII cannot hold (as a latin1 column or connection would)",
        EnqueueMangles,
        ("E2", "P1", "M1"),
    ),
    Mutant(
        "enqueued_at_from_database",
        "enqueued_at is the database's now(), not the enqueuer's clock",
        _rewrite("enqueue", "%(enqueued_at)s", "now()"),
        ("E3", "P1", "M1"),
    ),
    Mutant(
        "autocommit",
        "no transaction: each statement commits alone",
        Autocommit,
        ("S5", "T2", "T3", "P1", "M1"),
    ),
    Mutant(
        "pg_retries_on_a_new_connection",
        "a statement that failed on a lost connection is retried on a fresh one, which commits it",
        PgRetriesOnANewConnection,
        ("K1",),
    ),
    Mutant(
        "pg_repeatable_read",
        "its transactions run at REPEATABLE READ: a claim keeps its transaction's first snapshot",
        PgRepeatableRead,
        ("I1",),
    ),
    Mutant("pg_serializable", "its transactions run at SERIALIZABLE", PgSerializable, ("I1",)),
    Mutant("pg_caller_time_zone", "enqueue sets the caller's TimeZone to UTC", PgCallerTimeZone, ("C4",)),
    Mutant("pg_caller_search_path", "enqueue sets the caller's search_path", PgCallerSearchPath, ("C4",)),
    Mutant(
        "pg_enqueue_rolls_back_on_error",
        "enqueue rolls the caller's transaction back when its INSERT fails",
        PgEnqueueRollsBackOnError,
        ("C3",),
    ),
    Mutant(
        "pg_enqueue_commits_earlier_writes",
        "enqueue commits the caller's pending writes before its INSERT",
        PgEnqueueCommitsEarlierWrites,
        ("C1",),
    ),
    Mutant(
        "pg_naive_times",
        "times are sent without an offset, so the server reads them in the session's zone",
        PgNaiveTimes,
        ("Z1",),
    ),
    Mutant(
        "pg_reads_wall_clock",
        "times read back are the session zone's wall clock taken as UTC",
        PgReadsWallClock,
        ("Z1",),
    ),
    Mutant(
        "pg_normalizes_unicode", "the payload text is stored in Unicode NFC", PgNormalizesUnicode, ("B2",)
    ),
)

MYSQL_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "mysql_silent_reconnect",
        "ping(reconnect=True) before each statement: a killed session goes on in a fresh one",
        MySQLSilentReconnect,
        ("K1",),
    ),
    Mutant(
        "mysql_repeatable_read",
        "its transactions run at InnoDB's default REPEATABLE READ: claims take gap locks",
        MySQLRepeatableRead,
        ("I1", "I2"),
    ),
    Mutant("mysql_serializable", "its transactions run at SERIALIZABLE", MySQLSerializable, ("I1", "I2")),
    Mutant(
        "mysql_two_step_claim_read_uncommitted",
        "the claim finds its job with a plain read at READ UNCOMMITTED, then locks it by id",
        MySQLTwoStepClaimReadUncommitted,
        ("I3",),
    ),
    Mutant("mysql_caller_time_zone", "enqueue sets the caller's time_zone", MySQLCallerTimeZone, ("C4",)),
    Mutant(
        "mysql_caller_isolation",
        "enqueue sets the caller's isolation level",
        MySQLCallerIsolation,
        ("C4",),
    ),
    Mutant("mysql_caller_sql_mode", "enqueue sets the caller's sql_mode", MySQLCallerSqlMode, ("C4",)),
    Mutant(
        "mysql_caller_collation",
        "enqueue sets the caller's character set and collation (SET NAMES)",
        MySQLCallerCollation,
        ("C4",),
    ),
    Mutant(
        "mysql_caller_user_variable",
        "enqueue leaves a user variable in the caller's session",
        MySQLCallerUserVariable,
        ("C4",),
    ),
    Mutant(
        "mysql_enqueue_ensures_the_table",
        "CREATE TABLE IF NOT EXISTS before the INSERT: an implicit commit of the caller's writes",
        MySQLEnqueueEnsuresTheTable,
        ("C1",),
    ),
    Mutant(
        "mysql_enqueue_in_autocommit",
        "the INSERT runs in autocommit: SET autocommit = 1 commits the caller's writes, then the job",
        MySQLEnqueueInAutocommit,
        ("E7", "C1"),
    ),
    Mutant(
        "mysql_enqueue_rolls_back_on_error",
        "enqueue rolls the caller's transaction back when its INSERT fails",
        MySQLEnqueueRollsBackOnError,
        ("C3",),
    ),
    Mutant(
        "mysql_worker_session_zone",
        "its own sessions keep the connection's time zone for TIMESTAMP values",
        MySQLWorkerSessionZone,
        ("Z1",),
    ),
    Mutant(
        "mysql_truncates_oversized_payloads",
        "a payload over the TEXT column's 65,535 bytes is cut to fit",
        MySQLTruncatesOversizedPayloads,
        ("B1",),
    ),
    Mutant(
        "mysql_worker_session_utf8mb3",
        "its own sessions talk utf8mb3: characters outside the BMP come back as '?'",
        MySQLWorkerSessionUtf8mb3,
        ("A2", "B2"),
    ),
    Mutant(
        "mysql_id_byte_order",
        "BINARY(16) ids stored in little-endian field order (uuid.bytes_le)",
        MySQLIdByteOrder,
        ("E6",),
    ),
    Mutant("mysql_autocommit", "no transaction: each statement commits alone", MySQLAutocommit, ("S5", "T2")),
    Mutant(
        "mysql_claim_without_skip_locked",
        "FOR UPDATE without SKIP LOCKED: a second worker waits for the first",
        MySQLClaimWithoutSkipLocked,
        ("S5", "S6"),
    ),
    Mutant(
        "mysql_finished_at_from_database",
        "finished_at is the server's UTC_TIMESTAMP(), not the worker's clock",
        MySQLFinishedAtFromDatabase,
        ("A1", "A3"),
    ),
    Mutant(
        "mysql_handler_writes_commit_early",
        "the job's savepoint commits at its release: a handler's writes commit apart from its archive row",
        MySQLHandlerWritesCommitEarly,
        ("H1",),
        fault=("write", "committed"),
    ),
    Mutant(
        "mysql_handler_savepoint_keeps_writes",
        "the job's savepoint rolls nothing back: a failed handler's writes commit with its failure",
        MySQLSavepointKeepsWrites,
        ("H2",),
        fault=("savepoint",),
    ),
)

MEMORY_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "memory_batch_savepoint_keeps_writes",
        "batch mode's in-memory savepoint rolls nothing back, so a failed job's undone writes commit",
        MemorySavepointKeepsWrites,
        ("T3", "G3", "G4"),
        batch_size=8,
    ),
    Mutant(
        "memory_batch_archives_every_claimed_job",
        "batch mode's archive_jobs also archives the batch's failed jobs that were rescheduled",
        MemoryArchivesTheWholeBatch,
        ("P1",),
        batch_size=8,
    ),
    Mutant(
        "memory_announces_at_once",
        "the in-memory wake-up announcement goes out before the commit, and on rollback",
        MemoryAnnouncesAtOnce,
        ("N1",),
    ),
    Mutant(
        "memory_claim_ignores_locks",
        "the in-memory claim ignores row locks",
        MemoryClaimIgnoresLocks,
        ("S5", "S6", "P1", "M1"),
    ),
    Mutant(
        "memory_claim_in_insert_order",
        "the in-memory claim takes jobs in insertion order",
        MemoryClaimInInsertOrder,
        ("S3", "M1"),
    ),
    Mutant(
        "memory_rollback_commits",
        "the in-memory transaction commits even on error",
        MemoryRollbackCommits,
        ("T2", "T3", "M1"),
    ),
    Mutant(
        "memory_goes_on_after_a_kill",
        "a killed in-memory session is replaced by a fresh one and the work goes on",
        MemoryGoesOnAfterAKill,
        ("K1",),
    ),
    Mutant(
        "memory_dirty_reads",
        "the in-memory claim takes jobs other transactions have not committed",
        MemoryDirtyReads,
        ("I3",),
        fault=("get_next_job", "uncommitted"),
    ),
    Mutant(
        "memory_enqueue_rolls_back_on_error",
        "the in-memory enqueue rolls the caller's transaction back when it fails",
        MemoryEnqueueRollsBackOnError,
        ("C3",),
    ),
    Mutant(
        "memory_enqueue_commits_earlier_writes",
        "the in-memory enqueue commits the caller's pending writes first",
        MemoryEnqueueCommitsEarlierWrites,
        ("C1",),
    ),
)


# -- the side tables (conformance/side_tables.py): unique keys (U) and periodic ticks (Y) ------------------


class _SqlCheckThenInsertStore(SqlUniqueStore):
    """Reads the key's row without a lock, then writes it over whatever another transaction put there."""

    def claim(self, conn: Any, key: str, job_id: Any, now: datetime) -> Any:
        upsert = (
            "ON DUPLICATE KEY UPDATE job_id = VALUES(job_id)"
            if self.dialect == "mysql"
            else "ON CONFLICT (unique_key) DO UPDATE SET job_id = EXCLUDED.job_id"
        )
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT job_id FROM {self._table()} WHERE unique_key = %s", (key,))
            row = cursor.fetchone()
            if row is not None:
                return row[0]
            cursor.execute(
                f"INSERT INTO {self._table()} (unique_key, job_id, claimed_at) VALUES (%s, %s, %s) {upsert}",
                (key, job_id, self._time(now)),
            )
        return job_id

    def _table(self) -> TableName:
        return side_tables.side_table(self.job_table, "unique")


class PgUniqueCheckThenInsert(PostgresBackend):
    """Unique keys checked before the row is locked: two open enqueues of one key both insert."""

    unique_store = _SqlCheckThenInsertStore


class MySQLUniqueCheckThenInsert(MySQLBackend):
    """Unique keys checked before the row is locked: two open enqueues of one key both insert."""

    unique_store = _SqlCheckThenInsertStore


class _MemoryCheckThenInsertStore(MemoryUniqueStore):
    def claim(self, conn: Any, key: str, job_id: Any, now: datetime) -> Any:
        with self.db.lock:
            row = self.db.tables.get(self.table, {}).get(key)
            if row is not None:
                return row[0]
            conn._write(self.table, key, (job_id, now))
            return job_id


class MemoryUniqueCheckThenInsert(MemoryBackend):
    """Unique keys checked before the row is locked: two open enqueues of one key both insert."""

    unique_store = _MemoryCheckThenInsertStore


class _PgReleasedWhileRunningStore(SqlUniqueStore):
    def holder_live(self, conn: Any, key: str, holder_id: Any, until: Any) -> bool:
        return super().holder_live(conn, key, holder_id, "started")


class PgKeyReleasedWhileRunning(PostgresBackend):
    """A key is free once its job is claimed, before the archive commits: a retried job has a twin."""

    unique_store = _PgReleasedWhileRunningStore


class _MemoryReleasedWhileRunningStore(MemoryUniqueStore):
    def holder_live(self, conn: Any, key: str, holder_id: Any, until: Any) -> bool:
        return super().holder_live(conn, key, holder_id, "started")


class MemoryKeyReleasedWhileRunning(MemoryBackend):
    """A key is free once its job is claimed, before the archive commits: a retried job has a twin."""

    unique_store = _MemoryReleasedWhileRunningStore


class _SqlTickOutsideStore(SqlPeriodicStore):
    """Reads the row unlocked and records the tick in a transaction of its own, committed at once."""

    def lock(self, conn: Any, name: str) -> TickRow | None:
        table = side_tables.side_table(self.job_table, "periodic")
        with conn.cursor() as cursor:
            cursor.execute(
                f"SELECT last_tick, definition, version FROM {table} WHERE schedule_name = %s", (name,)
            )
            row = cursor.fetchone()
        return None if row is None else TickRow(side_tables.from_db_time(row[0]), row[1], row[2])

    def advance(self, conn: Any, step: Advance) -> None:
        own = self.backend._data_source()  # type: ignore[attr-defined]
        try:
            super().advance(own, step)
            own.commit()
        finally:
            own.close()


class PgTickRecordedOutsideTheEnqueue(PostgresBackend):
    """Records a tick apart from its jobs' transaction: a crash after it loses the tick's job."""

    periodic_store = _SqlTickOutsideStore


class MySQLTickRecordedOutsideTheEnqueue(MySQLBackend):
    """Records a tick apart from its jobs' transaction: a crash after it loses the tick's job."""

    periodic_store = _SqlTickOutsideStore


class _MemoryTickOutsideStore(MemoryPeriodicStore):
    def lock(self, conn: Any, name: str) -> TickRow | None:
        with self.db.lock:
            row = self.db.tables.get(self.table, {}).get(name)
        return None if row is None else TickRow(row.last_tick, row.definition, row.version)

    def advance(self, conn: Any, step: Advance) -> None:
        own = self.db.connect()
        with self.db.lock:
            own._lock_row(self.table, step.name)
        super().advance(own, step)
        own.commit()


class MemoryTickRecordedOutsideTheEnqueue(MemoryBackend):
    """Records a tick apart from its jobs' transaction: a crash after it loses the tick's job."""

    periodic_store = _MemoryTickOutsideStore


SIDE_TABLE_MUTANTS: Final = (
    Mutant(
        "mysql_unique_check_then_insert",
        MySQLUniqueCheckThenInsert.__doc__ or "",
        MySQLUniqueCheckThenInsert,
        ("U3",),
    ),
    Mutant(
        "mysql_tick_recorded_outside_the_enqueue",
        MySQLTickRecordedOutsideTheEnqueue.__doc__ or "",
        MySQLTickRecordedOutsideTheEnqueue,
        ("Y1", "Y2"),
    ),
    Mutant(
        "pg_unique_check_then_insert", PgUniqueCheckThenInsert.__doc__ or "", PgUniqueCheckThenInsert, ("U3",)
    ),
    Mutant(
        "memory_unique_check_then_insert",
        MemoryUniqueCheckThenInsert.__doc__ or "",
        MemoryUniqueCheckThenInsert,
        ("U3",),
    ),
    Mutant(
        "pg_key_released_while_running",
        PgKeyReleasedWhileRunning.__doc__ or "",
        PgKeyReleasedWhileRunning,
        ("U2",),
    ),
    Mutant(
        "memory_key_released_while_running",
        MemoryKeyReleasedWhileRunning.__doc__ or "",
        MemoryKeyReleasedWhileRunning,
        ("U2",),
    ),
    Mutant(
        "pg_tick_recorded_outside_the_enqueue",
        PgTickRecordedOutsideTheEnqueue.__doc__ or "",
        PgTickRecordedOutsideTheEnqueue,
        ("Y1", "Y2"),
    ),
    Mutant(
        "memory_tick_recorded_outside_the_enqueue",
        MemoryTickRecordedOutsideTheEnqueue.__doc__ or "",
        MemoryTickRecordedOutsideTheEnqueue,
        ("Y1", "Y2"),
    ),
)


# -- the optional protocols (batch claim, enqueue_many, release, notifications): tests/mutants_protocols.py --

from mutants_protocols import (  # noqa: E402  (beside the rest, which its mutants join)
    MemoryBatchClaimInInsertOrder,
    MemoryBatchClaimOverLimit,
    MemoryListenerQuietWhenKilled,
    MemoryOneSavepointPerBatch,
    MySQLBatchChainOverLimit,
    MySQLBatchChainWithoutCommit,
    MySQLBoundAtTheNewest,
    MySQLBoundLocks,
    MySQLBoundPastTheOldest,
    MySQLChainClaimsBeforeCommit,
    MySQLChainDropsKeptBackWrite,
    MySQLChainWithoutCommit,
    MySQLChunksWithoutSavepoint,
    MySQLEndsNoTimedOutTransaction,
    PgBatchChainClaimsBeforeCommit,
    PgBatchChainOverLimit,
    PgBatchChainRollsBack,
    PgBatchChainWithoutCommit,
    PgChainClaimsBeforeCommit,
    PgChainRollsBack,
    PgChainWithoutCommit,
    PgCopyUnescaped,
    PgEndsNoTimedOutTransaction,
    PgListenerQuietWhenBroken,
    PgOneChannelForEveryTable,
    PgOneSavepointPerBatch,
    PgReleasesAnotherThread,
    PgReleasesNothing,
)

PROTOCOL_POSTGRESQL_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "batch_claim_over_limit",
        "get_next_jobs claims one job more than its limit (LIMIT n + 1)",
        _rewrite("get_next_jobs", "LIMIT %(limit)s", "LIMIT %(limit)s + 1"),
        ("G1", "G2"),
    ),
    Mutant(
        "batch_claim_without_order_by",
        "get_next_jobs has no ORDER BY, and its queue test cannot use the index: rows in heap order",
        _rewrite(
            "get_next_jobs",
            "WHERE queue = %(queue)s AND process_at <= %(now)s\nORDER BY process_at ASC",
            "WHERE queue || '' = %(queue)s AND process_at <= %(now)s",
        ),
        ("G1", "G2"),
    ),
    Mutant(
        "batch_one_savepoint_per_batch",
        "one savepoint for the whole batch: a later job's failed write undoes an earlier job's retry",
        PgOneSavepointPerBatch,
        ("G3", "G4"),
    ),
    Mutant(
        "enqueue_many_copy_unescaped",
        "enqueue_many's COPY rows are written without COPY's escapes (newline, tab, backslash)",
        PgCopyUnescaped,
        ("Q1",),
    ),
    Mutant(
        "release_releases_nothing",
        "release_connection does nothing: a stuck handler's job stays held after stop()",
        PgReleasesNothing,
        ("L1",),
    ),
    Mutant(
        "release_releases_another_thread",
        "release_connection releases another thread's transaction on the same backend",
        PgReleasesAnotherThread,
        ("L1",),
    ),
    Mutant(
        "timeout_ends_no_transaction",
        "end_transaction does nothing: a job past job_timeout_ms stays held while its handler runs on",
        PgEndsNoTimedOutTransaction,
        ("L2",),
    ),
    Mutant(
        "notify_one_channel_for_every_table",
        "one NOTIFY channel whatever the job table: listeners of every table wake",
        PgOneChannelForEveryTable,
        ("N2",),
    ),
    Mutant(
        "listener_quiet_when_broken",
        "a listener whose session died answers False instead of raising, so it is never replaced",
        PgListenerQuietWhenBroken,
        ("N3",),
    ),
    Mutant(
        "chain_without_commit",
        "commit_and_get_next_job claims the next job in the same transaction: nothing commits until the end",
        PgChainWithoutCommit,
        ("J1", "J2", "J3"),
    ),
    Mutant(
        "chain_rolls_back",
        "commit_and_get_next_job sends ROLLBACK where COMMIT belongs: the finished job's archive is undone",
        PgChainRollsBack,
        ("J1", "J2", "J3"),
    ),
    Mutant(
        "chain_claims_before_commit",
        "commit_and_get_next_job claims before its COMMIT, which ends the next job's row lock at once",
        PgChainClaimsBeforeCommit,
        ("J2",),
    ),
    Mutant(
        "batch_chain_without_commit",
        "commit_and_get_next_jobs claims the next batch in its transaction: nothing commits until the end",
        PgBatchChainWithoutCommit,
        ("J5", "J6"),
    ),
    Mutant(
        "batch_chain_rolls_back",
        "commit_and_get_next_jobs sends ROLLBACK where COMMIT belongs: the batch's archive is undone",
        PgBatchChainRollsBack,
        ("J5", "J6"),
    ),
    Mutant(
        "batch_chain_over_limit",
        "commit_and_get_next_jobs claims one job more than its limit: chained batches outgrow batch_size",
        PgBatchChainOverLimit,
        ("J5", "J6"),
    ),
    Mutant(
        "batch_chain_claims_before_commit",
        "commit_and_get_next_jobs claims before its COMMIT, which ends the next batch's row locks at once",
        PgBatchChainClaimsBeforeCommit,
        ("J6",),
    ),
)

PROTOCOL_MYSQL_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "mysql_enqueue_many_chunks_without_savepoint",
        "enqueue_many's statements of one batch run without their savepoint: a failure leaves earlier ones",
        MySQLChunksWithoutSavepoint,
        ("Q2",),
    ),
    Mutant(
        "mysql_timeout_ends_no_transaction",
        "end_transaction does nothing on MySQL: a job past job_timeout_ms stays held while its handler runs",
        MySQLEndsNoTimedOutTransaction,
        ("L2",),
    ),
)

# MySQL's chained plan: run on its own harness (conformance.builtin:mysql_chain), whose connections take
# multi-statement queries.
MYSQL_CHAIN_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "mysql_chain_without_commit",
        "MySQL: commit_and_get_next_job claims in the same transaction, so nothing commits until the end",
        MySQLChainWithoutCommit,
        ("J1", "J2", "J3"),
    ),
    Mutant(
        "mysql_chain_claims_before_commit",
        "MySQL: commit_and_get_next_job claims before its COMMIT, which ends the next job's row lock",
        MySQLChainClaimsBeforeCommit,
        ("J2",),
    ),
    Mutant(
        "mysql_chain_drops_kept_back_write",
        "a finished job's archive and delete, kept back for the chain, are dropped when the worker stops",
        MySQLChainDropsKeptBackWrite,
        ("J4", "J7"),
    ),
    Mutant(
        "mysql_batch_chain_without_commit",
        "MySQL: commit_and_get_next_jobs claims in the same transaction, so nothing commits until the end",
        MySQLBatchChainWithoutCommit,
        ("J5", "J6"),
    ),
    Mutant(
        "mysql_batch_chain_over_limit",
        "MySQL: commit_and_get_next_jobs claims one job more than its limit, outgrowing batch_size",
        MySQLBatchChainOverLimit,
        ("J5", "J6"),
    ),
    Mutant(
        "mysql_bound_past_the_oldest",
        "MySQL: the bounded claim's scan starts one second past the oldest due job",
        MySQLBoundPastTheOldest,
        ("S1",),
    ),
    Mutant(
        "mysql_bound_locks",
        "MySQL: the bounded claim reads its bound with a lock, which waits for other workers' rows",
        MySQLBoundLocks,
        ("S6",),
    ),
    Mutant(
        "mysql_bound_at_the_newest",
        "MySQL: the bounded claim's scan starts at the newest due job (DESC for ASC)",
        MySQLBoundAtTheNewest,
        ("S3",),
    ),
    Mutant(
        "mysql_batch_bound_at_the_newest",
        "MySQL: the bounded batch claim's scan starts at the newest due job (DESC for ASC)",
        MySQLBoundAtTheNewest,
        ("G1",),
        batch_size=8,
    ),
)

PROTOCOL_MEMORY_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "memory_batch_claim_over_limit",
        "the in-memory get_next_jobs claims one job more than its limit",
        MemoryBatchClaimOverLimit,
        ("G1", "G2"),
    ),
    Mutant(
        "memory_batch_claim_in_insert_order",
        "the in-memory get_next_jobs takes due jobs in insertion order",
        MemoryBatchClaimInInsertOrder,
        ("G1", "G2"),
    ),
    Mutant(
        "memory_batch_one_savepoint_per_batch",
        "one in-memory savepoint for the whole batch: a later job's failed write undoes an earlier retry",
        MemoryOneSavepointPerBatch,
        ("G3", "G4"),
    ),
    Mutant(
        "memory_listener_quiet_when_killed",
        "the in-memory listener answers False once killed instead of raising",
        MemoryListenerQuietWhenKilled,
        ("N3",),
    ),
)

POSTGRESQL_MUTANTS += PROTOCOL_POSTGRESQL_MUTANTS
MYSQL_MUTANTS += PROTOCOL_MYSQL_MUTANTS
MEMORY_MUTANTS += PROTOCOL_MEMORY_MUTANTS


# -- the error history: its row written apart from the job's transaction ------------------------------------


class _SqlHistoryOutsideStore(SqlErrorStore):
    def record(self, conn: Any, row: ErrorEntry) -> None:
        with self.backend.transaction() as own:
            super().record(own, row)


class _MemoryHistoryOutsideStore(MemoryErrorStore):
    def record(self, conn: Any, row: ErrorEntry) -> None:
        with self.backend.transaction() as own:
            super().record(own, row)


class PgHistoryOutsideTheJob(PostgresBackend):
    """Writes a failed attempt's row in a transaction of its own: a rolled-back retry leaves it behind."""

    error_store = _SqlHistoryOutsideStore


class MySQLHistoryOutsideTheJob(MySQLBackend):
    """Writes a failed attempt's row in a transaction of its own: a rolled-back retry leaves it behind."""

    error_store = _SqlHistoryOutsideStore


class MemoryHistoryOutsideTheJob(MemoryBackend):
    """Writes a failed attempt's row in a transaction of its own: a rolled-back retry leaves it behind."""

    error_store = _MemoryHistoryOutsideStore


class _SqlHistoryNotPurgedStore(SqlErrorStore):
    def purge(self, conn: Any, job_ids: list[Any]) -> None:
        return None


class _MemoryHistoryNotPurgedStore(MemoryErrorStore):
    def purge(self, conn: Any, job_ids: list[Any]) -> None:
        return None


class PgHistoryNotPurged(PostgresBackend):
    """Purging archived jobs leaves their error history rows: the history outlives its jobs, unbounded."""

    error_store = _SqlHistoryNotPurgedStore


class MySQLHistoryNotPurged(MySQLBackend):
    """Purging archived jobs leaves their error history rows: the history outlives its jobs, unbounded."""

    error_store = _SqlHistoryNotPurgedStore


class MemoryHistoryNotPurged(MemoryBackend):
    """Purging archived jobs leaves their error history rows: the history outlives its jobs, unbounded."""

    error_store = _MemoryHistoryNotPurgedStore


ERROR_HISTORY_MUTANTS: Final = tuple(
    Mutant(f"{prefix}_{name}", cls.__doc__ or "", cls, (clause,))
    for name, clause, classes in (
        (
            "history_outside_the_job",
            "F2",
            (PgHistoryOutsideTheJob, MySQLHistoryOutsideTheJob, MemoryHistoryOutsideTheJob),
        ),
        ("history_not_purged", "F3", (PgHistoryNotPurged, MySQLHistoryNotPurged, MemoryHistoryNotPurged)),
    )
    for prefix, cls in zip(("pg", "mysql", "memory"), classes, strict=True)
)


# -- asynchronous commit (conformance/synchronous_commit.py, W): PostgresBackend(synchronous_commit_off=True)


class PgSynchronousCommitSessionWide(PostgresBackend):
    """The worker's SET is session-wide, not LOCAL: the connection stays off after the job's transaction."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "synchronous_commit_off": True})
        local = sql.queries(self.dialect)["synchronous_commit_off"]
        assert "SET LOCAL " in local, "the mutant no longer matches the statement"
        self._job_transaction_setting = local.replace("SET LOCAL ", "SET ")


class PgSynchronousCommitNeverSet(PostgresBackend):
    """The option is taken but the SET LOCAL never sent: the job's transaction commits synchronously."""

    def __init__(self, data_source: Any = None, **options: Any) -> None:
        super().__init__(data_source, **{**options, "synchronous_commit_off": True})
        self._job_transaction_setting = None


SYNCHRONOUS_COMMIT_MUTANTS: Final = (
    Mutant(
        "pg_synchronous_commit_session_wide",
        "the worker's SET synchronous_commit = off is session-wide, so it outlives the job's transaction",
        PgSynchronousCommitSessionWide,
        ("W3",),
        fault=("session SET", "after the job"),
    ),
    Mutant(
        "pg_synchronous_commit_never_set",
        "synchronous_commit_off=True is taken but the SET LOCAL is never sent",
        PgSynchronousCommitNeverSet,
        ("W2",),
        fault=("in the job's transaction",),
    ),
)
