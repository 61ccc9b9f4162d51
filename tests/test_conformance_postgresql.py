"""The PostgreSQL backend (psycopg 3) through the conformance suite, exactly as a third party runs it."""

from __future__ import annotations

import pytest

from conformance import BackendSuite, SqlHarness


class TestPostgreSQL(BackendSuite):
    @pytest.fixture
    def harness(self, pg_db: SqlHarness) -> SqlHarness:
        return pg_db


class TestPostgreSQLPipeline(BackendSuite):
    """The same suite with the backend on its pipelined statement plan (PostgresBackend(pipeline=True))."""

    @pytest.fixture
    def harness(self, pg_pipeline_db: SqlHarness) -> SqlHarness:
        return pg_pipeline_db
