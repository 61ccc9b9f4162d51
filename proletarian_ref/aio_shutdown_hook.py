"""The asyncio worker's shutdown hook: SIGTERM and SIGINT stop every hooked worker, then end the process."""

from __future__ import annotations

import asyncio
import functools
import signal
import threading
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from proletarian_ref.aio import AsyncQueueWorker

# The threaded hook's promises (proletarian_ref/shutdown_hook.py), on the event loop: the handlers are the
# running loop's (loop.add_signal_handler), so they run as loop callbacks between tasks, and the stop is
# a task like any other. Installed over the default handlers only (asyncio.run's own SIGINT handler, which
# cancels the main task, counts as one); the previous ones come back when the last hooked worker stops.

_HOOK_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
_hooked: list[AsyncQueueWorker] = []
_previous_handlers: dict[int, Any] = {}
_stopping: set[asyncio.Task[None]] = set()  # the running stop tasks, kept from the garbage collector


def _is_default_handler(signum: int, handler: Any) -> bool:
    if handler is (signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL):
        return True
    # asyncio.Runner's SIGINT handler: functools.partial(Runner._on_sigint, main_task=...).
    func = getattr(handler, "func", None) if isinstance(handler, functools.partial) else None
    return signum == signal.SIGINT and getattr(func, "__name__", None) == "_on_sigint"


def hook(worker: AsyncQueueWorker) -> None:
    """Hook `worker` (from its start(), on the running loop): the first hooked one installs the handlers."""
    _hooked.append(worker)
    if threading.current_thread() is not threading.main_thread():
        return  # Python allows signal handlers to be set on the main thread only
    loop = asyncio.get_running_loop()
    for signum in _HOOK_SIGNALS:
        handler = signal.getsignal(signum)
        if signum not in _previous_handlers and _is_default_handler(signum, handler):
            _previous_handlers[signum] = handler
            loop.add_signal_handler(signum, _stop_on_signal, signum)


def unhook(worker: AsyncQueueWorker) -> None:
    """Unhook `worker` (from its stop()); the last one gives the signals their previous handlers back."""
    if worker in _hooked:
        _hooked.remove(worker)
    if _hooked or threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for signum, previous in list(_previous_handlers.items()):
        loop.remove_signal_handler(signum)
        signal.signal(signum, previous)
        del _previous_handlers[signum]


def _stop_on_signal(signum: int) -> None:
    loop = asyncio.get_running_loop()
    task = loop.create_task(_stop_all_then_exit(signum), name="proletarian-shutdown-hook")
    _stopping.add(task)
    task.add_done_callback(_stopping.discard)


async def _stop_all_then_exit(signum: int) -> None:
    """Stop every hooked worker at once (drain, then release), then end the process with 128 + signal.

    Each stop() unhooks its worker, so the signals have their previous handlers back meanwhile: a second
    one does what it would have done without the hook (SIGTERM ends the process at once). SystemExit,
    raised in this task, leaves the event loop's run (asyncio.run cancels the other tasks, so their
    `finally` blocks run, and atexit functions run), as the threaded hook ends the process like the JVM.
    """
    workers = list(_hooked)
    if not workers:
        # The last hooked worker stopped between the signal and this task, and the previous handlers are
        # back: do what the signal would have done without the hook.
        signal.raise_signal(signum)
        return
    await asyncio.gather(*(worker._stop_logging_errors() for worker in workers))
    raise SystemExit(128 + signum)
