"""A queue worker's poll loop, one per task (or thread): interval, wake-ups, backoff after failed runs."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from proletarian_ref import log as ev
from proletarian_ref._acompat import AsyncHandlerFn, AsyncPollFailure
from proletarian_ref._async.job_run import run_next_batch, run_next_job
from proletarian_ref._async.wake import AsyncWake


class AsyncPollLoop(AsyncWake):
    """The poll loop of aio.AsyncQueueWorker; its threaded twin, generated from it, QueueWorker's. Each
    worker class says how it waits, sets a poller up, and ends what a finished or failed run held."""

    async def _work(self, n: int) -> None:
        try:
            await self._poll(n)
        finally:
            self._poller_ended()

    async def _poll(self, n: int) -> None:
        outer = {ev.QUEUE_WORKER_ID: self.queue_worker_id}
        context = {**outer, ev.WORKER_THREAD_ID: n}
        may_handle = self._may_handle(n)
        run_over = self._run_over
        single = self.settings.batch_size == 1
        runs = 0

        async def job_over() -> None:
            # A run that ran a job is over, or a job of a chain committed and the next is claimed.
            nonlocal runs
            run_over(n)
            runs += 1
            if runs == 2 and self._listens:
                # A second due job in a row: a batch or a burst, so another idle poller helps.
                await self._wake_one()

        # Spread the pollers' idle polls over the interval, as Proletarian's start-up jitter does, but
        # without blocking start().
        if n > 1 and await self._wait_stop(random.uniform(0, min(self._interval, 1.0))):
            return
        failures = 0
        # Read once, not once a job: none of them changes while the worker runs.
        backend, settings, handler_fn, log_fn = (
            self.backend,
            self.settings,
            await self._poller_handler(n),
            self._log_fn,
        )
        stop_event = self._stop_event
        while not stop_event.is_set():
            delay = self._interval
            generation = self._wake_generation
            runs = 0
            try:
                log_fn(ev.POLLING_FOR_JOBS, context)
                # No stop check of its own before each run: run_next checks before it claims, and has just
                # checked to return True.
                while True:
                    if single:
                        ran = await run_next_job(
                            backend, settings, handler_fn, log_fn, context, stop_event, may_handle, job_over
                        )
                    else:
                        ran = await run_next_batch(
                            backend, settings, handler_fn, log_fn, context, stop_event, may_handle, job_over
                        )
                    if ran is not True:
                        run_over(n)
                        break
                    await job_over()
                failures = 0
            except AsyncPollFailure as exc:
                released, expired, running = self._run_failed(n)
                if released or expired:
                    if running:
                        self._safe_log(ev.RELEASED_JOB_RETURNED, {**context, **running, ev.THROWABLE: exc})
                    if released:
                        return
                    # Its job is back in the queue and its connection gone: the poller polls again on a
                    # new one.
                    continue
                failures += 1
                after = self._after_failure(exc, failures, outer, running)
                if after is None:
                    # stop() waits for this very poller: another one stops the worker.
                    self._stop_in_background()
                    return
                delay = after
            if failures:
                await self._wait_stop(delay)
            else:
                await self._idle(delay, generation)

    async def _check_server_limits(self) -> None:
        """Warn at start of a server limit shorter than the job bound, read on a connection of the worker's
        own (the polling thread's, before its first transaction), never a caller's."""
        read = getattr(self.backend, "server_time_limits", None)
        if read is None:
            return
        try:
            limits = await read()
        except Exception as exc:
            self._server_limits_failed(exc)
            return
        self._log_server_limits(limits)

    # -- what each worker class says ---------------------------------------------------------------------

    def _may_handle(self, n: int) -> Callable[[Mapping[str, Any]], bool]:
        """Whether poller n may start the handler of the job it claimed (not once stop() has begun)."""
        raise NotImplementedError

    async def _poller_handler(self, n: int) -> AsyncHandlerFn:
        """Set poller n up before its first poll; the handler it runs jobs with."""
        raise NotImplementedError

    def _run_over(self, n: int) -> None:
        """Poller n's run ended: its job's transaction is over, nothing left to release."""
        raise NotImplementedError

    def _run_failed(self, n: int) -> tuple[bool, bool, dict[str, Any]]:
        """Poller n's run raised: whether stop() released it, whether its job's bound did, and its job."""
        raise NotImplementedError

    def _poller_ended(self) -> None:
        """Poller n is done: give back what it alone held."""
        raise NotImplementedError

    def _stop_in_background(self) -> None:
        raise NotImplementedError
