"""The backend protocol: Proletarian's database verbs, the one boundary between the core and a driver."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

from proletarian_ref.tables import TableName

STATUS_SUCCESS: Final = ":success"
STATUS_FAILURE: Final = ":failure"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can promise; the conformance suite reads it instead of guessing."""

    skip_locked: bool = True
    # The smallest step a stored timestamp keeps: MySQL TIMESTAMP keeps whole seconds.
    time_precision: timedelta = timedelta(microseconds=1)
    # Whether enqueue joins the caller's transaction, so a rollback leaves no job.
    transactional_enqueue: bool = True
    # Whether separate OS processes can share the queue (an in-memory store cannot).
    multi_process: bool = True
    # Whether a claim locks only the row it returns. InnoDB also locks the index record where the scan
    # stops, so an empty poll of one queue can hide the oldest job of the next queue in index order for
    # the length of that poll's transaction (MySQL and MariaDB, Proletarian included).
    claim_locks_only_the_claimed_row: bool = True
    # Whether a handler can write in the job's claim transaction (current_job().connection()): the
    # backend's savepoint isolates the handler's writes, and its sessions can be killed (conformance H1).
    handler_transaction: bool = False


class JobRecord(NamedTuple):
    """A row of the job table as stored: ids in their database form, queue and type as keyword text.

    A NamedTuple rather than a frozen dataclass: it is made for every job claimed, and a frozen
    dataclass costs three times as much to build.
    """

    job_id: Any
    queue: str
    job_type: str
    payload: str
    attempts: int
    enqueued_at: datetime
    process_at: datetime


@dataclass(frozen=True, slots=True)
class ArchivedJobRecord:
    """A row of the archived job table."""

    job_id: Any
    queue: str
    job_type: str
    payload: str
    attempts: int
    status: str
    enqueued_at: datetime
    process_at: datetime
    finished_at: datetime


@runtime_checkable
class Backend(Protocol):
    """A database behind Proletarian's five statements.

    Every method but `transaction` and `close` takes the connection that `transaction` yielded (or, for
    `enqueue`, the caller's own connection) and never commits. Timestamps in and out are aware UTC
    datetimes; the core reads the clock and passes `now` in. Driver errors leave as
    `proletarian_ref.errors.DatabaseError`, `TransientDatabaseError` for those expected to pass.

    Two optional methods, looked up by name: `release_connection(thread_id) -> bool` abandons the open
    transaction of that thread only (QueueWorker.stop() releases its stuck threads' jobs with it, on a
    backend other workers may share), and `close_thread_connection()` closes the connection the calling
    thread kept (each worker thread calls it as it ends). A backend is closed only by whoever built it.
    """

    @property
    def dialect(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def transaction(self) -> AbstractContextManager[Any]:
        """A connection in a transaction that commits when the block ends and rolls back on error."""
        ...

    def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any:
        """(E) Insert `job`; returns the stored id (the database's own when `job.job_id` is None)."""
        ...

    def get_next_job(self, conn: Any, job_table: TableName, queue: str, now: datetime) -> JobRecord | None:
        """(S) Lock and return the due job of `queue` with the oldest process_at, skipping locked rows."""
        ...

    def archive_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        """(A) Copy the job to the archive with attempts + 1, `status` and `finished_at`."""
        ...

    def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        """(D) Delete the job."""
        ...

    def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None:
        """(R) Set process_at to `retry_at` and add one to attempts."""
        ...

    def close(self) -> None:
        """Release what the backend holds (connections kept for worker threads)."""
        ...


@runtime_checkable
class PayloadLimits(Protocol):
    """What a backend whose payload column has a size limit adds; enqueue calls it before the INSERT.

    Optional: a backend without it stores any payload the database takes (PostgreSQL TEXT: up to 1 GB).
    """

    def check_payload(
        self, conn: Any, job_table: TableName, archived_job_table: TableName | None, payload: str
    ) -> None:
        """Raise PayloadTooLargeError if `payload` does not fit either table's payload column."""
        ...


@runtime_checkable
class BatchEnqueue(Protocol):
    """What a backend that inserts many jobs at once adds; enqueue_many calls it with the whole batch,
    every job checked and encoded, unless the backend has StreamEnqueue too.

    Optional: without either enqueue_many calls `enqueue` once per job, so a backend written before them
    keeps working (then a database error part-way leaves the earlier jobs in the caller's transaction).
    """

    def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]:
        """(E) Insert `jobs` on the caller's connection, never committing; the stored ids, in order.

        Either every `job_id` is None (the database makes them) or none is. A time or id the backend
        cannot store raises before any SQL runs.
        """
        ...


