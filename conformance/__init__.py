"""The proletarian-ref conformance suite: proof that a backend behaves as Proletarian's database does.

PYTEST_DONT_REWRITE: this file only (it has no asserts); the submodules' asserts are rewritten, see below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import pytest
except ImportError:  # the harnesses alone (the benchmarks' backends) run without the suite's extra
    pass
else:
    # Installed packages' asserts are not rewritten unless asked before their modules are imported: the
    # clauses' plain asserts would fail as a bare AssertionError. This file is being imported already
    # (its docstring's marker keeps pytest from warning so); the submodules, which hold the asserts, are not.
    pytest.register_assert_rewrite("conformance")

from conformance.capabilities import requires
from conformance.harness import (
    Harness,
    HarnessFactory,
    MemoryHarness,
    SqlHarness,
    installed,
    load_harness,
)

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
