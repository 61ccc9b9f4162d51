"""Read-only queue statistics over the job and archive tables (sql/<dialect>/stats.sql), for the CLI."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from proletarian_ref.clock import Clock, now_from, system_utc
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.keywords import from_keyword_text, to_keyword_text
from proletarian_ref.ops.db import (
    Tables,
    can_tell_held,
    db_time,
    dialect_of,
    end_read,
    from_db_time,
    held_rows_read,
    query,
    render,
    statements,
)
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName, table_name

# LIMIT takes no NULL on MySQL: "every queue" is a limit no table reaches.
_NO_LIMIT: Final = 2**62
# Any constant will do, as long as it is the same for every proletarian-ref process.
_SCHEMA_LOCK_KEY: Final = 0x70726F6C
_SCHEMA_LOCK_NAME: Final = "proletarian_ref_schema"
_SCHEMA_LOCK_TIMEOUT_S: Final = 60


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue: jobs in the job table and jobs archived, by readable status.

    `due` jobs wait for a worker; `running` ones are due and held by a worker (its claim's row lock);
    `oldest_due_age` is the age of the oldest due job no worker holds: how far behind the workers are.
    """

    queue: str
    due: int = 0
    scheduled: int = 0
    oldest_due_age: timedelta | None = None
    archived: dict[str, int] = field(default_factory=dict)
    running: int = 0