@runtime_checkable
class ArchiveAndDelete(Protocol):
    """What a backend with a compact statement plan adds: a finished job's archive and delete in one go.

    Optional, and not Proletarian's plan: the core calls `archive_and_delete_job` instead of `archive_job`
    then `delete_job` only when `compact_plan` is True (proletarian_ref._sync.job_run.archive_and_delete),
    so a backend written before it, or one with the plan off, runs Proletarian's five statements. Batch
    mode's archive and delete of a whole batch take the plan too where the backend also has
    BatchArchiveAndDelete.
    """

    @property
    def compact_plan(self) -> bool: ...

    def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None:
        """(A) and (D) in one round trip: the same archived row as archive_job writes, and the job deleted.

        Raises, before the transaction can commit, unless exactly one row was archived and one deleted.
        """
        ...


@runtime_checkable
class ChainedClaim(Protocol):
    """What a backend whose worker chains a finished job's commit to the next claim adds.

    Optional, and not Proletarian's plan, whose worker leaves each job's transaction and polls again in a
    new one. Only when `chained_claims` is True, a queue worker at one job a transaction, once it has
    archived a job and is not stopping, calls `commit_and_get_next_job` inside the same `transaction()`
    block instead (proletarian_ref._sync.job_run.run_next_job): the job's transaction commits, and the
    next claim runs in a new transaction on the same connection, the COMMIT and the BEGIN sent together.
    Every job still has a transaction of its own, claim to commit, with its handler's writes and its
    archive row in it; the block's end commits (or its error rolls back) the last one only.
    """

    @property
    def chained_claims(self) -> bool: ...

    def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        """Commit the transaction `conn` is in, begin another on it, and (S) in that one: the due job of
        `queue` with the oldest process_at, locked until the new transaction ends, or None.

        A failed commit raises and nothing of the transaction is committed; the claim is then not run.
        The new transaction is the block's as the first was: the block ends it.
        """
        ...


class ChainedBatchClaim(ChainedClaim, Protocol):
    """What a backend with BatchClaim and ChainedClaim adds so that batch mode chains too.

    Only when `chained_claims` is True, a queue worker in batch mode whose batch finished whole (every
    job archived or its failure written, none given back) and that is not stopping calls
    `commit_and_get_next_jobs` inside the same `transaction()` block (proletarian_ref._sync.job_run.
    run_next_batch): the batch's transaction commits and the next batch is claimed in a new one. A backend
    with ChainedClaim but without this method chains single jobs only.
    """

    def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        """commit_and_get_next_job's commit and new transaction, then BatchClaim's `get_next_jobs` in it."""
        ...


@runtime_checkable
class StreamEnqueue(Protocol):
    """What a backend that writes a batch while its jobs are still being made adds; enqueue_many calls it
    instead of BatchEnqueue's `enqueue_many` when it is there.

    Optional: BatchEnqueue alone gets the whole batch checked and encoded before any SQL runs. With this,
    the backend may start writing before the last job is made, so the database takes the first rows in
    while the client makes the next ones.
    """

    def enqueue_stream(self, conn: Any, job_table: TableName, jobs: Iterator[JobRecord]) -> list[Any]:
        """(E) Insert the jobs `jobs` yields on the caller's connection, never committing; the stored ids,
        in order. enqueue_many calls it with at least one job.

        `jobs` makes each job as it is read, and reading it may raise the error of a bad job (the
        library's own, its `index` set); a time or id the backend cannot store may also raise part-way.
        Either way the error goes on unchanged, no row of the batch stays written, and the caller's
        connection is left as it was before the call: a transaction it had open still usable with its
        earlier writes, and nothing of the backend's own (a savepoint, say) left in it. The backend
        reads `jobs` to the end before it returns. Either every `job_id` is None or none is. Reading
        `jobs` calls the backend's own `check_payload` (PayloadLimits), if it has one, for each job.
        """
        ...


@runtime_checkable
class BatchClaim(Protocol):
    """What a backend that runs a queue worker's batch mode adds (create_queue_worker's batch_size > 1).

    Optional: without it batch_size must stay 1, and create_queue_worker says so naming the backend.
    Every method takes the connection `transaction` yielded and never commits.
    """

    def get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]:
        """(S) for a batch: lock and return up to `limit` due jobs of `queue`, oldest process_at first,
        skipping locked rows."""
        ...

    def archive_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        """(A) for a batch, one statement: archive_job of every job of `job_ids`, or raise and write none."""
        ...

    def delete_jobs(self, conn: Any, job_table: TableName, job_ids: Sequence[Any]) -> None:
        """(D) for a batch, as one statement: delete every job of `job_ids`, or raise and delete none."""
        ...

    def savepoint(self, conn: Any) -> AbstractContextManager[None]:
        """A savepoint around one job's writes: an error in the block undoes what the block wrote (and only
        that), leaving the transaction usable; the error goes on."""
        ...


@runtime_checkable
class BatchArchiveAndDelete(Protocol):
    """What a backend whose compact plan serves batch mode too adds (BatchClaim and ArchiveAndDelete both).

    Optional: the core calls `archive_and_delete_jobs` at the end of a batch instead of `archive_jobs` then
    `delete_jobs` only when `compact_plan` is True and the backend has it (job_run.archive_and_delete_jobs),
    so a backend with batch mode but without it runs the two batch statements, compact plan or not.
    """

    def archive_and_delete_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None:
        """(A) and (D) for a batch in one round trip: the same archived rows as archive_jobs writes, and
        the jobs deleted. Raises, before the transaction can commit, unless every job of `job_ids` was
        archived and deleted."""
        ...


