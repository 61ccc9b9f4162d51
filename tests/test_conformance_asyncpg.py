"""The asyncio PostgreSQL backend on asyncpg (AsyncpgBackend) through the conformance suite, as a third
party runs it: the same clauses, through conformance.aio_bridge's blocking view on a private event loop."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from fix_db import _load

from conformance import BackendSuite, SqlHarness, WorkerSuite
from conformance.aio_bridge import blocking_backend_class
from conformance.contract_chain import ChainedClaimTests
from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend


@pytest.fixture(scope="session")
def pg_asyncpg_harness(pg_harness: SqlHarness, pg_dsn: str) -> SqlHarness:
    # The tables pg_harness installed, under the asyncpg backend.
    return _load("conformance.aio_bridge:postgresql_asyncpg", pg_dsn)


@pytest.fixture
def pg_asyncpg_db(pg_asyncpg_harness: SqlHarness) -> Iterator[SqlHarness]:
    pg_asyncpg_harness.clear()
    yield pg_asyncpg_harness
    pg_asyncpg_harness.close()


class TestPostgreSQLAsyncpg(BackendSuite):
    @pytest.fixture
    def harness(self, pg_asyncpg_db: SqlHarness) -> SqlHarness:
        return pg_asyncpg_db


class TestPostgreSQLAsyncpgBatch(WorkerSuite):
    """The worker clauses in batch mode on the asyncpg backend."""

    @pytest.fixture
    def harness(self, pg_asyncpg_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = pg_asyncpg_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


@pytest.fixture
def pg_asyncpg_db_chain(pg_asyncpg_db: SqlHarness) -> Iterator[SqlHarness]:
    """The same tables under the backend with chained claims on the compact plan."""
    chained = pg_asyncpg_db.with_backend(
        blocking_backend_class(functools.partial(AsyncpgBackend, compact=True, chain=True)),
        "postgresql-asyncpg-chain",
    )
    try:
        yield chained
    finally:
        chained.close()


class TestPostgreSQLAsyncpgChain(WorkerSuite):
    """The worker clauses with chained claims: each job still its own transaction, claimed and run once."""

    @pytest.fixture
    def harness(self, pg_asyncpg_db_chain: SqlHarness) -> SqlHarness:
        return pg_asyncpg_db_chain


class TestPostgreSQLAsyncpgChainClauses(ChainedClaimTests):
    """J1-J7 on the asyncio backend with chained claims."""

    __test__ = True

    @pytest.fixture
    def harness(self, pg_asyncpg_db_chain: SqlHarness) -> SqlHarness:
        return pg_asyncpg_db_chain
