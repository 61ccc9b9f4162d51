"""Failures whose cause the suite already knows, reported as found: hypothesis does not shrink them."""

from __future__ import annotations


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