class Listener(Protocol):
    """A connection listening for the enqueue notifications of one job table, kept by one thread."""

    # False when a test notification, sent through the backend's own connections as enqueuers send
    # theirs, did not reach this listener in time: behind PgBouncer in transaction mode, for one, LISTEN
    # holds on no server session. Polling still runs the jobs.
    confirmed: bool

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; True if a job of the listened queue was announced meanwhile.

        False at once after interrupt(). Raises DatabaseError if the connection breaks; the caller
        closes it and listens anew.
        """
        ...

    def interrupt(self) -> None:
        """From another thread: end the wait in progress, and every later one, at once (stop())."""
        ...

    def close(self) -> None:
        """Stop listening and close the listener's connection."""
        ...


@runtime_checkable
class Notifications(Protocol):
    """What a backend that can announce enqueued jobs adds (PostgreSQL NOTIFY, the in-memory backend).

    Optional, looked up by name: enqueue with notify=True and a worker with wake_on_notify=True do
    nothing more on a backend without it (MySQL), and polling runs the jobs as before.
    """

    def notify_enqueued(self, conn: Any, job_table: TableName, queues: Sequence[str]) -> None:
        """Announce jobs of `queues` (keyword text) in `conn`'s transaction: delivered at its commit only."""
        ...

    def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> Listener:
        """A new Listener for `queue` of `job_table`, on a connection of its own.

        From `data_source` when given (a factory or a pool, e.g. a direct DSN behind a pooler), else from
        the backend's own data source.
        """
        ...


# -- asyncio: the same verbs awaited (proletarian_ref.aio) -----------------------------------------------
#
# Each method has the name, arguments, result and promise of its Backend namesake above, and is a
# coroutine; `transaction` and `savepoint` are async context managers. The asyncio job transaction
# (proletarian_ref._async.job_run) is written against these, and the threaded one is generated from it.


@runtime_checkable
class AsyncBackend(Protocol):
    """Backend, awaited: what proletarian_ref.aio's enqueue and queue worker run on."""

    @property
    def dialect(self) -> str: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def transaction(self) -> AbstractAsyncContextManager[Any]: ...

    async def enqueue(self, conn: Any, job_table: TableName, job: JobRecord) -> Any: ...

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None: ...

    async def archive_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None: ...

    async def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None: ...

    async def retry_at(self, conn: Any, job_table: TableName, job_id: Any, retry_at: datetime) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class AsyncBatchEnqueue(Protocol):
    """BatchEnqueue, awaited."""

    async def enqueue_many(self, conn: Any, job_table: TableName, jobs: Sequence[JobRecord]) -> list[Any]: ...


@runtime_checkable
class AsyncBatchClaim(Protocol):
    """BatchClaim, awaited."""

    async def get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]: ...

    async def archive_jobs(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_ids: Sequence[Any],
        status: str,
        finished_at: datetime,
    ) -> None: ...

    async def delete_jobs(self, conn: Any, job_table: TableName, job_ids: Sequence[Any]) -> None: ...

    def savepoint(self, conn: Any) -> AbstractAsyncContextManager[None]: ...


@runtime_checkable
class AsyncArchiveAndDelete(Protocol):
    """ArchiveAndDelete, awaited."""

    @property
    def compact_plan(self) -> bool: ...

    async def archive_and_delete_job(
        self,
        conn: Any,
        job_table: TableName,
        archived_job_table: TableName,
        job_id: Any,
        status: str,
        finished_at: datetime,
    ) -> None: ...


@runtime_checkable
class AsyncChainedClaim(Protocol):
    """ChainedClaim, awaited."""

    @property
    def chained_claims(self) -> bool: ...

    async def commit_and_get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None: ...


class AsyncChainedBatchClaim(AsyncChainedClaim, Protocol):
    """ChainedBatchClaim, awaited."""

    async def commit_and_get_next_jobs(
        self, conn: Any, job_table: TableName, queue: str, now: datetime, limit: int
    ) -> list[JobRecord]: ...


class AsyncListener(Protocol):
    """Listener, awaited: `wait` a coroutine; `interrupt` and `confirmed` as Listener's."""

    confirmed: bool

    async def wait(self, timeout: float) -> bool: ...

    def interrupt(self) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class AsyncNotifications(Protocol):
    """Notifications, awaited."""

    async def notify_enqueued(self, conn: Any, job_table: TableName, queues: Sequence[str]) -> None: ...

    async def listen(self, job_table: TableName, queue: str, data_source: Any = None) -> AsyncListener: ...


def is_async_backend(backend: object) -> bool:
    """Whether `backend` awaits its verbs (an AsyncBackend): the protocols alone cannot tell, their
    methods having the same names."""
    return inspect.iscoroutinefunction(getattr(backend, "get_next_job", None))
