"""The clock every timestamp comes from: the application's, never the database's now()."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from proletarian_ref.errors import ConfigurationError

Clock = Callable[[], datetime]


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
