"""The asyncio PostgreSQL backend (psycopg AsyncConnection) through the conformance suite, as a third party
runs it: the same clauses, through conformance.aio_bridge's blocking view on a private event loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fix_db import _load

from conformance import BackendSuite, SqlHarness, WorkerSuite


@pytest.fixture(scope="session")
def pg_async_harness(pg_harness: SqlHarness, pg_dsn: str) -> SqlHarness:
    # The tables pg_harness installed, under the asyncio backend.
    return _load("conformance.aio_bridge:postgresql_async", pg_dsn)


@pytest.fixture
def pg_async_db(pg_async_harness: SqlHarness) -> Iterator[SqlHarness]:
    pg_async_harness.clear()
    yield pg_async_harness
    pg_async_harness.close()


class TestPostgreSQLAsync(BackendSuite):
    @pytest.fixture
    def harness(self, pg_async_db: SqlHarness) -> SqlHarness:
        return pg_async_db


class TestPostgreSQLAsyncBatch(WorkerSuite):
    """The worker clauses in batch mode on the asyncio backend."""

    @pytest.fixture
    def harness(self, pg_async_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = pg_async_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()
