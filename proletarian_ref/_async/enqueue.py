"""Enqueueing on the caller's connection, one job or a batch: the I/O of both APIs' enqueue and enqueue_many.

The source of both: `python -m tools.generate_sync` makes proletarian_ref/_sync/enqueue.py (what
proletarian_ref.enqueue and enqueue_many are) from this module (what proletarian_ref.aio's are). What
involves no I/O (options checked and defaulted, rows built, payloads encoded, JobSpec) is job.py's plain
functions, which both call: a row does not tell which API wrote it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from proletarian_ref._async.unique_claims import enqueued_before
from proletarian_ref.backend import AsyncBackend, JobRecord
from proletarian_ref.backends import abackend_for_connection, acaller_connection
from proletarian_ref.clock import Clock
from proletarian_ref.errors import ProletarianError
from proletarian_ref.job import (
    DEFAULT_NOTIFY,
    JobSpec,
    _Enqueuing,
    _enqueuing,
    _job_record,
    _raise_at_index,
    _record_stream,
    announced_queues,
    batch_unique_keys,
)
from proletarian_ref.job_ids import JobIdStrategy
from proletarian_ref.keywords import DEFAULT_QUEUE
from proletarian_ref.serializers import Serializer
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName
from proletarian_ref.unique import UniqueKey, unique_key_of


async def enqueue(
    conn: Any,
    job_type: str,
    payload: Any,
    *,
    queue: str = DEFAULT_QUEUE,
    process_at: datetime | None = None,
    process_in: timedelta | None = None,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    serializer: Serializer | None = None,
    job_id_strategy: JobIdStrategy | None = None,
    clock: Clock | None = None,
    backend: AsyncBackend | None = None,
    notify: bool = DEFAULT_NOTIFY,
    unique_key: str | UniqueKey | None = None,
) -> Any:
    """Insert one job on `conn` within its current transaction, never committing; return the job id.

    `conn` is an open connection: for proletarian_ref.enqueue a DB-API one (psycopg 3, PyMySQL or
    mysqlclient) or a SQLAlchemy Session or Connection; for proletarian_ref.aio.enqueue (awaited) a psycopg
    AsyncConnection, an asyncpg connection, an aiomysql Connection or a SQLAlchemy AsyncSession or
    AsyncConnection (the job joins its transaction, docs/sqlalchemy.md); or any connection a backend accepts
    with `backend=`.
    Everything is checked and encoded before the INSERT, so bad input never leaves a half-written job, and
    both APIs write the same row. `archived_job_table` is the archive the queue's workers use (the
    worker's default unless given): a backend with limited columns (MySQL) refuses a payload that either
    table's payload column cannot hold.
    With `notify`, a job due now is announced to listening workers in the same transaction (PostgreSQL
    NOTIFY: sent at commit, never on rollback); a backend that cannot announce ignores it.
    With `unique_key` (a str or a UniqueKey), at most one job per key is live: the key is taken in the
    caller's transaction, and a key a live job holds returns that job's id instead (or raises
    UniqueKeyHeldError, per UniqueKey.conflict); docs/unique.md.
    """
    conn, setup = await _enqueuing_on(
        conn, job_table, archived_job_table, serializer, job_id_strategy, clock, backend, notify
    )
    active: AsyncBackend = setup.backend
    job_id, record = _job_record(conn, setup, job_type, payload, queue, process_at, process_in)
    if setup.awaited_check is not None:
        await setup.awaited_check(conn, setup.table, setup.archive, record.payload)
    if unique_key is not None:
        key = unique_key_of(unique_key)
        decode = setup.strategy.decode_id
        held = await enqueued_before(conn, active, setup.table, decode, setup.now, [key], [record.job_id])
        if held[0] is not None:
            return held[0]
    stored_id = await active.enqueue(conn, setup.table, record)
    if notify:
        await _announce(conn, setup, (record,))
    return job_id if job_id is not None else setup.strategy.decode_id(stored_id)


async def enqueue_many(
    conn: Any,
    jobs: Iterable[JobSpec | tuple[str, Any]],
    *,
    queue: str = DEFAULT_QUEUE,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    serializer: Serializer | None = None,
    job_id_strategy: JobIdStrategy | None = None,
    clock: Clock | None = None,
    backend: AsyncBackend | None = None,
    notify: bool = DEFAULT_NOTIFY,
) -> list[Any]:
    """Insert `jobs` on `conn` within its current transaction, never committing; return their ids in order.

    Each row is the one enqueue would write for that job, with one `now` (the clock is read once) for the
    whole batch. `jobs` is read whole before any SQL runs. A bad job raises the error enqueue would, with
    `index` set to its position and the message starting `jobs[index]:`, and writes no job of the batch:
    the backend gets the jobs checked and encoded one by one as it writes them (its `enqueue_stream`,
    which undoes what it wrote and leaves `conn` as it was), or all of them before any SQL runs (its
    `enqueue_many`). A backend with neither gets an `enqueue` per job. A JobSpec's unique_key is claimed
    as enqueue claims it: a job whose key a live job holds is answered with that job's id. With `notify`,
    one announcement for the batch (per queue with a job due now) follows the INSERT, as for enqueue.
    """
    conn, setup = await _enqueuing_on(
        conn, job_table, archived_job_table, serializer, job_id_strategy, clock, backend, notify
    )
    # The caller's iterable is read before any SQL: a generator of theirs may use the connection.
    items = jobs if type(jobs) is list or type(jobs) is tuple else list(jobs)
    if any(type(item) is JobSpec and item.unique_key is not None for item in items):
        return await _enqueue_many_unique(conn, setup, items, queue, notify)
    ids: list[Any] = []
    records: list[JobRecord] = []
    # StreamEnqueue is optional (and threaded only); getattr, as isinstance of a runtime Protocol costs
    # more than a batch's set-up.
    stream = getattr(setup.backend, "enqueue_stream", None)
    if stream is not None and setup.awaited_check is None:
        if not items:
            return []
        stored = await stream(conn, setup.table, _record_stream(conn, setup, items, queue, ids, records))
        if len(records) != len(items):
            raise ProletarianError(
                f"{type(setup.backend).__name__}.enqueue_stream returned after {len(records)} of "
                f"{len(items)} jobs; the rest were not enqueued"
            )
    else:
        for _ in _record_stream(conn, setup, items, queue, ids, records):
            pass
        if not records:
            return []
        await _awaited_checks(conn, setup, records)
        stored = await _insert(conn, setup, records)
    if notify:
        await _announce(conn, setup, records)
    if ids[0] is not None:
        return ids
    return [setup.strategy.decode_id(value) for value in stored]


async def _enqueuing_on(
    conn: Any,
    job_table: str | TableName,
    archived_job_table: str | TableName,
    serializer: Serializer | None,
    job_id_strategy: JobIdStrategy | None,
    clock: Clock | None,
    backend: AsyncBackend | None,
    notify: bool,
) -> tuple[Any, _Enqueuing]:
    """The driver connection to write on (the one under a SQLAlchemy session, in its transaction) and the
    call's checked options, its backend found for that connection unless given."""
    conn = await acaller_connection(conn)
    setup = _enqueuing(
        conn,
        job_table,
        archived_job_table,
        serializer,
        job_id_strategy,
        clock,
        backend,
        notify,
        abackend_for_connection,
    )
    return conn, setup


