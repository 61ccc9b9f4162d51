"""Injected clocks: a manual one for contract tests, a fast shared one for worker threads and processes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

# Every timestamp the suite makes lies in 2031: far from the real now (so nothing passes by accident), and
# before MySQL TIMESTAMP's 2038 limit. Whole seconds, so that second-precision columns store it exactly.
EPOCH: Final = datetime(2031, 3, 1, 12, 0, 0, tzinfo=UTC)


class ManualClock:
    """A clock that moves only when the test moves it."""

    def __init__(self, now: datetime = EPOCH) -> None:
        self._now = now
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, now: datetime) -> datetime:
        with self._lock:
            self._now = now
            return now

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now


def frozen(now: datetime) -> ManualClock:
    """A clock stuck at `now`, for one enqueue."""
    return ManualClock(now)


@dataclass(frozen=True, slots=True)
class VirtualClock:
    """Virtual time running `speed` times faster than real time from `origin`, the same in every process.

    time.monotonic() is one system-wide clock on Linux, macOS and Windows, so threads and worker processes
    of one machine read one timeline from it; and it never steps back, so "a job's handler started after
    the worker saw the job due" holds on this clock as it does in the database. Picklable, so a worker
    process gets the very same clock.
    """

    origin: datetime
    started: float
    speed: float

    @classmethod
    def start(cls, origin: datetime = EPOCH, speed: float = 600.0) -> VirtualClock:
        return cls(origin, time.monotonic(), speed)

    def __call__(self) -> datetime:
        return self.origin + timedelta(seconds=(time.monotonic() - self.started) * self.speed)

    def real_seconds(self, virtual: timedelta) -> float:
        """How long `virtual` takes in real time."""
        return virtual.total_seconds() / self.speed
