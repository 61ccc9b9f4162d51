"""The names that differ between the asyncio job code and the threaded code generated from it."""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    # Only for annotations: the threaded code imports this module, and never needs asyncio.
    from asyncio import Condition as ACondition
    from asyncio import Event as AEvent
    from asyncio import Task

    ASpawned = Task[None]

__all__ = [
    "SYNC_NAMES",
    "ACondition",
    "AEvent",
    "ASpawned",
    "AsyncHandlerFn",
    "AsyncJobOver",
    "AsyncPollFailure",
    "Condition",
    "Event",
    "HandlerFn",
    "JobOver",
    "PollFailure",
    "Spawned",
    "acondition_wait_for",
    "aevent_wait",
    "asettle",
    "aspawn",
    "aspawned_name",
    "condition_wait_for",
    "event_wait",
    "settle",
    "spawn",
    "spawned_name",
]

_T = TypeVar("_T")

# tools/generate_sync.py turns each name on the left into the one on the right (and `async`/`await` into
# nothing): the asyncio source proletarian_ref/_async/*.py becomes proletarian_ref/_sync/*.py.
Event = threading.Event
Condition = threading.Condition
Spawned = threading.Thread
HandlerFn = Callable[..., object]
AsyncHandlerFn = Callable[..., Awaitable[object]]
# What a poller runs after each job of a chain (ChainedClaim) commits: its run is over, the next claimed.
JobOver = Callable[[], None]
AsyncJobOver = Callable[[], Awaitable[None]]
# What a poller's failed run may raise and still be logged and backed off from: on the event loop not a
# CancelledError (stop() cancels a stuck task), on a thread anything (stop() closing a job's connection
# may surface as any error, and a dying thread must still say why).
AsyncPollFailure = Exception
PollFailure = BaseException

SYNC_NAMES: Final = {
    "AEvent": "Event",
    "AsyncHandlerFn": "HandlerFn",
    "AsyncBackend": "Backend",
    "AsyncBatchClaim": "BatchClaim",
    "AsyncArchiveAndDelete": "ArchiveAndDelete",
    "AsyncChainedClaim": "ChainedClaim",
    "AsyncChainedBatchClaim": "ChainedBatchClaim",
    "AsyncJobOver": "JobOver",
    "AsyncErrorStore": "ErrorStore",
    "asettle": "settle",
    # The side tables' stores (proletarian_ref/_async/unique_claims.py).
    "AsyncSqlUniqueStore": "SqlUniqueStore",
    "AsyncUniqueStore": "UniqueStore",
    "_arun": "_run",
    "arun": "run",
    "arows": "rows",
    "acount": "count",
    "AbstractAsyncContextManager": "AbstractContextManager",
    # The asyncio modules import each other by this package name; their threaded twins, _sync's.
    "_async": "_sync",
    "astore_in": "store_in",
    # The caller's connection and its backend, for enqueue (proletarian_ref/_async/enqueue.py).
    "acaller_connection": "caller_connection",
    "abackend_for_connection": "backend_for_connection",
    # The queue worker's poll loop (proletarian_ref/_async/poll_loop.py).
    "AsyncPollLoop": "PollLoop",
    "AsyncPollFailure": "PollFailure",
    # Its waits and wake-ups (proletarian_ref/_async/wake.py).
    "AsyncWake": "Wake",
    # Its lifecycle (proletarian_ref/_async/lifecycle.py): tasks become threads.
    "AsyncLifecycle": "Lifecycle",
    "ASpawned": "Spawned",
    "aspawn": "spawn",
    "aspawned_name": "spawned_name",
    # stop()'s drain then release (proletarian_ref/_async/drain.py).
    "AsyncDrain": "Drain",
    # The job timeout (proletarian_ref/_async/job_timeout.py): the loop's timers or a watchdog thread.
    "AsyncJobTimeout": "JobTimeout",
    "AsyncWatchdog": "Watchdog",
    "_tasks": "_threads",
    "_listener_task": "_listener_thread",
    "ACondition": "Condition",
    "aevent_wait": "event_wait",
    "acondition_wait_for": "condition_wait_for",
    "AsyncListener": "Listener",
    "AsyncNotifications": "Notifications",
}


def settle(result: _T) -> _T:
    """What a caller's function returned (the threaded twin of asettle)."""
    return result


async def asettle(result: Any) -> Any:
    """What a caller's function returned, awaited if it is awaitable: the asyncio worker takes a
    retry_strategy_fn or failed_job_fn written either way."""
    if inspect.isawaitable(result):
        return await result
    return result


def event_wait(event: threading.Event, timeout: float) -> bool:
    """Wait until `event` is set or `timeout` seconds pass; whether it is set."""
    return event.wait(timeout)


async def aevent_wait(event: AEvent, timeout: float) -> bool:
    """event_wait on the event loop."""
    import asyncio  # here, not above: the threaded code never needs asyncio

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
    return event.is_set()


def condition_wait_for(condition: threading.Condition, predicate: Callable[[], bool], timeout: float) -> None:
    """Wait, holding `condition`, until `predicate` holds or `timeout` seconds pass."""
    condition.wait_for(predicate, timeout)


async def acondition_wait_for(condition: ACondition, predicate: Callable[[], bool], timeout: float) -> None:
    """condition_wait_for on the event loop."""
    import asyncio

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(condition.wait_for(predicate), timeout)


def spawn(target: Callable[..., object], *args: object, name: str, daemon: bool | None = None) -> Spawned:
    """A started thread running target(*args); not a daemon unless told, or its starter is one."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def aspawn(
    target: Callable[..., Coroutine[Any, Any, None]], *args: object, name: str, daemon: bool | None = None
) -> ASpawned:
    """spawn on the event loop: a task running target(*args) (daemon means nothing to a task)."""
    import asyncio

    return asyncio.create_task(target(*args), name=name)


def spawned_name(spawned: Spawned) -> str:
    """The name a poller was spawned with: its thread's."""
    return spawned.name


def aspawned_name(spawned: ASpawned) -> str:
    """spawned_name on the event loop: its task's."""
    return spawned.get_name()