@dataclass(frozen=True, slots=True)
class Stats:
    """Every queue seen in either table, at `now` (the application's clock)."""

    job_table: TableName
    archived_job_table: TableName
    now: datetime
    queues: tuple[QueueStats, ...]

    def archived_totals(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for queue in self.queues:
            for status, count in queue.archived.items():
                totals[status] = totals.get(status, 0) + count
        return dict(sorted(totals.items()))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types: queue and status names without the EDN colon, ages in seconds."""
        return {
            "job_table": str(self.job_table),
            "archived_job_table": str(self.archived_job_table),
            "now": self.now.isoformat(),
            "queues": [
                {
                    "queue": q.queue,
                    "due": q.due,
                    "running": q.running,
                    "scheduled": q.scheduled,
                    "oldest_due_age_seconds": (
                        None if q.oldest_due_age is None else round(q.oldest_due_age.total_seconds(), 3)
                    ),
                    "archived": dict(sorted(q.archived.items())),
                }
                for q in self.queues
            ],
            "archived": self.archived_totals(),
        }


@dataclass(frozen=True, slots=True)
class ArchiveSummary:
    """What the archive says about the jobs of one queue enqueued since a moment."""

    processed: int
    succeeded: int
    failed: int
    retried: int
    attempts: int
    first_enqueued_at: datetime | None
    last_finished_at: datetime | None

    @property
    def elapsed(self) -> timedelta | None:
        if self.first_enqueued_at is None or self.last_finished_at is None:
            return None
        return self.last_finished_at - self.first_enqueued_at


def _render(
    dialect: str, name: str, job_table: TableName, archived_job_table: TableName | None = None
) -> str:
    return render(dialect, "stats.sql", name, Tables(job_table, archived_job_table or job_table))


@dataclass(frozen=True, slots=True)
class TableLocation:
    """Where a table really is, beside the database the connection (the DSN) names."""

    database: str
    schema: str | None  # None on MySQL, where a database is the only level above a table
    connection_database: str | None  # None for a MySQL DSN that names no database

    def qualified(self, table: TableName) -> str:
        return f"{self.schema if self.schema is not None else self.database}.{table.name}"


def table_location(conn: Any, table: str | TableName, *, dialect: str | None = None) -> TableLocation | None:
    """Where `table` is, an unqualified name resolved as the core's SQL resolves it; None if it is missing."""
    name = table_name(table, option="table")
    active = dialect_of(conn, dialect)
    try:
        rows = query(
            conn,
            active,
            statements(active, "stats.sql")["table_location"],
            {"qualified": str(name), "schema": name.schema, "name": name.name},
        )
    finally:
        end_read(conn)
    if not rows:
        return None
    database, schema, connection_database = rows[0]
    return TableLocation(str(database), schema, connection_database)


def table_exists(conn: Any, table: str | TableName, *, dialect: str | None = None) -> bool:
    """Whether `table` exists, asked of the catalogue rather than by provoking an error."""
    return table_location(conn, table, dialect=dialect) is not None


@contextmanager
def schema_lock(conn: Any, *, dialect: str | None = None) -> Iterator[None]:
    """Hold a session-level lock so that concurrent commands check and install the schema one at a time."""
    active = dialect_of(conn, dialect)
    params = {"key": _SCHEMA_LOCK_KEY, "name": _SCHEMA_LOCK_NAME, "timeout_s": _SCHEMA_LOCK_TIMEOUT_S}
    query(conn, active, statements(active, "stats.sql")["schema_lock"], params)
    conn.commit()
    try:
        yield
    finally:
        query(conn, active, statements(active, "stats.sql")["schema_unlock"], params)
        conn.commit()


def missing_tables(conn: Any, tables: list[TableName], *, dialect: str | None = None) -> list[TableName]:
    return [t for t in tables if not table_exists(conn, t, dialect=dialect)]


def _queue_list(dialect: str, queues: Iterable[str] | None) -> Any:
    """The queues as keyword text, bound as PostgreSQL's array or PyMySQL's IN list (never empty)."""
    texts = [to_keyword_text(q, what="queue") for q in queues or ()]
    if dialect == "postgresql":
        return texts
    return tuple(texts) or ("",)


def queue_stats(
    conn: Any,
    *,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    dialect: str | None = None,
    clock: Clock | None = None,
    archived: bool = True,
    after: str | None = None,
    limit: int | None = None,
    queues: Iterable[str] | None = None,
) -> Stats:
    """Per queue: jobs due now and waiting, running (held by a worker), scheduled later, the age of the
    oldest waiting job, and archived jobs by status.

    `archived=False` leaves out the archive (a scan of its every row), for frequent callers such as a
    metrics scrape or a health probe. Inside a transaction the caller has open, MySQL cannot tell running
    jobs from waiting ones (see ops.db.can_tell_held): every due job counts as waiting there.

    `limit` queues of the job table after the queue `after` (keyword text), in order, make a page: the
    queues of the archive alone are then left out. `queues` (keyword text or names) reads those queues
    alone, and locks no other queue's rows on MySQL.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(f"limit must be a whole number >= 1, got {limit!r}")
    job = table_name(job_table, option="job_table")
    archive = table_name(archived_job_table, option="archived_job_table")
    active = dialect_of(conn, dialect)
    now = now_from(clock if clock is not None else system_utc)
    params: dict[str, Any] = {
        "now": db_time(active, now),
        "from_first": after is None,
        "after": after,
        "limit": _NO_LIMIT if limit is None else limit,
        "to_last": True,
        "through": None,
        "every_queue": queues is None,
        "queues": _queue_list(active, queues),
    }
    try:
        totals = query(conn, active, _render(active, "queue_stats", job), params)
        if limit is not None and len(totals) == limit:
            # The held rows of this page's queues alone.
            params.update(to_last=False, through=totals[-1][0])
        done = query(conn, active, _render(active, "archive_stats", job, archive), {}) if archived else []
    finally:
        end_read(conn)
    free: dict[str, tuple[int, Any]] | None = None
    if can_tell_held(conn, active):
        with held_rows_read(conn, active):
            rows = query(conn, active, _render(active, "waiting_stats", job), params)
        free = {queue_text: (int(n), oldest) for queue_text, n, oldest in rows}
    found: dict[str, QueueStats] = {}
    for queue_text, due, scheduled, oldest_due in totals:
        due_all = int(due or 0)
        # A job claimed between the two reads is held in the second only; one finished meanwhile is gone
        # from it: neither makes a count negative.
        waiting, oldest_at = (due_all, oldest_due) if free is None else free.get(queue_text, (0, None))
        waiting = min(waiting, due_all)
        oldest = from_db_time(oldest_at)
        found[queue_text] = QueueStats(
            queue=from_keyword_text(queue_text),
            due=waiting,
            running=due_all - waiting,
            scheduled=int(scheduled or 0),
            oldest_due_age=None if oldest is None else max(now - oldest, timedelta(0)),
        )
    for queue_text, status, count in done:
        entry = found.setdefault(queue_text, QueueStats(queue=from_keyword_text(queue_text)))
        readable = from_keyword_text(status)
        entry.archived[readable] = entry.archived.get(readable, 0) + int(count)
    ordered = tuple(sorted(found.values(), key=lambda q: q.queue))
    return Stats(job_table=job, archived_job_table=archive, now=now, queues=ordered)


def _archive_rows(
    conn: Any,
    name: str,
    *,
    queue: str,
    since: datetime,
    job_table: str | TableName,
    archived_job_table: str | TableName,
    dialect: str | None,
) -> list[tuple[Any, ...]]:
    """Rows of the named archive query for the jobs of `queue` enqueued since `since`."""
    job = table_name(job_table, option="job_table")
    archived = table_name(archived_job_table, option="archived_job_table")
    active = dialect_of(conn, dialect)
    try:
        return query(
            conn,
            active,
            _render(active, name, job, archived),
            {"queue": queue, "since": db_time(active, since)},
        )
    finally:
        end_read(conn)


def archived_count(
    conn: Any,
    *,
    queue: str,
    since: datetime,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    dialect: str | None = None,
) -> int:
    """How many jobs of `queue` (keyword text, e.g. ":a/b") enqueued since `since` are archived."""
    rows = _archive_rows(
        conn,
        "archived_count",
        queue=queue,
        since=since,
        job_table=job_table,
        archived_job_table=archived_job_table,
        dialect=dialect,
    )
    return int(rows[0][0]) if rows else 0


def archive_summary(
    conn: Any,
    *,
    queue: str,
    since: datetime,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    dialect: str | None = None,
) -> ArchiveSummary:
    """Processed, succeeded, failed and retried jobs of `queue` (keyword text) enqueued since `since`."""
    rows = _archive_rows(
        conn,
        "archive_summary",
        queue=queue,
        since=since,
        job_table=job_table,
        archived_job_table=archived_job_table,
        dialect=dialect,
    )
    by_status: dict[str, int] = {}
    retried = attempts = 0
    first: datetime | None = None
    last: datetime | None = None
    for status, jobs, status_retried, status_attempts, first_enqueued, last_finished in rows:
        by_status[from_keyword_text(status)] = int(jobs)
        retried += int(status_retried or 0)
        attempts += int(status_attempts or 0)
        first = _earliest(first, from_db_time(first_enqueued))
        last = _latest(last, from_db_time(last_finished))
    return ArchiveSummary(
        processed=sum(by_status.values()),
        succeeded=by_status.get("success", 0),
        failed=by_status.get("failure", 0),
        retried=retried,
        attempts=attempts,
        first_enqueued_at=first,
        last_finished_at=last,
    )


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a if b is None else b
    return min(a, b)


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a if b is None else b
    return max(a, b)


@dataclass(frozen=True, slots=True)
class Throughput:
    """Jobs of one queue and status finished in the last 1, 5 and 15 minutes."""

    queue: str
    status: str
    last_1m: int
    last_5m: int
    last_15m: int


def throughput(
    conn: Any,
    *,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    dialect: str | None = None,
    clock: Clock | None = None,
) -> list[Throughput]:
    """Per queue and status, how many jobs finished in the last 1, 5 and 15 minutes (names without colons)."""
    active = dialect_of(conn, dialect)
    tables = Tables(
        table_name(job_table, option="job_table"), table_name(archived_job_table, option="archived_job_table")
    )
    now = now_from(clock if clock is not None else system_utc)
    params = {f"m{n}": db_time(active, now - timedelta(minutes=n)) for n in (1, 5, 15)}
    try:
        rows = query(conn, active, render(active, "stats.sql", "throughput", tables), params)
    finally:
        end_read(conn)
    return [
        Throughput(from_keyword_text(q), from_keyword_text(s), int(a or 0), int(b or 0), int(c or 0))
        for q, s, a, b, c in rows
    ]
