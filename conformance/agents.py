"""Transactions held open in their own threads and driven step by step, each step with a bounded wait.

Lock tests need several transactions open at once, and a connection belongs to one thread. A step that
does not return in time means the backend waited on a lock that SKIP LOCKED should have skipped: the
test fails with that, instead of hanging.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

from conformance.faults import BlockedError
from proletarian_ref.backend import Backend

T = TypeVar("T")

DEFAULT_STEP_TIMEOUT: Final = 3.0
BEGIN_TIMEOUT: Final = 15.0
_counter = itertools.count(1)


class _Rollback(Exception):
    """Thrown into the backend's transaction block to make it roll back."""


class TxAgent:
    """One backend transaction at a time, run by a dedicated thread."""

    def __init__(self, backend: Backend, *, name: str = "", timeout: float = DEFAULT_STEP_TIMEOUT) -> None:
        self.backend = backend
        self.name = name or f"tx-agent-{next(_counter)}"
        self.timeout = timeout
        self.stuck = False
        self.in_transaction = False
        self._seq = 0
        self._inbox: queue.Queue[tuple[int, str, Callable[[Any], Any] | None]] = queue.Queue()
        self._outbox: queue.Queue[tuple[int, bool, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    # -- the caller's side -----------------------------------------------------------------------------

    def _send(self, kind: str, fn: Callable[[Any], Any] | None, what: str, timeout: float | None) -> Any:
        if self.stuck:
            raise BlockedError(f"{self.name} is still blocked in an earlier step; cannot {what}")
        self._seq += 1
        seq = self._seq
        self._inbox.put((seq, kind, fn))
        limit = self.timeout if timeout is None else timeout
        while True:
            try:
                got, ok, value = self._outbox.get(timeout=limit)
            except queue.Empty:
                self.stuck = True
                raise BlockedError(
                    f"{what} in {self.name} did not return within {limit:g} s: the backend waited for a lock "
                    "held by another open transaction instead of skipping it"
                ) from None
            if got != seq:
                continue  # The late answer of a step that timed out earlier.
            if not ok:
                raise value
            return value

    def begin(self) -> None:
        # A begin waits for no row lock, but may connect, which takes seconds on a loaded machine: only a
        # step inside the transaction counts as blocked after `timeout`.
        self._send("begin", None, "begin", max(self.timeout, BEGIN_TIMEOUT))
        self.in_transaction = True

    def run(self, fn: Callable[[Any], T], what: str = "a statement", timeout: float | None = None) -> T:
        """fn(conn) inside the open transaction, on the agent's thread."""
        result: T = self._send("call", fn, what, timeout)
        return result

    def commit(self) -> None:
        self.in_transaction = False
        self._send("commit", None, "commit", None)

    def rollback(self) -> None:
        self.in_transaction = False
        self._send("rollback", None, "rollback", None)

    def close(self, timeout: float = DEFAULT_STEP_TIMEOUT) -> None:
        """Roll back whatever is open and stop the thread; a blocked thread is left to finish on its own."""
        self.in_transaction = False
        self._inbox.put((-1, "stop", None))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the agent's thread ----------------------------------------------------------------------------

    def _reply(self, seq: int, ok: bool, value: Any) -> None:
        self._outbox.put((seq, ok, value))

    def _main(self) -> None:
        while True:
            seq, kind, _ = self._inbox.get()
            if kind == "stop":
                return
            if kind != "begin":
                self._reply(seq, False, RuntimeError(f"{kind} outside a transaction in {self.name}"))
                continue
            if self._transaction(seq):
                return

    def _transaction(self, begin_seq: int) -> bool:
        """Run one transaction; True when the agent was told to stop."""
        end_seq, stop, answered = begin_seq, False, False
        try:
            with self.backend.transaction() as conn:
                self._reply(begin_seq, True, None)
                answered = True
                while True:
                    seq, kind, fn = self._inbox.get()
                    if kind == "call" and fn is not None:
                        try:
                            self._reply(seq, True, fn(conn))
                        except BaseException as exc:
                            self._reply(seq, False, exc)
                        continue
                    end_seq, stop = seq, kind == "stop"
                    if kind == "commit":
                        break
                    raise _Rollback
        except _Rollback:
            self._reply(end_seq, True, None)
        except BaseException as exc:
            self._reply(end_seq if answered else begin_seq, False, exc)
        else:
            self._reply(end_seq, True, None)
        return stop


class AgentPool:
    """The agents of one test: each with a backend of its own, all closed together."""

    def __init__(self, make_backend: Callable[[], Backend], timeout: float = DEFAULT_STEP_TIMEOUT) -> None:
        self._make_backend = make_backend
        self._timeout = timeout
        self._agents: list[TxAgent] = []

    def agent(self) -> TxAgent:
        agent = TxAgent(self._make_backend(), timeout=self._timeout)
        self._agents.append(agent)
        return agent

    def close(self) -> None:
        # Free agents first: a stuck one is waiting for their locks and finishes once they roll back.
        agents = sorted(self._agents, key=lambda a: a.stuck)
        self._agents = []
        for agent in agents:
            agent.close()
        for agent in agents:
            if not agent.alive:
                agent.backend.close()

    def __enter__(self) -> AgentPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
