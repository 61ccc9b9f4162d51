"""The PostgreSQL backend's time parameters: the very text isoformat gives, whatever the instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

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
