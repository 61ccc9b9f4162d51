"""Cooperative interruption for handlers: Python's stand-in for the JVM thread interrupt that stop! sends."""

from __future__ import annotations

import threading

from proletarian_ref.errors import JobInterrupted

_state = threading.local()


def bind_stop_event(event: threading.Event | None) -> None:
    """Called by a worker thread so handlers running on it can see its worker stopping."""
    _state.stop_event = event


def interrupted() -> bool:
    """True when the queue worker running this handler has been asked to stop (Thread/interrupted)."""
    event: threading.Event | None = getattr(_state, "stop_event", None)
    return event is not None and event.is_set()


def check_interrupted() -> None:
    """Raise JobInterrupted if the worker is stopping, leaving the job queued with attempts unchanged."""
    if interrupted():
        raise JobInterrupted("the queue worker is stopping")


def sleep(seconds: float) -> None:
    """Sleep like Thread/sleep: wakes at once and raises JobInterrupted when the worker stops."""
    event: threading.Event | None = getattr(_state, "stop_event", None)
    if event is None:
        threading.Event().wait(seconds)
        return
    if event.wait(seconds):
        raise JobInterrupted("the queue worker is stopping")
