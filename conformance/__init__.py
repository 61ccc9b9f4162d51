"""The proletarian-ref conformance suite: proof that a backend behaves as Proletarian's database does."""

from conformance.harness import Harness, MemoryHarness, SqlHarness, load_harness

__all__ = ["Harness", "MemoryHarness", "SqlHarness", "load_harness"]
