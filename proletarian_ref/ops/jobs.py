"""Listing, showing, retrying, cancelling, rescheduling and purging jobs in Proletarian's own tables.

Every row written here is one Proletarian reads and runs: a retried job is the row enqueue! wrote (same
id, queue, job type, Transit payload text and enqueued_at) with attempts 0 and a new process_at; a
cancelled job is archived as archive_job does, with the status ":cancelled" (an EDN keyword).

The functions that change rows commit on the connection they are given, one short transaction per job
or batch, so that a failure half-way leaves every finished transaction whole and nothing else changed;
they refuse a connection with a transaction open, which they would commit. Reads end only the
transaction they began, and no function changes the connection's session (ops.db.execute).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from proletarian_ref import error_history, side_tables
from proletarian_ref.clock import Clock, now_from, system_utc
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.job import to_process_at
from proletarian_ref.keywords import from_keyword_text, to_keyword_text
from proletarian_ref.ops.db import (
    Tables,
    can_tell_held,
    conflict_reason,
    db_time,
    decode_job_id,
    dialect_of,
    encode_job_id,
    end_read,
    ended,
    execute,
    from_db_time,
    held_rows_read,
    parse_job_id,
    query,
    read_committed_next,
    render,
    require_no_transaction,
)
from proletarian_ref.serializers import Serializer, create_serializer

STATUS_FAILURE: Final = ":failure"
# Not a status Proletarian writes; any EDN keyword text reads back in Clojure, and this one says what
# happened. Readers that only know :success and :failure see neither.
STATUS_CANCELLED: Final = ":cancelled"
QUEUED_STATUSES: Final = ("queued", "due", "scheduled")
# Every archived job, whatever its status: a word of ours, never stored, so it cannot name a status.
ARCHIVED: Final = "archived"
DEFAULT_PAGE_SIZE: Final = 50
DEFAULT_BATCH_SIZE: Final = 500

Outcome = Literal[
    "retried",
    "cancelled",
    "rescheduled",
    # Left alone: a worker holds it; it is queued, not archived (retry); it is archived, not queued (cancel,
    # reschedule); archived as :success or another status retry does not take; in neither table; or the
    # database refused this job's transaction (Result.detail says why).
    "running",
    "queued",
    "archived",
    "not-retryable",
    "not-found",
    "conflict",
]
# The outcomes that change the job; a job named by id with any other makes the CLI exit 1.
CHANGED: Final = frozenset(("retried", "cancelled", "rescheduled"))


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs: `status` is queued, due or scheduled (the job table), archived (every archived job) or
    one archive status."""

    queue: str | None = None
    job_type: str | None = None
    status: str = "queued"
    min_attempts: int | None = None
    max_attempts: int | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None

    def __post_init__(self) -> None:
        for name in ("min_attempts", "max_attempts"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ConfigurationError(f"{name} must be a whole number >= 0, got {value!r}")
        for name in ("older_than", "newer_than"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, timedelta) or value < timedelta(0)):
                raise ConfigurationError(f"{name} must be a timedelta >= 0, got {value!r}")
        # Normalise once: keyword text in the columns' form, so the SQL compares like with like.
        for name in ("queue", "job_type"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, to_keyword_text(value, what=name))
        if not self.queued and self.status != ARCHIVED:
            object.__setattr__(self, "status", to_keyword_text(self.status, what="status"))

    @property
    def queued(self) -> bool:
        return self.status in QUEUED_STATUSES

    def params(self, dialect: str, now: datetime) -> dict[str, Any]:
        def time(delta: timedelta | None) -> Any:
            return None if delta is None else db_time(dialect, now - delta)

        values = {
            "queue": self.queue,
            "job_type": self.job_type,
            "status": None if self.queued or self.status == ARCHIVED else self.status,
            "min_attempts": self.min_attempts,
            "max_attempts": self.max_attempts,
            "enqueued_before": time(self.older_than),
            "enqueued_after": time(self.newer_than),
            "due_by": db_time(dialect, now) if self.status == "due" else None,
            "due_after": db_time(dialect, now) if self.status == "scheduled" else None,
        }
        return {**values, **{f"any_{name}": value is None for name, value in values.items()}}


