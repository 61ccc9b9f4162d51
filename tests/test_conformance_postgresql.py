"""The PostgreSQL backend (psycopg 3) through the conformance suite, exactly as a third party runs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance import BackendSuite, SqlHarness


class TestPostgreSQL(BackendSuite):
    @pytest.fixture
    def harness(self, pg_db: SqlHarness) -> SqlHarness:
        return pg_db


class TestPostgreSQLWithNotify(BackendSuite):
    """The same suite with every enqueue announcing its job (notify=True), as wake-up users enqueue."""

    @pytest.fixture
    def harness(self, pg_db: SqlHarness) -> Iterator[SqlHarness]:
        pg_db.enqueue_options = {"notify": True}
        try:
            yield pg_db
        finally:
            pg_db.enqueue_options = {}
