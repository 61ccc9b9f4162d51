"""Retry maths of proletarian.retry (spec section 3), without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proletarian_ref.errors import InvalidRetryStrategyError
from proletarian_ref.retry import RetryData, RetryStrategy, parse_retry_strategy, retry_data

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def at(ms: int) -> datetime:
    return NOW + timedelta(milliseconds=ms)


# Proletarian's retry_test.clj table, plus the README's worked examples.
RETRY_DATA_CASES = [
    ({"retries": 2, "delays": [1000, 5000]}, 1, RetryData(2, at(1000))),
    ({"retries": 2, "delays": [1000, 5000]}, 2, RetryData(1, at(5000))),
    ({"retries": 2, "delays": [1000, 5000]}, 3, RetryData(0, None)),
    ({"retries": 4, "delays": [2000, 10000]}, 1, RetryData(4, at(2000))),
    ({"retries": 4, "delays": [2000, 10000]}, 2, RetryData(3, at(10000))),
    ({"retries": 4, "delays": [2000, 10000]}, 3, RetryData(2, at(10000))),
    ({"retries": 4, "delays": [2000, 10000]}, 4, RetryData(1, at(10000))),
    ({"retries": 4, "delays": [2000, 10000]}, 5, RetryData(0, None)),
    ({"retries": 10, "delays": [1000, 2000]}, 3, RetryData(8, at(2000))),
    ({"retries": 1}, 1, RetryData(1, at(0))),
    ({"retries": 1}, 2, RetryData(0, None)),
    ({"retries": 0}, 1, RetryData(0, None)),
    ({"retries": 0, "delays": [1000]}, 1, RetryData(0, None)),
    ({"retries": 3, "delays": []}, 1, RetryData(3, at(0))),
    ({"retries": 3, "delays": None}, 2, RetryData(2, at(0))),
    ({"retries": 2, "delays": [2000, 4000, 8000, 8000]}, 2, RetryData(1, at(4000))),
    # A later strategy with fewer retries than attempts made is a final failure, not a negative retry.
    ({"retries": 1, "delays": [1000]}, 5, RetryData(-3, None)),
]


@pytest.mark.parametrize(("spec", "attempts", "expected"), RETRY_DATA_CASES)
def test_retry_data_matches_proletarian_table(
    spec: dict[str, Any], attempts: int, expected: RetryData
) -> None:
    strategy = parse_retry_strategy(spec)
    assert strategy is not None
    assert retry_data(strategy, attempts, NOW) == expected


@pytest.mark.parametrize(
    "spec",
    [
        {"retries": 1},
        {"retries": 0, "delays": []},
        {"retries": 2, "delays": [1, 2, 3]},
        {"retries": 2, "delays": (1, 2)},
        RetryStrategy(retries=3, delays=(10,)),
        None,
    ],
)
def test_valid_retry_strategies_are_accepted(spec: Any) -> None:
    parsed = parse_retry_strategy(spec)
    assert parsed is None or isinstance(parsed, RetryStrategy)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"retries": -1}, "retries"),
        ({"retries": 1.5}, "retries"),
        ({"retries": True}, "retries"),
        ({"retries": "2"}, "retries"),
        ({"delays": [1000]}, "retries"),
        ({"retries": 2, "delays": 1000}, "delays"),
        ({"retries": 2, "delays": [-1]}, "delays"),
        ({"retries": 2, "delays": [1.5]}, "delays"),
        ({"retries": 2, "delays": ["1s"]}, "delays"),
        ({"retries": 2, "delay": [1000]}, "unknown keys"),
        ([2, [1000]], "list"),
        (2, "int"),
    ],
)
def test_invalid_retry_strategies_are_refused_naming_the_problem(spec: Any, named: str) -> None:
    with pytest.raises(InvalidRetryStrategyError, match=named):
        parse_retry_strategy(spec)


@given(
    retries=st.integers(min_value=0, max_value=50),
    delays=st.lists(st.integers(min_value=0, max_value=10**9), max_size=8),
    attempts=st.integers(min_value=1, max_value=60),
)
def test_retry_at_uses_the_attempts_delay_and_reuses_the_last(
    retries: int, delays: list[int], attempts: int
) -> None:
    data = retry_data(RetryStrategy(retries, tuple(delays)), attempts, NOW)
    if retries == 0 or attempts > retries:
        assert data.retry_at is None
        assert data.retries_left <= 0
        return
    assert data.retries_left == retries + 1 - attempts
    expected_delay = 0 if not delays else delays[min(attempts, len(delays)) - 1]
    assert data.retry_at == at(expected_delay)


@given(retries=st.integers(min_value=0, max_value=20))
def test_a_job_runs_exactly_retries_plus_one_times(retries: int) -> None:
    strategy = RetryStrategy(retries, (5,))
    attempts = 1
    while retry_data(strategy, attempts, NOW).retries_left > 0:
        attempts += 1
    assert attempts == retries + 1