@dataclass(frozen=True, slots=True)
class JobView:
    """One job row as stored, from the job table (`status` None) or the archive."""

    job_id: Any
    queue: str
    job_type: str
    payload_text: str
    attempts: int
    enqueued_at: datetime
    process_at: datetime
    status: str | None = None
    finished_at: datetime | None = None
    # A worker holds the row (its claim's lock): the job is being run right now.
    running: bool = False
    # Its failed attempts, oldest first, from the error history's side table (show_job only); None where
    # that table is not installed.
    errors: tuple[error_history.ErrorEntry, ...] | None = None

    @property
    def archived(self) -> bool:
        return self.status is not None

    def state(self, now: datetime) -> str:
        """queued jobs: running (a worker holds it), due (waiting) or scheduled; archived ones: their status
        without the colon."""
        if self.status is not None:
            return from_keyword_text(self.status)
        if self.running:
            return "running"
        return "due" if self.process_at <= now else "scheduled"

    def payload(self, serializer: Serializer | None = None) -> Any:
        """The payload as a default-mode handler gets it (plain Python values)."""
        return (serializer or _SERIALIZER).decode(self.payload_text)

    def to_json(self, now: datetime, *, payload: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "job_id": str(self.job_id),
            "queue": from_keyword_text(self.queue),
            "job_type": from_keyword_text(self.job_type),
            "state": self.state(now),
            "attempts": self.attempts,
            "enqueued_at": self.enqueued_at.isoformat(),
            "process_at": self.process_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
            "payload_transit": self.payload_text,
        }
        if self.errors is not None:
            data["errors"] = [entry.to_json() for entry in self.errors]
        if payload:
            data["payload"] = jsonable(self.payload())
        return data


@dataclass(frozen=True, slots=True)
class Page:
    jobs: list[JobView]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Result:
    """What an operation did to one job, and why it was left alone (empty when it was changed)."""

    job_id: Any
    outcome: Outcome
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        data = {"job_id": str(self.job_id), "outcome": self.outcome}
        return {**data, "detail": self.detail} if self.detail else data


_SERIALIZER: Final = create_serializer()


def jsonable(value: Any) -> Any:
    """A decoded payload in standard JSON's types: sets and tuples as lists, a non-finite number (Transit
    carries NaN and the infinities) as the string "NaN", "Infinity" or "-Infinity", other values as their
    text."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict) or (hasattr(value, "items") and hasattr(value, "keys")):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _view(row: tuple[Any, ...]) -> JobView:
    job_id, queue, job_type, payload, attempts, enqueued_at, process_at, *archived = row
    status, finished_at = archived if archived else (None, None)
    return JobView(
        job_id=decode_job_id(job_id),
        queue=queue,
        job_type=job_type,
        payload_text=payload,
        attempts=int(attempts),
        enqueued_at=from_db_time(enqueued_at) or datetime.min,
        process_at=from_db_time(process_at) or datetime.min,
        status=status,
        finished_at=from_db_time(finished_at),
    )


def _cursor_of(view: JobView) -> str:
    at = view.finished_at if view.archived else view.process_at
    text = json.dumps([at.isoformat() if at else None, str(view.job_id)])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _from_cursor(cursor: str, dialect: str) -> tuple[Any, Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at_text, id_text = json.loads(base64.urlsafe_b64decode(padded.encode()))
        at = datetime.fromisoformat(at_text)
        return db_time(dialect, at), encode_job_id(dialect, parse_job_id(id_text))
    except (ValueError, TypeError, json.JSONDecodeError):
        raise ConfigurationError(f"not a page cursor from a previous listing: {cursor!r}") from None


def list_jobs(
    conn: Any,
    job_filter: JobFilter | None = None,
    *,
    after: str | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    tables: Tables | None = None,
    dialect: str | None = None,
    clock: Clock | None = None,
) -> Page:
    """One page of jobs (queued: next to run first; archived: last finished first), paged by keyset.

    `after` is the `next_cursor` of the previous page.
    """
    if not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"limit must be a whole number >= 1, got {limit!r}")
    chosen = job_filter or JobFilter()
    active = dialect_of(conn, dialect)
    tables = tables or Tables.of()
    now = now_from(clock or system_utc)
    params = chosen.params(active, now)
    after_at, after_id = (None, None) if after is None else _from_cursor(after, active)
    params.update(first_page=after is None, after_at=after_at, after_id=after_id, limit=limit + 1)
    name = "list_queued" if chosen.queued else "list_archived"
    try:
        rows = query(conn, active, render(active, "ops.sql", name, tables), params)
    finally:
        end_read(conn)
    views = _with_running(conn, active, tables, [_view(row) for row in rows[:limit]], now)
    return Page(views, _cursor_of(views[-1]) if len(rows) > limit else None)


def _with_running(
    conn: Any, dialect: str, tables: Tables, views: list[JobView], now: datetime
) -> list[JobView]:
    """The views with `running` set on the due jobs a worker holds (ops.db.can_tell_held says when)."""
    due = [v.job_id for v in views if not v.archived and v.process_at <= now]
    if not due or not can_tell_held(conn, dialect):
        return views
    stored = [encode_job_id(dialect, job_id) for job_id in due]
    with held_rows_read(conn, dialect):
        rows = query(
            conn,
            dialect,
            render(dialect, "ops.sql", "free_jobs", tables),
            {"job_ids": stored if dialect == "postgresql" else tuple(stored)},
        )
    free = {decode_job_id(row[0]) for row in rows}
    held = set(due) - free
    return [replace(v, running=True) if v.job_id in held else v for v in views]


def iter_jobs(
    conn: Any,
    job_filter: JobFilter,
    *,
    tables: Tables | None = None,
    dialect: str | None = None,
    clock: Clock | None = None,
    page_size: int = DEFAULT_BATCH_SIZE,
) -> Iterator[JobView]:
    """Every job the filter selects, a page at a time."""
    after: str | None = None
    while True:
        page = list_jobs(
            conn, job_filter, after=after, limit=page_size, tables=tables, dialect=dialect, clock=clock
        )
        yield from page.jobs
        if page.next_cursor is None:
            return
        after = page.next_cursor


# PostgreSQL's "operator does not exist": here, a whole-number id compared with a uuid job_id column.
_UNDEFINED_FUNCTION: Final = "42883"


@contextmanager
def _id_kind_checked(job_ids: Iterable[Any]) -> Iterator[None]:
    """Turn the database's refusal of a whole-number id for a UUID column into a ConfigurationError."""
    try:
        yield
    except Exception as exc:
        numbers = [i for i in job_ids if isinstance(i, int)]
        if numbers and getattr(exc, "sqlstate", None) == _UNDEFINED_FUNCTION:
            raise ConfigurationError(
                f"job id {numbers[0]} is a whole number, but the job_id column holds UUIDs"
            ) from exc
        raise