async def _enqueue_many_unique(
    conn: Any, setup: _Enqueuing, items: Sequence[JobSpec | tuple[str, Any]], queue: str, notify: bool
) -> list[Any]:
    """enqueue_many of a batch with unique keys: the keys claimed (unique.py), then the jobs they allow."""
    ids: list[Any] = []
    records: list[JobRecord] = []
    keys = batch_unique_keys(items)
    for _ in _record_stream(conn, setup, items, queue, ids, records):
        pass
    await _awaited_checks(conn, setup, records)
    decode = setup.strategy.decode_id
    new_ids = [record.job_id for record in records]
    held = await enqueued_before(conn, setup.backend, setup.table, decode, setup.now, keys, new_ids)
    new = [record for record, holder in zip(records, held, strict=True) if holder is None]
    if new:
        await _insert(conn, setup, new)
        if notify:
            await _announce(conn, setup, new)
    return [own if holder is None else holder for own, holder in zip(ids, held, strict=True)]


async def _awaited_checks(conn: Any, setup: _Enqueuing, records: Sequence[JobRecord]) -> None:
    """The backend's awaited check_payload of each job (none in threaded code), a bad one named by index."""
    if setup.awaited_check is None:
        return
    for index, record in enumerate(records):
        try:
            await setup.awaited_check(conn, setup.table, setup.archive, record.payload)
        except ProletarianError as exc:
            _raise_at_index(exc, index)


async def _insert(conn: Any, setup: _Enqueuing, records: Sequence[JobRecord]) -> list[Any]:
    """`records` inserted in one statement (the optional BatchEnqueue) or one each; their stored ids."""
    active: AsyncBackend = setup.backend
    many = getattr(active, "enqueue_many", None)
    if many is not None:
        stored: list[Any] = await many(conn, setup.table, records)
        return stored
    return [await active.enqueue(conn, setup.table, record) for record in records]


async def _announce(conn: Any, setup: _Enqueuing, records: Iterable[JobRecord]) -> None:
    """Announce the queues of the jobs due now; a job for later would only wake a worker to find nothing."""
    # Notifications is optional. getattr, as isinstance of a runtime Protocol costs more than enqueue.
    notify_enqueued = getattr(setup.backend, "notify_enqueued", None)
    if notify_enqueued is None:
        return
    queues = announced_queues(setup, records)
    if queues:
        await notify_enqueued(conn, setup.table, queues)
