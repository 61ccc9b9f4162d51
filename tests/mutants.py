"""Deliberately broken backends, each wrong in one way, and the suite tests that must catch each of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from proletarian_ref.backend import JobRecord
from proletarian_ref.backends.memory import MemoryBackend, MemoryConnection
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.job import default_serializer
from proletarian_ref.tables import TableName


@dataclass(frozen=True, slots=True)
class Mutant:
    """A broken backend class and the clauses ("S5", "P1", ...) whose tests must fail against it."""

    name: str
    what: str
    backend_class: type[Any]
    killed_by: tuple[str, ...]


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


# -- in memory: the executable specification can drift too --------------------------------------------------


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


POSTGRESQL_MUTANTS: tuple[Mutant, ...] = (
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
        ("A3", "A4", "P1"),
    ),
    Mutant(
        "claim_ignores_process_at",
        "the claim has no process_at <= now condition",
        _rewrite("get_next_job", " AND process_at <= %(now)s", ""),
        ("S2", "P1"),
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
        "the claim has no ORDER BY (PostgreSQL then reads a small analyzed table in heap order)",
        _rewrite("get_next_job", "ORDER BY process_at ASC", ""),
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
    Mutant("enqueue_commits", "enqueue commits the caller's transaction", EnqueueCommits, ("E7", "M1")),
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
)

MEMORY_MUTANTS: tuple[Mutant, ...] = (
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
)