def show_job(
    conn: Any,
    job_id: Any,
    *,
    tables: Tables | None = None,
    dialect: str | None = None,
    clock: Clock | None = None,
) -> JobView | None:
    """The job with this id, queued or archived, or None."""
    active = dialect_of(conn, dialect)
    tables = tables or Tables.of()
    parsed = parse_job_id(job_id)
    params = {"job_id": encode_job_id(active, parsed)}
    found: JobView | None = None
    try:
        with _id_kind_checked([parsed]):
            for name in ("show_queued", "show_archived"):
                rows = query(conn, active, render(active, "ops.sql", name, tables), params)
                if rows:
                    found = _view(rows[0])
                    break
    finally:
        end_read(conn)
    if found is None:
        return None
    [view] = _with_running(conn, active, tables, [found], now_from(clock or system_utc))
    try:
        if has_error_history(conn, active, tables):
            rows = query(conn, active, side_tables.statement(active, FEATURE, "history", tables.job), params)
            view = replace(view, errors=tuple(error_history.history_of(rows, params["job_id"])))
    finally:
        end_read(conn)
    return view


FEATURE: Final = error_history.FEATURE


def has_error_history(conn: Any, dialect: str, tables: Tables) -> bool:
    """Whether the error history's side table is there beside `tables.job` (docs/errors.md)."""
    table = side_tables.side_table(tables.job, FEATURE)
    params: dict[str, Any] = (
        {"table": str(table)} if dialect == "postgresql" else {"schema": table.schema, "name": table.name}
    )
    rows = query(conn, dialect, side_tables.statement(dialect, FEATURE, "table_exists", tables.job), params)
    return bool(rows and rows[0][0])


def _error_store(dialect: str, tables: Tables) -> error_history.ErrorStore:
    """The error history's SQL store, as a worker on `dialect` writes it, for statements on a caller's
    connection (the store's purge is what clause F3 proves; docs/conformance.md)."""
    from proletarian_ref.backends import backend_for_dialect

    return error_history.SqlErrorStore(backend_for_dialect(dialect), tables.job)


def _run(conn: Any, dialect: str, tables: Tables, name: str, params: dict[str, Any]) -> Any:
    return execute(conn, dialect, render(dialect, "ops.sql", name, tables), params)


# What one job's own transaction did: an outcome and, when the job was left alone, why.
Done = tuple[Outcome, str]


def _elsewhere(conn: Any, dialect: str, tables: Tables, params: dict[str, Any]) -> Done:
    """Why a job the operation did not find in the state it acts on was left alone: where it is instead."""
    if _run(conn, dialect, tables, "show_queued", params)[0]:
        return "queued", "still queued, not archived"
    archived = _run(conn, dialect, tables, "show_archived", params)[0]
    if archived:
        return "archived", f"archived with status {archived[0][7]}"
    return "not-found", f"in neither {tables.job} nor {tables.archived}"


