"""What a handler's exception does, row by row of docs/worker.md, and the other worker rules of spec 2.3/4.

Proletarian catches `Exception` from a handler as the job's failure and lets a JVM `Error` escape as a
worker error. Here: every `Exception` but MemoryError and RecursionError (the JVM's OutOfMemoryError and
StackOverflowError) fails the job; those two and every BaseException that is not an Exception (SystemExit,
KeyboardInterrupt, GeneratorExit) are worker errors.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support import RecordingLog, enqueue_committed, wait_until

from conformance.harness import Harness
from proletarian_ref import ConfigurationError, create_queue_worker, process_next_job
from proletarian_ref import log as ev


def _recurse(depth: int = 0) -> int:
    return _recurse(depth + 1) + 1


def _raise(exc: BaseException) -> Callable[[], None]:
    def raise_it() -> None:
        raise exc

    return raise_it


# (name, what the handler does, a job failure?) -- the table in docs/worker.md, one row each.
ROWS: list[tuple[str, Callable[[], object], bool]] = [
    ("Exception (ValueError)", _raise(ValueError("bad input")), True),
    ("AssertionError", _raise(AssertionError("assert failed")), True),
    ("MemoryError", _raise(MemoryError()), False),
    ("RecursionError", _recurse, False),
    ("SystemExit", _raise(SystemExit(3)), False),
    ("KeyboardInterrupt", _raise(KeyboardInterrupt()), False),
    ("GeneratorExit", _raise(GeneratorExit()), False),
]


@pytest.mark.parametrize(("name", "action", "job_failure"), ROWS, ids=[row[0] for row in ROWS])
def test_each_exception_type_from_a_handler_does_what_the_table_says(
    db: Harness, name: str, action: Callable[[], object], job_failure: bool
) -> None:
    """A job failure is retried (attempts + 1, handle-job-exception) and the worker polls on; a worker
    error rolls the claim back (attempts unchanged, job-worker-error) and stops the worker by default.
    """
    enqueue_committed(db, "errors/row", name)
    log = RecordingLog()
    ran = threading.Event()

    def handler(job_type: str, payload: Any) -> None:
        ran.set()
        action()

    worker = create_queue_worker(
        db.data_source,
        handler,
        polling_interval_ms=10,
        retry_strategy_fn=lambda job, exc: {"retries": 1, "delays": [3_600_000]},
        log=log,
        **db.table_options,
    )
    try:
        worker.start()
        assert ran.wait(20)
        if job_failure:
            assert wait_until(lambda: [job.attempts for job in db.jobs()] == [1], timeout=20)
            assert len(log.named(ev.HANDLE_JOB_EXCEPTION)) == 1 and len(log.named(ev.RETRYING)) == 1
            assert not log.named(ev.JOB_WORKER_ERROR)
            assert worker.running
        else:
            assert wait_until(lambda: not worker.running, timeout=20)
            [error] = log.named(ev.JOB_WORKER_ERROR)
            assert error[ev.JOB_ID] is not None
            assert type(error[ev.THROWABLE]).__name__ == name
            assert not log.named(ev.HANDLE_JOB_EXCEPTION)
            assert [job.attempts for job in db.jobs()] == [0]
        assert db.archived_jobs() == []
    finally:
        worker.stop()


@pytest.mark.parametrize("interval", [0, -1, -0.5])
def test_a_polling_interval_of_zero_or_less_is_refused_as_proletarian_refuses_it(
    db: Harness, interval: float
) -> None:
    """Proletarian's start! throws IllegalArgumentException (scheduleWithFixedDelay with delay <= 0)."""
    with pytest.raises(ConfigurationError, match="polling_interval_ms must be a number of milliseconds > 0"):
        create_queue_worker(db.data_source, lambda job_type, payload: None, polling_interval_ms=interval)


