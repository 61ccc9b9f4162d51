"""Failures whose cause the suite already knows, reported as found: hypothesis does not shrink them."""

from __future__ import annotations

import threading


class Fault(BaseException):
    """A clause's failure that names its fault outright: a claim blocked on another transaction's lock, or
    one job held by two transactions at once.

    Not an Exception: hypothesis shrinks only what it counts as a failure (Exception and pytest's Failed),
    and shrinking a workload that makes a backend wait on locks costs minutes per test while adding
    nothing to a message that already says what is wrong. Any other BaseException goes through
    hypothesis at once, and pytest reports it as the test's failure, with this message.
    """


class BlockedError(Fault):
    """A transaction step did not return within its time limit: the backend waited on a lock."""


class DoubleClaim(Fault):
    """One job was held by two transactions (or run by two workers) at once."""


class KnownFault(Fault):
    """A property clause's failure on a backend class that already failed with a Fault in this process:
    the cause is likely the same, so the workload is reported as found rather than shrunk for minutes."""


# Backend class -> the first Fault it raised in this process. Per class, not per harness: a broken backend
# class is broken under every harness, and one process runs many backends (the project's own suite).
_known: dict[type, str] = {}
_known_lock = threading.Lock()


def note(backend: object, fault: Fault) -> Fault:
    """Remember that `backend`'s class raised `fault`; returns the fault, to be raised."""
    with _known_lock:
        _known.setdefault(type(backend), f"{type(fault).__name__}: {fault}")
    return fault


def known(backend_class: type) -> str | None:
    """The first Fault `backend_class` raised in this process, if any."""
    with _known_lock:
        return _known.get(backend_class)
