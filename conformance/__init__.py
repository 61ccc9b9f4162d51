"""The proletarian-ref conformance suite: proof that a backend behaves as Proletarian's database does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conformance.capabilities import requires
from conformance.harness import Harness, HarnessFactory, MemoryHarness, SqlHarness, installed, load_harness

if TYPE_CHECKING:
    from conformance.side_tables import SideTableTests
    from conformance.suite import BackendSuite, WorkerSuite

__all__ = [
    "BackendSuite",
    "Harness",
    "HarnessFactory",
    "MemoryHarness",
    "SideTableTests",
    "SqlHarness",
    "WorkerSuite",
    "installed",
    "load_harness",
    "requires",
]


def __getattr__(name: str) -> Any:
    # The suite module reads the hypothesis profile when it is imported; importing it lazily lets a
    # conftest import conformance (for harnesses) before it loads its profile.
    if name in ("BackendSuite", "WorkerSuite"):
        from conformance import suite

        return getattr(suite, name)
    if name == "SideTableTests":
        # The side tables' clauses (periodic and unique jobs) need cronsim, the periodic extra.
        from conformance import side_tables

        return side_tables.SideTableTests
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")