def test_not_retrying_carries_the_retry_spec_and_the_job_context(db: Harness) -> None:
    """Spec 4.4: not-retrying is {:retry-spec map-or-nil} plus the job context (and the worker's)."""
    job_id = enqueue_committed(db, "errors/final", None)
    log = RecordingLog()
    spec = {"retries": 0, "delays": []}

    def fail(job_type: str, payload: Any) -> None:
        raise ValueError("no")

    worker = create_queue_worker(
        db.data_source,
        fail,
        queue_worker_id="w",
        polling_interval_ms=10,
        retry_strategy_fn=lambda job, exc: spec,
        log=log,
        **db.table_options,
    )
    with worker:
        assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=20)
    [data] = log.named(ev.NOT_RETRYING)
    assert data == {
        ev.RETRY_SPEC: spec,
        ev.JOB_ID: job_id,
        ev.JOB_TYPE: "errors/final",
        ev.ATTEMPT: 1,
        ev.QUEUE_WORKER_ID: "w",
        ev.WORKER_THREAD_ID: 1,
    }


class FailingLog(RecordingLog):
    """A `log` that raises on one event and records the rest."""

    def __init__(self, *fails_on: str) -> None:
        super().__init__()
        self.fails_on = fails_on

    def __call__(self, event: str, data: Any) -> None:
        super().__call__(event, data)
        if event in self.fails_on:
            raise RuntimeError(f"log failed on {event}")


@pytest.mark.parametrize("event", [ev.HANDLING_JOB, ev.JOB_FINISHED])
def test_a_log_function_raising_inside_the_job_fails_the_job_like_a_handler(db: Harness, event: str) -> None:
    """Spec 2.3: a log that throws inside the try (handling-job, job-finished) is a handler exception."""
    enqueue_committed(db, "errors/log", None)
    ran: list[Any] = []
    log = FailingLog(event)
    result = process_next_job(
        db.data_source, lambda job_type, payload: ran.append(payload), log=log, **db.table_options
    )
    assert result is True
    [row] = db.archived_jobs()
    assert (row.status, row.attempts) == (":failure", 1)
    [failure] = log.named(ev.HANDLE_JOB_EXCEPTION)
    assert str(failure[ev.EXCEPTION]) == f"log failed on {event}"
    assert ran == ([] if event == ev.HANDLING_JOB else [None])


def test_a_log_function_raising_outside_a_job_is_reported_and_stops_the_worker(
    db: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Proletarian: the second throw (logging job-worker-error) escapes the scheduled task, whose
    polling then ends silently while the worker looks alive. Here the failure goes to the stdlib logger
    and on_polling_error decides, as for any error: by default the worker stops.
    """
    log = FailingLog(ev.POLLING_FOR_JOBS, ev.JOB_WORKER_ERROR)
    worker = create_queue_worker(
        db.data_source, lambda job_type, payload: None, polling_interval_ms=10, log=log, **db.table_options
    )
    with caplog.at_level(logging.ERROR, logger="proletarian_ref"):
        worker.start()
        assert wait_until(lambda: not worker.running, timeout=20)
    assert "log function failed on proletarian.worker/job-worker-error" in caplog.text
    [error] = log.named(ev.JOB_WORKER_ERROR)
    assert str(error[ev.THROWABLE]) == f"log failed on {ev.POLLING_FOR_JOBS}"
    worker.stop()


def test_an_on_polling_error_that_raises_is_logged_and_stops_the_worker(db: Harness) -> None:
    """Proletarian: its throw escapes the scheduled task, which silently stops that thread's polling.
    Here it is logged as a second job-worker-error and the worker stops, as if it had returned true.
    """
    enqueue_committed(db, "errors/poison", None)
    log = RecordingLog()

    def handler(job_type: str, payload: Any) -> None:
        raise SystemExit(1)

    def on_polling_error(error: BaseException) -> bool:
        raise RuntimeError("on_polling_error is broken")

    worker = create_queue_worker(
        db.data_source,
        handler,
        polling_interval_ms=10,
        on_polling_error=on_polling_error,
        log=log,
        **db.table_options,
    )
    worker.start()
    assert wait_until(lambda: not worker.running, timeout=20)
    errors = [type(data[ev.THROWABLE]).__name__ for data in log.named(ev.JOB_WORKER_ERROR)]
    assert errors == ["SystemExit", "RuntimeError"]
    assert [job.attempts for job in db.jobs()] == [0]
    worker.stop()
