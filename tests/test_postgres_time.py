"""The PostgreSQL backend's time parameters: the very text isoformat gives, whatever the instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proletarian_ref.backends.postgres import PostgresBackend, utc_text

_ZONES = st.one_of(
    st.just(UTC),
    st.integers(min_value=-23 * 60, max_value=23 * 60).map(lambda m: timezone(timedelta(minutes=m))),
)


@given(st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=_ZONES))
def test_a_time_parameter_is_isoformat_of_its_utc_instant_character_for_character(value: datetime) -> None:
    assert utc_text(value) == value.astimezone(UTC).isoformat()


@pytest.mark.parametrize(
    "value",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 12, 3, 12, 0, tzinfo=UTC),
        datetime(2026, 12, 3, 12, 0, 0, 1, tzinfo=UTC),
        datetime(2026, 12, 3, 12, 0, 0, 1000, tzinfo=timezone(timedelta(hours=-5))),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
)
def test_a_time_parameter_keeps_isoformats_padding_and_leaves_out_zero_microseconds(value: datetime) -> None:
    assert utc_text(value) == value.astimezone(UTC).isoformat()
    assert PostgresBackend()._db_time(value) == value.astimezone(UTC).isoformat()


@pytest.mark.parametrize("zone", ["Etc/UTC", "UTC", "Europe/Oslo", "America/New_York", None])
@given(st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31)))
def test_a_stored_time_reads_as_the_utc_instant_whatever_the_session_zone(
    zone: str | None, stored: datetime
) -> None:
    """As astimezone(UTC) reads it (replace(tzinfo=UTC) for a legacy TIMESTAMP), fold and all.

    psycopg's loaders never set fold, so a naive stored time has fold 0.
    """
    value = stored.replace(fold=0) if zone is None else stored.replace(tzinfo=ZoneInfo(zone))
    read = PostgresBackend()._from_db_time(value)
    expected = value.replace(tzinfo=UTC) if zone is None else value.astimezone(UTC)
    assert (read, read.tzinfo, read.fold) == (expected, expected.tzinfo, expected.fold)
    assert read.isoformat() == expected.isoformat()


def test_a_time_a_whole_number_of_days_after_the_last_one_written_gets_its_own_date() -> None:
    """utc_text keeps the text of the last second it wrote; the same time of day on another day is not it."""
    first = datetime(2026, 12, 3, 12, 0, 5, 250, tzinfo=UTC)
    for value in (
        first,
        first + timedelta(days=1),
        first - timedelta(days=365),
        first,
        first + timedelta(0, 1),
    ):
        assert utc_text(value) == value.isoformat()