def _retry_one(conn: Any, dialect: str, tables: Tables, stored_id: Any, process_at: Any) -> Done:
    params = {
        "job_id": stored_id,
        "status": STATUS_FAILURE,
        "other_status": STATUS_CANCELLED,
        "process_at": process_at,
    }
    locked = _run(conn, dialect, tables, "lock_archived", params)[0]
    if not locked:
        outcome, why = _elsewhere(conn, dialect, tables, params)
        if outcome == "archived":
            return "not-retryable", f"{why}: only {STATUS_FAILURE} and {STATUS_CANCELLED} are retried"
        return outcome, why
    _run(conn, dialect, tables, "requeue_archived", params)
    _run(conn, dialect, tables, "delete_archived", params)
    return "retried", "" if locked[0][1] == STATUS_FAILURE else f"was {locked[0][1]}"


def _lock_queued(conn: Any, dialect: str, tables: Tables, params: dict[str, Any]) -> Done | None:
    """None once the queued job is locked here; else why not: a worker runs it, or it is not queued."""
    if _run(conn, dialect, tables, "lock_queued", params)[0]:
        return None
    rows = _run(conn, dialect, tables, "queued_exists", params)[0]
    if rows and int(rows[0][0]):
        return "running", ""
    return _elsewhere(conn, dialect, tables, params)


def _cancel_one(conn: Any, dialect: str, tables: Tables, stored_id: Any, finished_at: Any) -> Done:
    params = {"job_id": stored_id, "status": STATUS_CANCELLED, "finished_at": finished_at}
    refused = _lock_queued(conn, dialect, tables, params)
    if refused is not None:
        return refused
    _run(conn, dialect, tables, "archive_cancelled", params)
    _run(conn, dialect, tables, "delete_queued", params)
    return "cancelled", ""


def _reschedule_one(conn: Any, dialect: str, tables: Tables, stored_id: Any, process_at: Any) -> Done:
    params = {"job_id": stored_id, "process_at": process_at}
    refused = _lock_queued(conn, dialect, tables, params)
    if refused is not None:
        return refused
    _run(conn, dialect, tables, "reschedule_queued", params)
    return "rescheduled", ""


