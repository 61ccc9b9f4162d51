"""The in-memory backend through the conformance suite: the executable specification passes it too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance import BackendSuite, Harness, installed, load_harness


class TestMemory(BackendSuite):
    @pytest.fixture
    def harness(self) -> Iterator[Harness]:
        with installed(load_harness("conformance.builtin:memory")) as harness:
            yield harness
