"""The error history's clauses (conformance/error_history.py) on PostgreSQL, MySQL and memory."""

from __future__ import annotations

import pytest

from conformance.error_history import ErrorHistoryTests
from conformance.harness import Harness


class TestErrorHistory(ErrorHistoryTests):
    __test__ = True

    @pytest.fixture
    def harness(self, db: Harness) -> Harness:
        return db
