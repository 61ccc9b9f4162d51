"""The side tables' clauses (conformance/side_tables.py) on PostgreSQL, MySQL and the in-memory backend."""

from __future__ import annotations

import pytest

from conformance.harness import Harness
from conformance.side_tables import SideTableTests


class TestSideTables(SideTableTests):
    __test__ = True

    @pytest.fixture
    def harness(self, db: Harness) -> Harness:
        return db
