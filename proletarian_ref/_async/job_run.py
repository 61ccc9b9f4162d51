"""One poll's transaction: claim a job (or a batch), run its handler inside, archive, retry or give back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from proletarian_ref import log as ev
from proletarian_ref._acompat import AsyncHandlerFn, AsyncJobOver, asettle
from proletarian_ref._async.job_tx import JobTransaction
from proletarian_ref.backend import (
    STATUS_FAILURE,
    STATUS_SUCCESS,
    AsyncArchiveAndDelete,
    AsyncBackend,
    AsyncBatchClaim,
    AsyncChainedBatchClaim,
    AsyncChainedClaim,
    JobRecord,
)
from proletarian_ref.clock import Clock, now_from
from proletarian_ref.error_history import AsyncErrorStore, entry
from proletarian_ref.errors import FailedJobFnError, JobInterrupted, PayloadDecodeError
from proletarian_ref.job_tx import CURRENT
from proletarian_ref.log import LogFn, stdlib_logger
from proletarian_ref.retry import FailedJobFn, RetryData, RetryStrategyFn, parse_retry_strategy, retry_data
from proletarian_ref.tables import TableName
from proletarian_ref.worker_settings import GIVEN_BACK, JobSettings, _GivenBack, to_job

if TYPE_CHECKING:
    from proletarian_ref._acompat import AEvent
    from proletarian_ref.job import Job


async def run_next_job(
    backend: AsyncBackend,
    settings: JobSettings,
    handler_fn: AsyncHandlerFn,
    log: LogFn,
    context: Mapping[str, Any],
    stop_event: AEvent,
    may_handle: Callable[[Mapping[str, Any]], bool] | None = None,
    job_over: AsyncJobOver | None = None,
) -> bool | None:
    """One poll in one transaction: None when no job was due, else whether the worker may go on.

    The handler runs inside the claiming transaction, holding the row lock, exactly as Proletarian does.
    No claim starts once `stop_event` is set (the worker may have waited for its connection meanwhile),
    and a claimed job whose `may_handle(job context)` is false goes back untouched, its handler never
    called.

    With `job_over` on a backend whose `chained_claims` is True (ChainedClaim), a job that finished while
    the worker is not stopping is not the poll's last: its transaction commits and the next claim runs in a
    new one on the same connection (commit_and_get_next_job), `job_over()` is awaited, and the next job
    runs as the first did, until a claim finds no job due (None) or a job is not archived as a success.
    """
    chain_over = job_over if getattr(backend, "chained_claims", False) is True else None
    async with backend.transaction() as conn:
        if stop_event.is_set():
            return None
        record = await backend.get_next_job(conn, settings.job_table, settings.queue, settings.now())
        while record is not None:
            job, decode_error = to_job(record, settings)
            job_context = _job_context(context, job)
            if may_handle is not None and not may_handle(job_context):
                return False
            failure = await run_handler(
                backend, conn, settings, handler_fn, log, job, decode_error, job_context, stop_event
            )
            if failure is GIVEN_BACK:
                return False
            if failure is not None:
                await write_failure(backend, conn, settings, record, job, failure, log, job_context)
                return not stop_event.is_set()
            finished_at = settings.now()
            await archive_and_delete(
                backend,
                conn,
                settings.job_table,
                settings.archived_job_table,
                record.job_id,
                STATUS_SUCCESS,
                finished_at,
            )
            if chain_over is None or stop_event.is_set():
                return not stop_event.is_set()
            record = await cast(AsyncChainedClaim, backend).commit_and_get_next_job(
                conn, settings.job_table, settings.queue, settings.now()
            )
            await chain_over()
        return None


def _job_context(context: Mapping[str, Any], job: Job) -> dict[str, Any]:
    """The poller's log context with the claimed job's id, type and attempt."""
    return {**context, ev.JOB_ID: job.job_id, ev.JOB_TYPE: job.job_type, ev.ATTEMPT: job.attempts}


async def run_handler(
    backend: AsyncBackend,
    conn: Any,
    settings: JobSettings,
    handler_fn: AsyncHandlerFn,
    log: LogFn,
    job: Job,
    decode_error: PayloadDecodeError | None,
    job_context: Mapping[str, Any],
    stop_event: AEvent,
) -> Exception | _GivenBack | None:
    """handle_job with current_job() set for the handler: what it wrote in the job's transaction is kept
    when it finished and undone otherwise (JobTransaction.finish), which raises JobTransactionError if
    the handler ended the transaction itself."""
    tx = JobTransaction(backend, conn, settings, job)
    token = CURRENT.set(tx)
    try:
        outcome = await handle_job(settings, handler_fn, log, job, decode_error, job_context, stop_event)
    except BaseException as exc:
        await tx.abandon(exc)  # the whole transaction rolls back after this
        raise
    finally:
        CURRENT.reset(token)
    return await tx.finish(outcome)


async def handle_job(
    settings: JobSettings,
    handler_fn: AsyncHandlerFn,
    log: LogFn,
    job: Job,
    decode_error: PayloadDecodeError | None,
    job_context: Mapping[str, Any],
    stop_event: AEvent,
) -> Exception | _GivenBack | None:
    """Run one claimed job's handler and decide: None when it finished (its success archive is the caller's
    to write), the exception when it failed (write_failure's to write), GIVEN_BACK when the job goes back
    untouched (JobInterrupted, or a failure while the worker stops). MemoryError and RecursionError leave
    as they came, so the transaction rolls back."""
    # The default log function drops both events (INFO, log._LEVELS) unless someone listens at INFO:
    # one check per job instead of two calls that each find it out.
    quiet = log is stdlib_logger and not ev.logger.isEnabledFor(logging.INFO)
    try:
        if not quiet:
            log(ev.HANDLING_JOB, job_context)
        if decode_error is not None:
            raise decode_error
        if settings.handler_fn_mode == "advanced":
            await handler_fn(job)
        else:
            await handler_fn(job.job_type, job.payload)
        # Inside the try, as in Proletarian: a log function that raises here fails the job.
        if not quiet:
            log(ev.JOB_FINISHED, job_context)
    except JobInterrupted:
        log(ev.JOB_INTERRUPTED, job_context)
        return GIVEN_BACK
    except (MemoryError, RecursionError):
        # The JVM's OutOfMemoryError and StackOverflowError are Errors, not Exceptions: the process is
        # short of a resource, which is not the job's failure (docs/worker.md).
        raise
    except Exception as exc:
        if stop_event.is_set():
            log(ev.HANDLE_JOB_EXCEPTION_WITH_INTERRUPT, {ev.EXCEPTION: exc, **job_context})
            return GIVEN_BACK
        log(ev.HANDLE_JOB_EXCEPTION, {ev.EXCEPTION: exc, **job_context})
        return exc
    return None


async def write_failure(
    backend: AsyncBackend,
    conn: Any,
    settings: JobSettings,
    record: JobRecord,
    job: Job,
    exception: Exception,
    log: LogFn,
    job_context: Mapping[str, Any],
) -> None:
    """maybe_retry for a job whose handler failed: reschedule it, or archive it as a failure."""

    def job_log(event: str, data: Mapping[str, Any]) -> None:
        log(event, {**data, **job_context})

    # Looked up here, at the worker's first failure, in this job's transaction (ErrorHistory): a job that
    # succeeds, and a worker that has not failed one yet, send no statement for it.
    error_store = await settings.error_history.astore_in(backend, conn, settings.job_table)
    await maybe_retry(
        backend,
        conn,
        job_table=settings.job_table,
        archived_job_table=settings.archived_job_table,
        stored_job_id=record.job_id,
        job=job,
        exception=exception,
        retry_strategy_fn=settings.retry_strategy_fn,
        failed_job_fn=settings.failed_job_fn,
        clock=settings.clock,
        log=job_log,
        error_store=error_store,
        context=job_context,
    )


async def maybe_retry(
    backend: AsyncBackend,
    conn: Any,
    *,
    job_table: TableName,
    archived_job_table: TableName,
    stored_job_id: Any,
    job: Job,
    exception: BaseException,
    retry_strategy_fn: RetryStrategyFn,
    failed_job_fn: FailedJobFn,
    clock: Clock,
    log: Callable[[str, Mapping[str, Any]], None],
    error_store: AsyncErrorStore | None = None,
    context: Mapping[str, Any] | None = None,
) -> None:
    """Proletarian's maybe-retry!: reschedule the job, or archive it as a failure and call failed_job_fn.

    Runs inside the claiming transaction, so a raise from failed_job_fn (or an invalid strategy) rolls the
    archive back and leaves the job queued with attempts unchanged. With an `error_store` (the error
    history's side table, found at the worker's first failure) the attempt's error is written there too,
    in the same transaction: it commits with the retry or the failure archive and rolls back with them.
    """
    spec = await asettle(retry_strategy_fn(job, exception))
    strategy = parse_retry_strategy(spec)
    data = (
        RetryData(retries_left=0, retry_at=None)
        if strategy is None
        else retry_data(strategy, job.attempts, now_from(clock))
    )
    if data.retries_left > 0 and data.retry_at is not None:
        log(ev.RETRYING, {ev.RETRY_AT: data.retry_at, ev.RETRIES_LEFT: data.retries_left})
        await backend.retry_at(conn, job_table, stored_job_id, data.retry_at)
        if error_store is not None:
            await error_store.record(
                conn, entry(stored_job_id, job.attempts, exception, now_from(clock), context or {})
            )
        return
    log(ev.NOT_RETRYING, {ev.RETRY_SPEC: spec})
    finished_at = now_from(clock)
    await archive_and_delete(
        backend, conn, job_table, archived_job_table, stored_job_id, STATUS_FAILURE, finished_at
    )
    if error_store is not None:
        await error_store.record(
            conn, entry(stored_job_id, job.attempts, exception, finished_at, context or {})
        )
    try:
        await asettle(failed_job_fn(job, exception))
    except Exception as exc:
        raise FailedJobFnError(
            "An error occurred when executing the failed_job_fn function", job=job
        ) from exc


async def run_next_batch(
    backend: AsyncBackend,
    settings: JobSettings,
    handler_fn: AsyncHandlerFn,
    log: LogFn,
    context: Mapping[str, Any],
    stop_event: AEvent,
    may_handle: Callable[[Mapping[str, Any]], bool] | None = None,
    job_over: AsyncJobOver | None = None,
) -> bool | None:
    """One poll of batch mode: None when no job was due, else whether the worker may go on.

    Claims up to settings.batch_size due jobs (SKIP LOCKED, oldest first) and runs their handlers one after
    another inside that transaction. A failed job's retry or failure archive is written at once inside a
    savepoint; the finished jobs are archived and deleted together after the last handler (in one round trip
    on a backend's compact plan), and the transaction commits once. A job whose may_handle is false (the
    worker is stopping), that is given back (JobInterrupted), or whose failure writes fail (rolled back to
    its savepoint) ends the batch: it and the jobs after it are not written and go back to the queue when
    the commit releases their locks, while the jobs before it are written. The failure writes' error is
    raised after the commit, as run_next_job would raise it.

    With `job_over` on a backend whose `chained_claims` is True and that has ChainedBatchClaim, a batch
    that ended whole while the worker is not stopping is not the poll's last: its transaction commits and
    the next batch is claimed in a new one on the same connection (commit_and_get_next_jobs), `job_over()`
    is awaited, and the next batch runs as the first did, until a claim finds no job due (None).
    """
    claim = cast(AsyncBatchClaim, backend)  # create_queue_worker refuses batch_size > 1 without BatchClaim
    chain_over = (
        job_over
        if getattr(backend, "chained_claims", False) is True and hasattr(backend, "commit_and_get_next_jobs")
        else None
    )
    async with backend.transaction() as conn:
        if stop_event.is_set():
            return None
        records = await claim.get_next_jobs(
            conn, settings.job_table, settings.queue, settings.now(), settings.batch_size
        )
        while records:
            whole, write_error = await run_batch(
                backend, conn, settings, handler_fn, log, context, stop_event, may_handle, records
            )
            if not whole or chain_over is None or stop_event.is_set():
                break
            records = await cast(AsyncChainedBatchClaim, backend).commit_and_get_next_jobs(
                conn, settings.job_table, settings.queue, settings.now(), settings.batch_size
            )
            await chain_over()
        else:
            return None
    if write_error is not None:
        raise write_error
    return whole and not stop_event.is_set()


async def run_batch(
    backend: AsyncBackend,
    conn: Any,
    settings: JobSettings,
    handler_fn: AsyncHandlerFn,
    log: LogFn,
    context: Mapping[str, Any],
    stop_event: AEvent,
    may_handle: Callable[[Mapping[str, Any]], bool] | None,
    records: Sequence[JobRecord],
) -> tuple[bool, Exception | None]:
    """Run one claimed batch in `conn`'s transaction (run_next_batch): whether it ended whole, every job
    archived or its failure written, and the failure writes' error that ended it, if any."""
    claim = cast(AsyncBatchClaim, backend)
    whole = True
    write_error: Exception | None = None
    finished: list[Any] = []
    for record in records:
        job, decode_error = to_job(record, settings)
        job_context = _job_context(context, job)
        if may_handle is not None and not may_handle(job_context):
            whole = False
            break
        failure = await run_handler(
            backend, conn, settings, handler_fn, log, job, decode_error, job_context, stop_event
        )
        if failure is None:
            finished.append(record.job_id)
        elif failure is GIVEN_BACK:
            whole = False
            break
        else:
            try:
                async with claim.savepoint(conn):
                    try:
                        await write_failure(backend, conn, settings, record, job, failure, log, job_context)
                    except Exception as exc:
                        write_error = exc
                        raise
            except Exception as exc:
                if exc is not write_error:
                    raise  # the savepoint itself failed: the whole batch rolls back
                # Rolled back to the savepoint: this job stays as claimed, attempts unchanged. The
                # batch ends here, as run_next_job's transaction would; the jobs before it are written.
                whole = False
                break
    if finished:
        finished_at = settings.now()
        await archive_and_delete_jobs(
            backend,
            conn,
            settings.job_table,
            settings.archived_job_table,
            finished,
            STATUS_SUCCESS,
            finished_at,
        )
    return whole, write_error


async def archive_and_delete(
    backend: AsyncBackend,
    conn: Any,
    job_table: TableName,
    archived_job_table: TableName,
    job_id: Any,
    status: str,
    finished_at: datetime,
) -> None:
    """Archive then delete a finished job: Proletarian's two statements, or the backend's compact plan."""
    # getattr, not isinstance on the runtime-checkable protocol, which costs far more, on every job.
    if getattr(backend, "compact_plan", False) is True:
        await cast(AsyncArchiveAndDelete, backend).archive_and_delete_job(
            conn, job_table, archived_job_table, job_id, status, finished_at
        )
        return
    await backend.archive_job(conn, job_table, archived_job_table, job_id, status, finished_at)
    await backend.delete_job(conn, job_table, job_id)


async def archive_and_delete_jobs(
    backend: AsyncBackend,
    conn: Any,
    job_table: TableName,
    archived_job_table: TableName,
    job_ids: Sequence[Any],
    status: str,
    finished_at: datetime,
) -> None:
    """Archive then delete a batch's finished jobs: the two batch statements, or the backend's compact plan.

    `backend` has BatchClaim (create_queue_worker refuses batch mode without it).
    """
    if getattr(backend, "compact_plan", False) is True:
        combined = getattr(backend, "archive_and_delete_jobs", None)
        if combined is not None:
            await combined(conn, job_table, archived_job_table, job_ids, status, finished_at)
            return
    claim = cast(AsyncBatchClaim, backend)
    await claim.archive_jobs(conn, job_table, archived_job_table, job_ids, status, finished_at)
    await claim.delete_jobs(conn, job_table, job_ids)
