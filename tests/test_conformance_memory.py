"""The in-memory backend through the conformance suite: the executable specification passes it too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance import BackendSuite, Harness, WorkerSuite, installed, load_harness


class TestMemory(BackendSuite):
    @pytest.fixture
    def harness(self) -> Iterator[Harness]:
        with installed(load_harness("conformance.builtin:memory")) as harness:
            yield harness


class TestMemoryBatch(WorkerSuite):
    """The clauses that run a worker again, every queue worker and process_next_job in batch mode."""

    @pytest.fixture
    def harness(self) -> Iterator[Harness]:
        with installed(
            load_harness("conformance.builtin:memory").with_worker_options(batch_size=8)
        ) as harness:
            yield harness
