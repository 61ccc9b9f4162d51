"""The optional protocols as needs: a section runs for a backend with its protocol, else skips naming it."""

from __future__ import annotations

import pytest

from conformance import load_harness, requires
from conformance.capabilities import unmet_need
from conformance.harness import MemoryHarness
from conformance.protocols import NEEDS_BATCH_CLAIM, NEEDS_NOTIFICATIONS, NEEDS_RELEASE, PROTOCOLS
from conformance.suite import BackendSuite, clauses
from proletarian_ref.backends.memory import MemoryBackend


class _WithoutBatchMode(MemoryBackend):
    """The in-memory backend without its batch claim, as a backend written before batch mode."""

    get_next_jobs = None  # type: ignore[assignment]


def test_a_protocol_need_is_met_by_a_backend_that_implements_the_protocol() -> None:
    @requires(NEEDS_BATCH_CLAIM, NEEDS_NOTIFICATIONS)
    def needs_batches_and_notifications() -> None:
        return None

    assert unmet_need(needs_batches_and_notifications, load_harness("conformance.builtin:memory")) is None


def test_an_unmet_protocol_need_names_the_backend_and_the_missing_protocol() -> None:
    @requires(NEEDS_RELEASE)
    def needs_release() -> None:
        return None

    @requires(NEEDS_BATCH_CLAIM)
    def needs_batches() -> None:
        return None

    memory = load_harness("conformance.builtin:memory")
    assert isinstance(memory, MemoryHarness)
    assert unmet_need(needs_release, memory) == (
        "memory: the backend (MemoryBackend) has no release_connection(thread_id) "
        "(what QueueWorker.stop() releases with)"
    )
    older = memory.with_backend(_WithoutBatchMode, name="older")
    reason = unmet_need(needs_batches, older)
    assert reason is not None
    assert reason.startswith("older: the backend (_WithoutBatchMode) has no BatchClaim"), reason


def test_requires_refuses_a_protocol_it_does_not_know() -> None:
    with pytest.raises(TypeError, match="unknown facts"):
        requires("teleportation")


@pytest.mark.parametrize("family", ["G", "Q", "L", "N"])
def test_every_clause_of_an_optional_section_names_its_protocol(family: str) -> None:
    """So that a backend without the protocol skips the section, and says why, instead of failing it."""
    for clause, (name, _) in clauses().items():
        if clause[0] != family or clause == "N1":  # N1 skips by itself (it predates the needs)
            continue
        needs = getattr(getattr(BackendSuite, name), "__conformance_needs__", {})
        assert set(needs) & set(PROTOCOLS), f"{clause} ({name}) needs no optional protocol: {needs}"
