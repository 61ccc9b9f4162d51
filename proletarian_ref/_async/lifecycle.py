"""A queue worker's lifecycle: start its pollers and listener, stop them (drain, then release), stopping()."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Self

from proletarian_ref import log as ev
from proletarian_ref._acompat import asettle, aspawn
from proletarian_ref._async.drain import AsyncDrain
from proletarian_ref._async.poll_loop import AsyncPollLoop
from proletarian_ref.backend import AsyncListener
from proletarian_ref.errors import ShutdownTimeoutError

if TYPE_CHECKING:
    from proletarian_ref._acompat import ASpawned


class AsyncLifecycle(AsyncDrain, AsyncPollLoop):
    """start() and stop() of aio.AsyncQueueWorker; its threaded twin, generated from it, QueueWorker's.
    Each worker class says how stop() is requested and how its shutdown hook is set (and, through
    AsyncDrain, how its pollers drain and what it releases at the deadline)."""

    _tasks: list[ASpawned]
    _listener_task: ASpawned | None
    # Whether a second stop() calls on_shutdown again: the threaded worker does, as Proletarian's does.
    _ON_SHUTDOWN_AGAIN: ClassVar[bool]

    async def start(self) -> bool | None:
        """Start the pollers; None if already started (a stopped worker cannot restart)."""
        with self._lock:
            if self._started:
                return None
            self._started = True
            self._hook_signals()
            for n in range(1, self._worker_threads + 1):
                self._tasks.append(aspawn(self._work, n, name=f"{self.queue_worker_id}-{n}"))
            if self._listens:
                # A daemon thread: it holds no job, and stop() interrupts it or it ends within a tick.
                self._listener_task = aspawn(
                    self._listen, name=f"{self.queue_worker_id}-listener", daemon=True
                )
            return True

    async def stop(self) -> bool | None:
        """Stop polling, let running jobs drain for await_termination_timeout_ms, then release the rest;
        ShutdownTimeoutError if any was still running then (on_shutdown is skipped)."""
        with self._lock:
            if not self._started:
                return None
            already = self._stopped
            self._stopped = True
        context = {ev.QUEUE_WORKER_ID: self.queue_worker_id}
        if already:
            self._safe_log(ev.ALREADY_SHUT_DOWN, context)
            if not self._ON_SHUTDOWN_AGAIN:
                return True
        else:
            self._unhook_signals()
            self._safe_log(ev.SHUTTING_DOWN, context)
            listening = self._request_stop()
            async with self._wake:
                self._wake.notify_all()
            if listening is not None:
                listening.interrupt()
            still_running = await self._drain_then_release()
            if self._owns_backend:
                await self.backend.close()
            if still_running:
                raise ShutdownTimeoutError(
                    f"Could not shut down the queue worker within {self._await_timeout * 1000:g} ms; "
                    f"still running: {'; '.join(still_running)}"
                )
            self._safe_log(ev.COMPLETED_SHUTDOWN, context)
        await asettle(self._on_shutdown())
        return True

    def stopping(self) -> bool:
        """Whether stop() has begun: a long handler may check it and raise JobInterrupted to give back.

        Inside a handler, proletarian_ref.interrupted() says the same, or that the job's time is up.
        """
        return self._stop_event.is_set()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- what each worker class says ---------------------------------------------------------------------

    def _hook_signals(self) -> None:
        """Set the shutdown hook, if the worker was made with install_shutdown_hook."""
        raise NotImplementedError

    def _unhook_signals(self) -> None:
        raise NotImplementedError

    def _request_stop(self) -> AsyncListener | None:
        """Tell the pollers and running handlers that stop() has begun; the listener to interrupt, if any."""
        raise NotImplementedError
