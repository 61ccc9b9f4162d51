"""Cooperative interruption for handlers: Python's stand-in for the JVM thread interrupt that stop! sends."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

from proletarian_ref.errors import JobInterrupted

_state = threading.local()
# An asyncio handler's own check (the asyncio worker's job timeout, or its stop()): tasks share a thread,
# so theirs lives in the task's context rather than the thread's.
_task_check: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "proletarian_ref_interrupted", default=None
)


def bind_stop_event(event: threading.Event | None) -> None:
    """Called by a worker thread so handlers running on it can see its worker stopping.

    With a job timeout the event is the thread's own: set by stop() and by the job's deadline.
    """
    _state.stop_event = event


def bind_task_check(check: Callable[[], bool] | None) -> contextvars.Token[Callable[[], bool] | None]:
    """Called by the asyncio worker around a handler: interrupted() is then `check()` in that task."""
    return _task_check.set(check)


def unbind_task_check(token: contextvars.Token[Callable[[], bool] | None]) -> None:
    _task_check.reset(token)


def interrupted() -> bool:
    """True when the queue worker running this handler has been asked to stop (Thread/interrupted), or
    the job has run past the worker's job_timeout_ms."""
    check = _task_check.get()
    if check is not None and check():
        return True
    event: threading.Event | None = getattr(_state, "stop_event", None)
    return event is not None and event.is_set()


def check_interrupted() -> None:
    """Raise JobInterrupted if the worker is stopping (the job is left queued with attempts unchanged) or
    the job's time is up (the job fails with JobTimeoutError, docs/worker.md "Job timeout")."""
    if interrupted():
        raise JobInterrupted("the queue worker is stopping, or the job ran past job_timeout_ms")


def sleep(seconds: float) -> None:
    """Sleep like Thread/sleep: wakes at once and raises JobInterrupted when the worker stops (or the
    job's time is up, on a threaded worker)."""
    event: threading.Event | None = getattr(_state, "stop_event", None)
    if event is None:
        threading.Event().wait(seconds)
        return
    if event.wait(seconds):
        raise JobInterrupted("the queue worker is stopping, or the job ran past job_timeout_ms")