def _apply(
    conn: Any,
    job_ids: Iterable[Any],
    one: Callable[[Any, str, Tables, Any, Any], Done],
    value: Any,
    *,
    tables: Tables,
    dialect: str,
    on_result: Callable[[Result], None] | None,
) -> list[Result]:
    """`one` on each job in a transaction of its own, so that each job's outcome is its own.

    A transaction holds the rows of one job only, so two operators working on the same jobs in any order
    wait for each other a job at a time and never deadlock. A job the database refuses (a conflict: the id
    is queued already, a deadlock with a worker, a lock wait timeout) is rolled back alone and reported as
    "conflict" with the database's reason; any other error stops the operation and is raised, every job
    before it done and committed.
    """
    results: list[Result] = []
    parsed = list(dict.fromkeys(parse_job_id(job_id) for job_id in job_ids))  # all checked first
    require_no_transaction(conn, dialect, "changing jobs")
    for job_id in parsed:
        try:
            with _id_kind_checked([job_id]):
                outcome, detail = one(conn, dialect, tables, encode_job_id(dialect, job_id), value)
            conn.commit()
        except Exception as exc:
            conn.rollback()
            reason = conflict_reason(exc)
            if reason is None:
                raise
            outcome, detail = "conflict", reason
        except BaseException:
            conn.rollback()
            raise
        finally:
            ended(conn)
        result = Result(job_id, outcome, detail)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def retry_jobs(
    conn: Any,
    job_ids: Iterable[Any],
    *,
    process_at: datetime | None = None,
    tables: Tables | None = None,
    dialect: str | None = None,
    clock: Clock | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Move archived :failure (or :cancelled) jobs back to the job table: same id, attempts 0, due at
    `process_at` or now.

    A :cancelled job is taken too, which undoes a cancel. A job that is not archived as either is left
    alone and says where it is ("queued", "not-retryable" with its status, "not-found": a concurrent retry
    may have moved it first); two retries of one job at once leave exactly one queued job.
    """
    active = dialect_of(conn, dialect)
    now = now_from(clock or system_utc)
    when = db_time(active, to_process_at(now, process_at, None))
    return _apply(
        conn,
        job_ids,
        _retry_one,
        when,
        tables=tables or Tables.of(),
        dialect=active,
        on_result=on_result,
    )


def cancel_jobs(
    conn: Any,
    job_ids: Iterable[Any],
    *,
    tables: Tables | None = None,
    dialect: str | None = None,
    clock: Clock | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Archive queued jobs as :cancelled (attempts unchanged) and remove them from the job table.

    A job a worker is running holds its row lock: it is skipped, never waited for, and reported "running".
    """
    active = dialect_of(conn, dialect)
    finished_at = db_time(active, now_from(clock or system_utc))
    return _apply(
        conn,
        job_ids,
        _cancel_one,
        finished_at,
        tables=tables or Tables.of(),
        dialect=active,
        on_result=on_result,
    )


def reschedule_jobs(
    conn: Any,
    job_ids: Iterable[Any],
    process_at: datetime,
    *,
    tables: Tables | None = None,
    dialect: str | None = None,
    clock: Clock | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Set process_at of queued jobs (a past time means now); jobs being run are skipped as "running"."""
    active = dialect_of(conn, dialect)
    now = now_from(clock or system_utc)
    when = db_time(active, to_process_at(now, process_at, None))
    return _apply(
        conn,
        job_ids,
        _reschedule_one,
        when,
        tables=tables or Tables.of(),
        dialect=active,
        on_result=on_result,
    )


@dataclass(frozen=True, slots=True)
class PurgeFilter:
    """Archived rows finished more than `older_than` ago, optionally of one queue or status ("archived",
    like None, is every status)."""

    older_than: timedelta
    queue: str | None = None
    status: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.older_than, timedelta) or self.older_than < timedelta(0):
            raise ConfigurationError(f"older_than must be a timedelta >= 0, got {self.older_than!r}")
        if self.queue is not None:
            object.__setattr__(self, "queue", to_keyword_text(self.queue, what="queue"))
        if self.status == ARCHIVED:
            object.__setattr__(self, "status", None)
        if self.status is not None:
            object.__setattr__(self, "status", to_keyword_text(self.status, what="status"))

    def params(self, dialect: str, now: datetime) -> dict[str, Any]:
        return {
            "before": db_time(dialect, now - self.older_than),
            "queue": self.queue,
            "any_queue": self.queue is None,
            "status": self.status,
            "any_status": self.status is None,
        }


def purge_count(
    conn: Any,
    purge: PurgeFilter,
    *,
    tables: Tables | None = None,
    dialect: str | None = None,
    clock: Clock | None = None,
) -> int:
    """How many archived rows `purge_archive` would delete now."""
    active = dialect_of(conn, dialect)
    params = purge.params(active, now_from(clock or system_utc))
    try:
        rows = query(conn, active, render(active, "ops.sql", "purge_count", tables or Tables.of()), params)
    finally:
        end_read(conn)
    return int(rows[0][0]) if rows else 0


def purge_archive(
    conn: Any,
    purge: PurgeFilter,
    *,
    tables: Tables | None = None,
    dialect: str | None = None,
    clock: Clock | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Delete the rows `purge` selects, `batch_size` at a time, each batch its own short transaction.

    The batches walk the archive's primary key once: each finds its rows by key order after the last
    batch's, then deletes them by key. On MySQL each batch runs at READ COMMITTED and locks only the rows it
    deletes, so workers archiving meanwhile never wait for it; on PostgreSQL rows another purge is deleting
    are skipped. The cut-off is fixed when the call starts. Returns the rows deleted; `on_batch` gets the
    running total.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    active = dialect_of(conn, dialect)
    tables = tables or Tables.of()
    params: dict[str, Any] = {
        **purge.params(active, now_from(clock or system_utc)),
        "batch": batch_size,
        "first_batch": True,
        "after_id": None,
    }
    total = 0
    require_no_transaction(conn, active, "purge")
    # Looked up once: an archived job's error history goes in the transaction that deletes the job.
    try:
        errors = _error_store(active, tables) if has_error_history(conn, active, tables) else None
    finally:
        end_read(conn)
    while True:
        read_committed_next(conn, active)
        try:
            found = [row[0] for row in _run(conn, active, tables, "purge_ids", params)[0]]
            deleted = 0
            if found:
                ids = found if active == "postgresql" else tuple(found)
                deleted = int(_run(conn, active, tables, "purge_batch", {**params, "job_ids": ids})[1])
                if errors is not None:
                    errors.purge(conn, found)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            ended(conn)
        total += max(deleted, 0)
        if on_batch is not None:
            on_batch(total)
        if len(found) < batch_size:
            return total
        params.update(first_batch=False, after_id=found[-1])
