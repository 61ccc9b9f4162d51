"""Retry strategies and the retry maths of proletarian.retry (spec section 3); maybe_retry is in job_run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from proletarian_ref.errors import InvalidRetryStrategyError

if TYPE_CHECKING:
    from proletarian_ref.job import Job

_KEYS: Final = frozenset({"retries", "delays"})


@dataclass(frozen=True, slots=True)
class RetryStrategy:
    """Retry up to `retries` times; the n-th retry waits delays[n-1] ms, and the last delay is reused."""

    retries: int
    delays: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not _is_natural(self.retries):
            raise InvalidRetryStrategyError(f"retries must be an int >= 0, got {self.retries!r}")
        bad = [d for d in self.delays if not _is_natural(d)]
        if bad:
            raise InvalidRetryStrategyError(f"delays must be ints >= 0 (milliseconds), got {bad[0]!r}")


RetryStrategyFn = Callable[["Job", BaseException], "RetryStrategy | Mapping[str, Any] | None"]
FailedJobFn = Callable[["Job", BaseException], object]


@dataclass(frozen=True, slots=True)
class RetryData:
    """What retry_data decides: how many retries remain and, if any, when the next attempt is due."""

    retries_left: int
    retry_at: datetime | None


def _is_natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def no_retries(job: Job, exception: BaseException) -> None:
    """The default retry_strategy_fn: the first failure is final."""
    return None


def no_failed_job_fn(job: Job, exception: BaseException) -> None:
    """The default failed_job_fn: nothing to do."""
    return None


def parse_retry_strategy(spec: object) -> RetryStrategy | None:
    """Accept None, a RetryStrategy, or Proletarian's map {"retries": N, "delays": [ms, ...]}.

    Unknown keys are refused, unlike Clojure's open maps, because a misspelt "delay" would silently retry
    with no delay. `delays` must be a list or tuple: Proletarian refuses a list in favour of a vector, and
    a Python list is the vector's equivalent.
    """
    if spec is None or isinstance(spec, RetryStrategy):
        return spec
    if not isinstance(spec, Mapping):
        raise InvalidRetryStrategyError(
            f"retry_strategy_fn must return None, a RetryStrategy or a dict with 'retries' and 'delays', "
            f"got {type(spec).__name__}: {spec!r}"
        )
    unknown = set(spec) - _KEYS
    if unknown:
        raise InvalidRetryStrategyError(
            f"retry strategy has unknown keys {sorted(map(str, unknown))}: {spec!r}"
        )
    if "retries" not in spec:
        raise InvalidRetryStrategyError(f"retry strategy needs 'retries': {spec!r}")
    delays = spec.get("delays")
    if delays is None:
        delays = ()
    if not isinstance(delays, (list, tuple)):
        raise InvalidRetryStrategyError(f"delays must be a list of ints (milliseconds), got {delays!r}")
    return RetryStrategy(retries=spec["retries"], delays=tuple(delays))


def retry_data(strategy: RetryStrategy, attempts: int, now: datetime) -> RetryData:
    """Proletarian's retry-data: `attempts` is the current attempt number, 1 on the first run."""
    retries_left = 0 if strategy.retries == 0 else strategy.retries + 1 - attempts
    if retries_left <= 0:
        return RetryData(retries_left=retries_left, retry_at=None)
    return RetryData(
        retries_left=retries_left, retry_at=now + timedelta(milliseconds=delay_ms(strategy, attempts))
    )


def delay_ms(strategy: RetryStrategy, attempts: int) -> int:
    if not strategy.delays:
        return 0
    if attempts - 1 < len(strategy.delays):
        return strategy.delays[attempts - 1]
    return strategy.delays[-1]
