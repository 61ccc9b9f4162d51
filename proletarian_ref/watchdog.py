"""A queue worker's per-job time bound (job_timeout_ms): its timers, and the server limits to sit under."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from proletarian_ref.errors import ConfigurationError
from proletarian_ref.log import logger

if TYPE_CHECKING:
    import asyncio

# How long a handler has, once told its time is up, to return before its transaction is ended from
# outside: long enough for a handler that checks interrupted() between steps to finish the step.
DEFAULT_JOB_TIMEOUT_GRACE_MS: Final = 5_000


def check_job_timeout(job_timeout_ms: object, grace_ms: object) -> None:
    """Refuse a job_timeout_ms that is not None or a number > 0, or a grace that is not a number >= 0."""
    for name, value, zero_ok, none_ok in (
        ("job_timeout_ms", job_timeout_ms, False, True),
        ("job_timeout_grace_ms", grace_ms, True, False),
    ):
        if value is None and none_ok:
            continue
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not (number and (value >= 0 if zero_ok else value > 0) and value < 10**12):  # type: ignore[operator]
            least = ">= 0" if zero_ok else "> 0"
            also = " or None (no bound)" if none_ok else ""
            raise ConfigurationError(f"{name} must be a number of milliseconds {least}{also}, got {value!r}")


def limit_warnings(
    limits: Mapping[str, float], job_timeout_ms: float | None, grace_ms: float
) -> list[dict[str, Any]]:
    """What to tell at start about the server's limits on a transaction's life (seconds, by setting).

    A limit at or under the job bound plus its grace ends a long job's transaction before the worker does
    (Proletarian #26: the job runs again, attempts unchanged, its effects rolled back); with no job bound,
    any limit at all is the real bound on a job's length.
    """
    warnings: list[dict[str, Any]] = []
    for name, seconds in sorted(limits.items()):
        limit_ms = seconds * 1000
        if job_timeout_ms is None:
            advice = (
                f"the server ends a transaction after {limit_ms:g} ms ({name}); a job's handler runs inside "
                f"its claim's transaction, so a job running longer is killed by the server and runs again "
                f"with attempts unchanged: give the worker job_timeout_ms below {limit_ms:g} (docs/worker.md)"
            )
        elif job_timeout_ms + grace_ms >= limit_ms:
            advice = (
                f"the server ends a transaction after {limit_ms:g} ms ({name}), before the worker's "
                f"job_timeout_ms={job_timeout_ms:g} plus job_timeout_grace_ms={grace_ms:g}: a job "
                f"running that long is killed by the server first; lower job_timeout_ms or raise {name} "
                "(docs/worker.md)"
            )
        else:
            continue
        warnings.append({"setting": name, "limit-ms": limit_ms, "advice": advice})
    return warnings


@dataclass(eq=False)
class _Timers:
    """What a job timeout watchdog is given: whose, how long (seconds), and whom to call at the deadline
    and after the grace (Watchdog on a thread of its own, AsyncWatchdog on the event loop)."""

    name: str
    timeout_s: float
    grace_s: float
    at_deadline: Callable[[int, object], None]
    after_grace: Callable[[int, object], None]

    def _call(self, n: int, token: object, late: bool) -> None:
        try:
            (self.after_grace if late else self.at_deadline)(n, token)
        except Exception:
            logger.exception("the job timeout watchdog failed on thread %s", n)


@dataclass(eq=False)
class Watchdog(_Timers):
    """One daemon thread that calls `at_deadline(n, token)` when thread n's armed job reaches its bound,
    then `after_grace(n, token)` once the grace is over too, unless the job is disarmed first.

    The callbacks check the token themselves, under the worker's lock: a disarm racing a firing timer is
    decided there, not here.
    """

    _cond: threading.Condition = field(
        init=False, default_factory=lambda: threading.Condition(threading.Lock())
    )
    # Per thread number: (when it fires, whether the grace is over then, the job's token).
    _due: dict[int, tuple[float, bool, object]] = field(init=False, default_factory=dict)
    _thread: threading.Thread | None = field(init=False, default=None)
    _closed: bool = field(init=False, default=False)

    def arm(self, n: int, token: object) -> None:
        with self._cond:
            self._due[n] = (time.monotonic() + self.timeout_s, False, token)
            if self._thread is None and not self._closed:
                # A daemon: it holds no job, and stop() closes it.
                self._thread = threading.Thread(target=self._run, name=f"{self.name}-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self, n: int, token: object) -> None:
        with self._cond:
            entry = self._due.get(n)
            if entry is not None and entry[2] is token:
                del self._due[n]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        due, cond = self._due, self._cond
        while True:
            with cond:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    fired = [(n, entry) for n, entry in due.items() if entry[0] <= now]
                    if fired:
                        break
                    cond.wait(min(entry[0] for entry in due.values()) - now if due else None)
                for n, (at, late, token) in fired:
                    if late:
                        del due[n]
                    else:
                        due[n] = (at + self.grace_s, True, token)
            for n, (_, late, token) in fired:
                self._call(n, token, late)


@dataclass(eq=False)
class AsyncWatchdog(_Timers):
    """Watchdog on the running event loop: the same calls, `at_deadline(n, token)` then, once the grace
    is over too, `after_grace(n, token)`, from the loop's timers rather than a thread of its own."""

    # Per task number: the timer armed for its job, and the job's token.
    _due: dict[int, tuple[asyncio.TimerHandle, object]] = field(init=False, default_factory=dict)

    def arm(self, n: int, token: object) -> None:
        import asyncio  # here, not above: the threaded worker never needs asyncio

        timer = asyncio.get_running_loop().call_later(self.timeout_s, self._fire, n, token, False)
        self._due[n] = (timer, token)

    def disarm(self, n: int, token: object) -> None:
        entry = self._due.get(n)
        if entry is not None and entry[1] is token:
            entry[0].cancel()
            del self._due[n]

    def _fire(self, n: int, token: object, late: bool) -> None:
        import asyncio

        if late:
            self.disarm(n, token)
        else:
            timer = asyncio.get_running_loop().call_later(self.grace_s, self._fire, n, token, True)
            self._due[n] = (timer, token)
        self._call(n, token, late)
