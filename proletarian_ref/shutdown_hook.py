"""The queue worker's shutdown hook: SIGTERM and SIGINT stop every hooked worker, then end the process."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from proletarian_ref.worker import QueueWorker

# The JVM runs Proletarian's shutdown hook on System.exit, SIGTERM and SIGINT, and not when main returns
# while worker threads live. Python runs atexit functions only after it has joined every non-daemon
# thread, so an atexit hook would never fire while the worker runs; the hook is therefore a SIGTERM and
# SIGINT handler, installed on the main thread over the default handlers only.

_HOOK_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
_hooked: list[QueueWorker] = []
_hooked_lock = threading.RLock()  # a signal handler may run while the main thread holds it
_previous_handlers: dict[int, Any] = {}


def _is_default_handler(signum: int, handler: Any) -> bool:
    return handler is (signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)


def hook(worker: QueueWorker) -> None:
    with _hooked_lock:
        _hooked.append(worker)
        if threading.current_thread() is not threading.main_thread():
            return  # Python allows signal handlers to be set on the main thread only
        for signum in _HOOK_SIGNALS:
            handler = signal.getsignal(signum)
            if _is_default_handler(signum, handler):
                _previous_handlers[signum] = handler
                signal.signal(signum, _stop_on_signal)


def unhook(worker: QueueWorker) -> None:
    with _hooked_lock:
        if worker in _hooked:
            _hooked.remove(worker)
        if _hooked or threading.current_thread() is not threading.main_thread():
            return  # a handler left behind with no worker to stop behaves as the default one
        for signum, previous in list(_previous_handlers.items()):
            if signal.getsignal(signum) is _stop_on_signal:
                signal.signal(signum, previous)
            del _previous_handlers[signum]


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    """Stop every hooked worker (drain, then release), then exit with 128 + signal, as the JVM does."""
    with _hooked_lock:
        workers = list(_hooked)
    if not workers:
        # Every hooked worker is stopping or stopped already (perhaps by this very thread, in a stop()
        # the signal interrupted): do what the signal would have done without the hook.
        if signum == signal.SIGINT:
            signal.default_int_handler(signum, frame)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    for worker in workers:
        worker._stop_logging_errors()
    code = 128 + signum
    if threading.main_thread().is_alive() and not any(w._threads_alive() for w in workers):
        # The main thread is running: unwind it, so finally blocks and atexit functions run.
        raise SystemExit(code)
    # The main thread has returned, so Python is waiting for non-daemon threads, or a released handler is
    # still running and would keep the process alive: end it, as the JVM halts after its hooks.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
