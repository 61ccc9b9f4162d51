"""stop()'s drain then release: wait for a worker's pollers until the deadline, then give back their jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proletarian_ref import log as ev
from proletarian_ref._acompat import aspawned_name
from proletarian_ref.worker_core import WorkerCore

if TYPE_CHECKING:
    from proletarian_ref._acompat import ASpawned


class AsyncDrain(WorkerCore):
    """The drain of aio.AsyncQueueWorker's stop(); its threaded twin, generated from it, QueueWorker's.
    Each worker class says how it waits for its pollers, what it marks when it releases one, and how
    (the task is cancelled; the thread's connection is closed)."""

    async def _drain_then_release(self) -> list[str]:
        """Wait for the pollers until the deadline, then release the ones still running; says, per poller
        released, what it was."""
        stuck = await self._drain(self._await_timeout)
        notes = [self._release(n, poller) for n, poller in stuck]
        await self._drained(stuck)
        return notes

    def _release(self, n: int, poller: ASpawned) -> str:
        """Release what poller n, still running at the deadline, holds; what it was."""
        with self._lock:
            job = self._releasing(n)
        done = self._release_poller(poller)
        # A task can always be cancelled, so the asyncio worker says only the first two; a thread's
        # connection may be out of reach (no job yet, its transaction over, a backend that cannot).
        if not job:
            note = (
                "no job yet: its claim was abandoned"
                if done
                else "no job yet: waiting for a database connection, nothing to release"
            )
        elif done:
            note = f"job {job[ev.JOB_ID]} released back to the queue"
            self._safe_log(
                ev.JOB_RELEASED, {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.WORKER_THREAD_ID: n, **job}
            )
        elif done is None:
            note = f"job {job[ev.JOB_ID]} still running: this backend cannot release it"
        else:
            note = f"job {job[ev.JOB_ID]} finishing: its transaction had already ended"
        name = aspawned_name(poller)  # outside the f-string, where the generator renames it
        return f"{name} ({note})"

    # -- what each worker class says ---------------------------------------------------------------------

    async def _drain(self, timeout: float) -> list[tuple[int, ASpawned]]:
        """Wait up to `timeout` seconds for the pollers (and the listener) to end; the pollers still
        running then, by number, in order."""
        raise NotImplementedError

    def _releasing(self, n: int) -> dict[str, Any]:
        """Under the lock: mark poller n as released by stop(); the job it holds, if any."""
        raise NotImplementedError

    def _release_poller(self, poller: ASpawned) -> bool | None:
        """Give back what `poller` holds: whether it did, None if the backend cannot."""
        raise NotImplementedError

    async def _drained(self, stuck: list[tuple[int, ASpawned]]) -> None:
        """After the release: what stop() still waits for or closes."""
        raise NotImplementedError
