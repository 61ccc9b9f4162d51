"""Log events with Proletarian's names and data keys, and the default logger on stdlib logging."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

LogFn = Callable[[str, Mapping[str, Any]], None]

# Event names are Proletarian's keywords without the leading colon.
POLLING_FOR_JOBS: Final = "proletarian.worker/polling-for-jobs"
HANDLING_JOB: Final = "proletarian.worker/handling-job"
JOB_FINISHED: Final = "proletarian.worker/job-finished"
JOB_INTERRUPTED: Final = "proletarian.worker/job-interrupted"
HANDLE_JOB_EXCEPTION: Final = "proletarian.worker/handle-job-exception"
HANDLE_JOB_EXCEPTION_WITH_INTERRUPT: Final = "proletarian.worker/handle-job-exception-with-interrupt"
RETRYING: Final = "proletarian.retry/retrying"
NOT_RETRYING: Final = "proletarian.retry/not-retrying"
SQL_TRANSIENT_EXCEPTION: Final = "proletarian.worker/sql-transient-exception"
WORKER_INTERRUPTED: Final = "proletarian.worker/worker-interrupted"
JOB_WORKER_ERROR: Final = "proletarian.worker/job-worker-error"
QUEUE_WORKER_SHUTDOWN_ERROR: Final = "proletarian.worker/queue-worker-shutdown-error"
SHUTTING_DOWN: Final = "proletarian.executor/shutting-down"
COMPLETED_SHUTDOWN: Final = "proletarian.executor/completed-shutdown"
ALREADY_SHUT_DOWN: Final = "proletarian.executor/already-shut-down"
INTERRUPTED_WHILE_SHUTTING_DOWN: Final = "proletarian.executor/interrupted-while-shutting-down"
# Events Proletarian has no name for, because it cannot release a job (docs/failure-modes.md): stop()
# gave up waiting for a handler and released its job back to the queue, and later that handler returned
# (or raised) with nothing of its outcome written.
JOB_RELEASED: Final = "proletarian.worker/job-released"
RELEASED_JOB_RETURNED: Final = "proletarian.worker/released-job-returned"
# Instant wake-up (wake_on_notify), which Proletarian does not have: the worker's listener connection
# listens for enqueued jobs, or failed and is opened again after a backoff while polling goes on.
LISTENING_FOR_JOBS: Final = "proletarian.worker/listening-for-jobs"
LISTENER_ERROR: Final = "proletarian.worker/listener-error"
# The listener's test notification did not come back: notifications may never reach it (PgBouncer in
# transaction mode); jobs then run at the polling interval.
LISTENER_UNCONFIRMED: Final = "proletarian.worker/listener-unconfirmed"

# A job past its job_timeout_ms (docs/worker.md, "Job timeout"), which Proletarian does not have: its
# handler was told (interrupted() is true); after the grace its transaction is ended (JOB_RELEASED,
# reason job-timeout). And at start, a server limit that would end a long job's transaction first.
JOB_TIMED_OUT: Final = "proletarian.worker/job-timed-out"
SERVER_TIME_LIMIT: Final = "proletarian.worker/server-time-limit"

# Data keys, as Proletarian names them (note the singular "attempt").
QUEUE_WORKER_ID: Final = "proletarian.worker/queue-worker-id"
WORKER_THREAD_ID: Final = "worker-thread-id"
JOB_ID: Final = "job-id"
JOB_TYPE: Final = "job-type"
ATTEMPT: Final = "attempt"
EXCEPTION: Final = "exception"
THROWABLE: Final = "throwable"
RETRY_AT: Final = "retry-at"
RETRIES_LEFT: Final = "retries-left"
RETRY_SPEC: Final = "retry-spec"

# The levels Proletarian's README suggests for each event; any other is INFO.
_LEVELS: Final = {
    **dict.fromkeys(
        (
            QUEUE_WORKER_SHUTDOWN_ERROR,
            HANDLE_JOB_EXCEPTION_WITH_INTERRUPT,
            HANDLE_JOB_EXCEPTION,
            JOB_WORKER_ERROR,
            NOT_RETRYING,
            JOB_RELEASED,
            RELEASED_JOB_RETURNED,
        ),
        logging.ERROR,
    ),
    POLLING_FOR_JOBS: logging.DEBUG,
    LISTENER_ERROR: logging.WARNING,
    LISTENER_UNCONFIRMED: logging.WARNING,
    JOB_TIMED_OUT: logging.WARNING,
    SERVER_TIME_LIMIT: logging.WARNING,
}

logger = logging.getLogger("proletarian_ref")
# A text value printed as it is in `key=value`: anything else is JSON-quoted, so the line stays one line.
_BARE: Final = re.compile(r"[\w.:/@+\[\]-]+")


def log_value(value: Any) -> Any:
    """A log data value as JSON data: ids and instants as text, a RetryStrategy as its map, an exception
    as {"type", "message"}. What the JSON log prints, and what the text log prints as JSON."""
    if isinstance(value, BaseException):
        return {"type": type(value).__name__, "message": str(value)}
    if isinstance(value, Mapping):
        return {str(k): log_value(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: log_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple | set | frozenset):
        return [log_value(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _text(value: Any) -> str:
    if isinstance(value, BaseException):
        value = f"{type(value).__name__}: {value}"
    data = log_value(value)
    if isinstance(data, str) and _BARE.fullmatch(data):
        return data
    return json.dumps(data, ensure_ascii=False)


def format_event(event: str, data: Mapping[str, Any]) -> str:
    """One readable line: the event, then key=value for each datum (ids as text, an error "Type: message")."""
    # The error last, as in the JSON line: the job's context reads first.
    ordered = sorted(data.items(), key=lambda item: item[0] in (EXCEPTION, THROWABLE))
    return " ".join([event, *(f"{key}={_text(value)}" for key, value in ordered)])


def stdlib_logger(event: str, data: Mapping[str, Any]) -> None:
    """The default `log`: the event at its suggested level on the `proletarian_ref` logger.

    The data map travels in `extra["proletarian"]` and the event name in `extra["proletarian_event"]`
    for structured handlers, and the exception, if any,
    as exc_info so tracebacks are not lost.
    """
    level = _LEVELS.get(event, logging.INFO)
    if not logger.isEnabledFor(level):
        return
    error = data.get(EXCEPTION) or data.get(THROWABLE)
    exc_info = error if isinstance(error, BaseException) else None
    logger.log(
        level,
        "%s",
        format_event(event, data),
        exc_info=exc_info,
        extra={"proletarian": dict(data), "proletarian_event": event},
    )


def null_logger(event: str, data: Mapping[str, Any]) -> None:
    """A `log` that drops everything."""
