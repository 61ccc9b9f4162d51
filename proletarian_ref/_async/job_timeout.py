"""A queue worker's job timeout: tell a handler at its deadline, end it after the grace, JobTimeoutError."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proletarian_ref import log as ev
from proletarian_ref.errors import JobTimeoutError
from proletarian_ref.worker_core import WorkerCore

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from proletarian_ref._acompat import AsyncHandlerFn
    from proletarian_ref.watchdog import AsyncWatchdog


class AsyncJobTimeout(WorkerCore):
    """The job bound (job_timeout_ms) of aio.AsyncQueueWorker's handlers; its threaded twin, generated
    from it, QueueWorker's. Its watchdog calls _at_deadline, then _after_grace; each worker class says
    how a handler is told its time is up and how it is ended after the grace (the task is cancelled;
    the thread's transaction is ended from another connection)."""

    def _timed_handler(self, n: int, handler_fn: AsyncHandlerFn, watchdog: AsyncWatchdog) -> AsyncHandlerFn:
        """handler_fn under poller n's job bound: told at the deadline, failed with JobTimeoutError if it
        then raises, ended if it has not returned after the grace."""
        lock, timing, timed_out = self._lock, self._timing, self._timed_out
        timeout_ms = self._job_timeout_ms

        async def timed(*args: Any, **kwargs: Any) -> object:
            token = object()
            with lock:
                timing[n] = token
                self._arm(n, token)
            watchdog.arm(n, token)
            try:
                async with self._bound(n):
                    return await handler_fn(*args, **kwargs)
            except Exception as exc:
                if timed_out.get(n) is token:
                    raise JobTimeoutError(f"the job ran past job_timeout_ms={timeout_ms:g}") from exc
                raise
            finally:
                watchdog.disarm(n, token)
                with lock:
                    timing.pop(n, None)
                    timed_out.pop(n, None)
                self._disarm(n)

        return timed

    def _at_deadline(self, n: int, token: object) -> None:
        with self._lock:
            if self._timing.get(n) is not token:
                return  # it returned meanwhile
            self._timed_out[n] = token
            self._tell_late(n)
            job = dict(self._current_jobs.get(n, {}))
        self._safe_log(
            ev.JOB_TIMED_OUT,
            {ev.QUEUE_WORKER_ID: self.queue_worker_id, ev.WORKER_THREAD_ID: n, **job, **self._timeout_data()},
        )

    def _after_grace(self, n: int, token: object) -> None:
        # Under the lock the handler's return takes before its job's writes: what is ended is this
        # handler, never the next job's.
        with self._lock:
            if self._timing.get(n) is not token:
                return
            job = dict(self._current_jobs.get(n, {}))
            released = self._end_handler(n)
        if released:
            self._safe_log(
                ev.JOB_RELEASED,
                {
                    ev.QUEUE_WORKER_ID: self.queue_worker_id,
                    ev.WORKER_THREAD_ID: n,
                    **job,
                    "reason": "job-timeout",
                    **self._timeout_data(),
                },
            )

    # -- what each worker class says ---------------------------------------------------------------------

    def _arm(self, n: int, token: object) -> None:
        """Under the lock, as poller n's handler starts: what tells it, from now on, that its time is up."""
        raise NotImplementedError

    def _bound(self, n: int) -> AbstractAsyncContextManager[Any]:
        """What poller n's handler runs inside, for _end_handler to end it by."""
        raise NotImplementedError

    def _disarm(self, n: int) -> None:
        """Poller n's handler is over: undo _arm and _bound."""
        raise NotImplementedError

    def _tell_late(self, n: int) -> None:
        """Under the lock, at poller n's deadline: tell its handler (interrupted() turns true)."""
        raise NotImplementedError

    def _end_handler(self, n: int) -> bool:
        """Under the lock, after poller n's grace: end its handler; whether its job went back to the queue
        (attempts unchanged), to be logged as released."""
        raise NotImplementedError
