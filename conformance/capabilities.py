"""Capability needs as a plain decorator, read from the backend's Capabilities: no markers to register."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from typing import Any, Final, TypeVar

from conformance.harness import Harness
from conformance.protocols import PROTOCOLS, unmet_protocol
from proletarian_ref.backend import Capabilities

F = TypeVar("F", bound=Callable[..., Any])

_NEEDS: Final = "__conformance_needs__"
_CAPABILITY_FIELDS: Final = frozenset(f.name for f in dataclasses.fields(Capabilities))

# Needs that are not Capabilities fields but facts about the harness or the platform.
NEEDS_FACTORY: Final = "factory"
NEEDS_SIGKILL: Final = "sigkill"


def requires(*facts: str, **capabilities: object) -> Callable[[F], F]:
    """Skip the test, with the reason, unless the backend has these capabilities.

    `@requires(multi_process=True)` reads `harness.capabilities.multi_process`; the positional facts
    "factory" (the harness was made by load_harness, so another process can rebuild it) and "sigkill"
    (the platform can kill a process outright) cover what Capabilities cannot know, and so do the
    optional protocols of conformance.protocols ("batch_claim", "batch_enqueue", "release_connection",
    "notifications", "chained_claim", "chained_batch_claim"): the backend must implement that protocol.
    """
    unknown = set(capabilities) - _CAPABILITY_FIELDS
    if unknown:
        raise TypeError(
            f"unknown capabilities {sorted(unknown)}; Capabilities has {sorted(_CAPABILITY_FIELDS)}"
        )
    bad_facts = set(facts) - {NEEDS_FACTORY, NEEDS_SIGKILL, *PROTOCOLS}
    if bad_facts:
        raise TypeError(
            f"unknown facts {sorted(bad_facts)}; use {NEEDS_FACTORY!r}, {NEEDS_SIGKILL!r} "
            f"or a protocol of {sorted(PROTOCOLS)}"
        )

    def decorate(test: F) -> F:
        needs: dict[str, object] = dict(getattr(test, _NEEDS, {}))
        needs.update(capabilities)
        needs.update(dict.fromkeys(facts, True))
        setattr(test, _NEEDS, needs)
        return test

    return decorate


def capability(harness: Harness, name: str) -> object:
    """A capability of the harness's backend, from its Capabilities."""
    return getattr(harness.capabilities, name)


def needs_of_inner(test: Callable[..., Any]) -> dict[str, object]:
    """The needs of the function under a hypothesis wrapper, in case @requires went inside @given."""
    inner = getattr(getattr(test, "hypothesis", None), "inner_test", None)
    needs: dict[str, object] = getattr(inner, _NEEDS, {})
    return needs


def unmet_need(test: Callable[..., Any], harness: Harness) -> str | None:
    """Why `test` cannot run against `harness`, or None when it can."""
    needs: dict[str, object] = getattr(test, _NEEDS, None) or needs_of_inner(test)
    for name, wanted in needs.items():
        if name == NEEDS_FACTORY:
            if harness.factory is None:
                return (
                    f"{harness.name}: the harness was not made by conformance.load_harness("
                    "'module:factory'), so a worker process cannot rebuild it"
                )
        elif name == NEEDS_SIGKILL:
            if not hasattr(signal, "SIGKILL"):
                return "this platform has no SIGKILL to kill a worker process with"
        elif name in PROTOCOLS:
            reason = unmet_protocol(harness, name)
            if reason is not None:
                return reason
        else:
            actual = capability(harness, name)
            if actual != wanted:
                return f"{harness.name}: capabilities.{name} is {actual!r}; this test needs {wanted!r}"
    return None
