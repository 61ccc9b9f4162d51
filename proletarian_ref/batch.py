"""Batch mode of the queue worker: up to batch_size jobs claimed, run and written in one transaction."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

from proletarian_ref import log as ev
from proletarian_ref.backend import STATUS_SUCCESS, Backend, BatchClaim, archive_and_delete_jobs
from proletarian_ref.log import LogFn
from proletarian_ref.worker import (
    GIVEN_BACK,
    HandlerFn,
    JobSettings,
    _to_job,
    handle_job,
    write_failure,
)


def run_next_batch(
    backend: Backend,
    settings: JobSettings,
    handler_fn: HandlerFn,
    log: LogFn,
    context: Mapping[str, Any],
    stop_event: threading.Event,
    may_handle: Callable[[Mapping[str, Any]], bool] | None = None,
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
    """
    claim = cast(BatchClaim, backend)  # create_queue_worker refuses batch_size > 1 without BatchClaim
    go_on = True
    write_error: Exception | None = None
    with backend.transaction() as conn:
        if stop_event.is_set():
            return None
        records = claim.get_next_jobs(
            conn, settings.job_table, settings.queue, settings.now(), settings.batch_size
        )
        if not records:
            return None
        finished: list[Any] = []
        for record in records:
            job, decode_error = _to_job(record, settings)
            job_context = {
                **context,
                ev.JOB_ID: job.job_id,
                ev.JOB_TYPE: job.job_type,
                ev.ATTEMPT: job.attempts,
            }
            if may_handle is not None and not may_handle(job_context):
                go_on = False
                break
            failure = handle_job(settings, handler_fn, log, job, decode_error, job_context, stop_event)
            if failure is None:
                finished.append(record.job_id)
            elif failure is GIVEN_BACK:
                go_on = False
                break
            else:
                try:
                    with claim.savepoint(conn):
                        try:
                            write_failure(backend, conn, settings, record, job, failure, log, job_context)
                        except Exception as exc:
                            write_error = exc
                            raise
                except Exception as exc:
                    if exc is not write_error:
                        raise  # the savepoint itself failed: the whole batch rolls back
                    # Rolled back to the savepoint: this job stays as claimed, attempts unchanged. The
                    # batch ends here, as run_next_job's transaction would; the jobs before it are written.
                    break
        if finished:
            finished_at = settings.now()
            archive_and_delete_jobs(
                backend,
                conn,
                settings.job_table,
                settings.archived_job_table,
                finished,
                STATUS_SUCCESS,
                finished_at,
            )
    if write_error is not None:
        raise write_error
    return go_on and not stop_event.is_set()
