"""A queue worker's waits and wake-ups: the polling interval, stop(), and the NOTIFY listener."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from proletarian_ref import log as ev
from proletarian_ref._acompat import acondition_wait_for, aevent_wait
from proletarian_ref.backend import AsyncListener, AsyncNotifications
from proletarian_ref.worker_core import _LISTEN_TICK_S, LISTENER_UNCONFIRMED_ADVICE, WorkerCore

if TYPE_CHECKING:
    from proletarian_ref._acompat import ACondition, AEvent


class AsyncWake(WorkerCore):
    """How aio.AsyncQueueWorker's pollers wait and are woken; its threaded twin, generated from it,
    QueueWorker's. Each worker class makes the stop event, the wake condition and the lock, and says how
    its listener is closed."""

    _stop_event: AEvent
    _wake: ACondition
    _listener: AsyncListener | None

    async def _wait_stop(self, delay: float) -> bool:
        """Wait `delay` seconds or until stop(); whether stop() has begun."""
        return await aevent_wait(self._stop_event, delay)

    async def _idle(self, delay: float, generation: int) -> None:
        """Wait out the polling interval, or less: until stop() or a wake-up since `generation` began."""
        if not self._listens:
            await self._wait_stop(delay)
            return
        async with self._wake:
            await acondition_wait_for(
                self._wake, lambda: self._stop_event.is_set() or self._wake_generation != generation, delay
            )

    async def _wake_one(self) -> None:
        # One poller: SKIP LOCKED makes more harmless, but each would cost a poll for a single job. A
        # poller that then finds a backlog wakes the next one.
        async with self._wake:
            self._wake_generation += 1
            self._wake.notify(1)

    async def _listen(self) -> None:
        """The listener: wakes an idle poller on each notification for this queue."""
        notifications = cast(AsyncNotifications, self.backend)  # _listens checked it
        context = {ev.QUEUE_WORKER_ID: self.queue_worker_id}
        listener: AsyncListener | None = None
        failures = 0
        try:
            while not self._stop_event.is_set():
                try:
                    if listener is None:
                        listener = await notifications.listen(
                            self.settings.job_table, self.settings.queue, self._listen_data_source
                        )
                        if not self._hold_listener(listener):
                            break
                        self._safe_log(ev.LISTENING_FOR_JOBS, context)
                        if not getattr(listener, "confirmed", True):
                            self._safe_log(
                                ev.LISTENER_UNCONFIRMED, {**context, "advice": LISTENER_UNCONFIRMED_ADVICE}
                            )
                        # Jobs may have come while no one listened: one poll finds them now.
                        await self._wake_one()
                    if await listener.wait(_LISTEN_TICK_S):
                        await self._wake_one()
                    failures = 0  # only a connection that waited counts as back
                except Exception as exc:
                    failures += 1
                    if listener is not None:
                        self._hold_listener(None)
                        await self._close_listener(listener)
                        listener = None
                    backoff = self._listener_backoff(failures)
                    self._safe_log(
                        ev.LISTENER_ERROR,
                        {**context, ev.THROWABLE: exc, "retry-in-ms": round(backoff * 1000)},
                    )
                    await self._wait_stop(backoff)
        finally:
            if listener is not None:
                self._hold_listener(None)
                await self._close_listener(listener)

    def _hold_listener(self, listener: AsyncListener | None) -> bool:
        """Keep `listener` where stop() interrupts it (None: drop it); False if stop() has begun."""
        # Under the lock stop() sets its event with, and reads the listener under (on the one event loop
        # thread, no await in between instead).
        with self._lock:
            if listener is not None and self._stop_event.is_set():
                return False
            self._listener = listener
            return True

    # -- what each worker class says ---------------------------------------------------------------------

    async def _close_listener(self, listener: AsyncListener) -> None:
        raise NotImplementedError
