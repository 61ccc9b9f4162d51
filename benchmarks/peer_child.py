"""What the peers' child processes share: the go and stop signals, the handled-jobs slot, latency sampling.

The peers are asyncio libraries; each runs in a spawned process of its own (see benchmarks.peers), so its
event loop, its imports and its module-level settings never meet another system's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.settings import CHILD_MAX_RUN_S


@dataclass(frozen=True, slots=True)
class Signals:
    """A consumer child's handles from the parent: its slot in the shared count of handled jobs, the
    queue on which it says it is ready for the next round, and each round's go and stop events.

    A child lives through every round: it opens its connections, says it is ready, drains from go to
    stop, closes, and opens again for the next round, so no round pays for starting a process.
    """

    index: int
    slots: Any
    ready: Any
    go: list[Any]
    stop: list[Any]

    @property
    def rounds(self) -> int:
        return len(self.go)

    def handled(self) -> None:
        # One event loop per child, so this slot has one writer.
        self.slots[self.index] += 1

    def wait_go(self, round_: int) -> bool:
        """Say this child is ready for the round, then wait for its start (the other systems' rounds go
        first, however long they take); False if it never came."""
        self.ready.put(self.index)
        return bool(self.go[round_].wait(CHILD_MAX_RUN_S))

    def wait_stop(self, round_: int) -> None:
        self.stop[round_].wait(CHILD_MAX_RUN_S)

    async def async_wait_go(self, round_: int) -> bool:
        return await asyncio.to_thread(self.wait_go, round_)

    async def async_wait_stop(self, round_: int) -> None:
        await asyncio.to_thread(self.wait_stop, round_)


async def sample_latency(
    enqueue: Callable[[int], Awaitable[Any]], starts: dict[int, float], jobs: int, gap_ms: tuple[float, float]
) -> list[float]:
    """Seconds from each enqueue returning to its handler starting (the handler fills `starts[i]`)."""
    rng = random.Random(4)
    sent: dict[int, float] = {}
    # Let the consumer reach its first wait before the first job arrives.
    await asyncio.sleep(0.3)
    for i in range(jobs):
        await enqueue(i)
        sent[i] = time.monotonic()
        await asyncio.sleep(rng.uniform(*gap_ms) / 1000)
    deadline = time.monotonic() + 10.0
    while len(starts) < jobs and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return [starts[i] - sent[i] for i in sent if i in starts]
