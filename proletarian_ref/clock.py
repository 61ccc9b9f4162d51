"""The clock every timestamp comes from: the application's, never the database's now()."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Final

from proletarian_ref.errors import ConfigurationError

Clock = Callable[[], datetime]

# A naive UTC wall-clock time and its aware instant differ by these two alone: EPOCH_UTC + (naive -
# EPOCH_NAIVE) is naive.replace(tzinfo=UTC) for a fifth of the instructions (replace's keyword parsing
# is most of its cost), which the backends' time conversions, several a job, use.
EPOCH_NAIVE: Final = datetime(1970, 1, 1)
EPOCH_UTC: Final = datetime(1970, 1, 1, tzinfo=UTC)


def system_utc() -> datetime:
    """Now, as an aware UTC datetime (Proletarian's Clock/systemUTC)."""
    return datetime.now(UTC)


def now_from(clock: Clock) -> datetime:
    """Read `clock`, insisting on an aware datetime so no local time ever reaches the database."""
    if clock is system_utc:
        return datetime.now(UTC)  # the default clock, read twice per job, needs no check
    now = clock()
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise ConfigurationError(f"clock must return an aware datetime, got {now!r}")
    return now.astimezone(UTC)


def reader(clock: Clock) -> Callable[[], datetime]:
    """now_from(clock) as a function of no arguments; for the default clock, one with no Python frame of
    its own (a worker reads the clock twice a job)."""
    if clock is system_utc:
        return partial(datetime.now, UTC)
    return partial(now_from, clock)
