"""current_job(): a handler's writes and follow-up jobs in the job's own claim transaction."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, suppress
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from proletarian_ref.backend import AsyncBackend, AsyncBatchClaim
from proletarian_ref.errors import DatabaseError, JobTransactionError, TransientDatabaseError
from proletarian_ref.job import _enqueuing, _job_record, announced_queues
from proletarian_ref.job_tx import CURRENT, GuardedConnection, connection_is_lost, transaction_is_open
from proletarian_ref.keywords import DEFAULT_QUEUE
from proletarian_ref.worker_settings import _GivenBack

if TYPE_CHECKING:
    from proletarian_ref.job import Job
    from proletarian_ref.worker_settings import JobSettings

__all__ = ["JobTransaction", "current_job"]


class JobTransaction:
    """The job a handler runs, and the claim transaction it runs in (current_job()).

    `connection()` and `enqueue()` open a savepoint in the job's transaction the first time either is
    called, so that what the handler writes commits with the job's archive row, and rolls back alone when
    the job fails, is retried or given back (docs/job-transaction.md). A handler that asks for neither
    costs nothing.
    """

    def __init__(self, backend: AsyncBackend, conn: Any, settings: JobSettings, job: Job) -> None:
        self.job = job
        self._backend = backend
        self._conn = conn
        self._settings = settings
        self._savepoint: AbstractAsyncContextManager[None] | None = None
        self._view: GuardedConnection | None = None
        self._done = False

    async def connection(self) -> Any:
        """The job's driver connection, inside its transaction, guarded: commit, rollback, close and
        autocommit raise JobTransactionError. Writes on it commit in the same commit as the archive row."""
        if self._done:
            raise JobTransactionError("current_job() was used after its handler returned")
        if self._view is None:
            savepoint = getattr(self._backend, "savepoint", None)
            if savepoint is None:
                raise JobTransactionError(
                    f"the backend {type(self._backend).__name__} has no savepoint (BatchClaim), so a "
                    "handler cannot write in the job's transaction on it"
                )
            opened = cast(AsyncBatchClaim, self._backend).savepoint(self._conn)
            await opened.__aenter__()
            self._savepoint = opened
            self._view = GuardedConnection(self._conn)
        return self._view

    async def enqueue(
        self,
        job_type: str,
        payload: Any,
        *,
        queue: str = DEFAULT_QUEUE,
        process_at: datetime | None = None,
        process_in: timedelta | None = None,
        job_table: str | None = None,
        notify: bool = False,
    ) -> Any:
        """enqueue on the job's transaction: the follow-up job exists if and only if this job is archived
        as a success. The worker's job table, serializer, id strategy and clock unless told."""
        await self.connection()
        settings = self._settings
        setup = _enqueuing(
            self._conn,
            job_table if job_table is not None else settings.job_table,
            settings.archived_job_table,
            settings.serializer,
            settings.job_id_strategy,
            settings.clock,
            cast(Any, self._backend),
            notify,
        )
        job_id, record = _job_record(self._conn, setup, job_type, payload, queue, process_at, process_in)
        stored_id = await self._backend.enqueue(self._conn, setup.table, record)
        if notify and hasattr(self._backend, "notify_enqueued"):
            queues = announced_queues(setup, (record,))
            if queues:
                await cast(Any, self._backend).notify_enqueued(self._conn, setup.table, queues)
        return job_id if job_id is not None else setup.strategy.decode_id(stored_id)

    async def finish(self, outcome: Exception | _GivenBack | None) -> Exception | _GivenBack | None:
        """After the handler: keep its writes (success) or undo them (failure, given back), and make sure
        the transaction is still the worker's; returns `outcome`. Raises JobTransactionError when the
        handler ended the transaction behind the guard: nothing more may be written in it."""
        self._done = True
        if self._view is None or self._savepoint is None:
            return outcome
        self._view.end()
        # Read before the savepoint's statements, which would open a new transaction on a driver that
        # opens one by itself; the savepoint is still ended either way, so its generator is not left open.
        ended = transaction_is_open(self._conn) is False
        try:
            if outcome is None:
                await self._savepoint.__aexit__(None, None, None)
            else:
                error = outcome if isinstance(outcome, Exception) else JobTransactionError("given back")
                try:
                    await self._savepoint.__aexit__(type(error), error, error.__traceback__)
                except Exception as exc:
                    if exc is not error:
                        raise
        except DatabaseError as exc:
            lost = connection_is_lost(self._conn)
            if lost or (lost is None and isinstance(exc, TransientDatabaseError)):
                # The session itself is gone (killed, lost): the whole transaction rolls back (K1, H1).
                raise
            # The savepoint is gone: the handler committed or rolled back by SQL and went on in a new
            # transaction, which the driver's status alone cannot tell.
            raise self._ended(exc) from exc
        if ended:
            raise self._ended(None)
        return outcome

    async def abandon(self, error: BaseException) -> None:
        """The handler left with an error that rolls the whole transaction back (MemoryError, a
        cancellation, ...): later uses raise, and the savepoint is ended now, errors ignored. Left open, its
        generator would roll back to a savepoint of that name whenever it is collected, perhaps in a later
        job's transaction on the same connection."""
        self._done = True
        if self._view is not None:
            self._view.end()
        if self._savepoint is not None:
            # The transaction rolls back whatever happens here.
            with suppress(BaseException):
                await self._savepoint.__aexit__(type(error), error, error.__traceback__)

    def _ended(self, cause: Exception | None) -> JobTransactionError:
        how = "" if cause is None else f" (its savepoint is gone: {cause})"
        return JobTransactionError(
            f"the handler of job {self.job.job_id} ({self.job.job_type}) ended the job's transaction"
            f"{how}: what it committed stays, nothing else of the job is written, and the job stays "
            "queued with its attempts unchanged"
        )


def current_job() -> JobTransaction:
    """The job this handler runs, with its transaction (docs/job-transaction.md); raises outside one."""
    current = CURRENT.get()
    if isinstance(current, JobTransaction):
        return current
    if current is None:
        raise JobTransactionError("current_job() is only available inside a job's handler")
    raise JobTransactionError(
        "current_job() here is the other worker's: proletarian_ref.current_job() on the threaded worker, "
        "proletarian_ref.aio.current_job() (awaited methods) on the asyncio one"
    )
