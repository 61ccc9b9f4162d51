"""The asyncio MySQL backend (aiomysql) through the conformance suite, as a third party runs it: the same
clauses, through conformance.aio_bridge's blocking view on a private event loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fix_db import _load

from conformance import BackendSuite, SqlHarness, WorkerSuite
from conformance.contract_chain import ChainedClaimTests


@pytest.fixture(scope="session")
def mysql_async_harness(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    # The tables mysql_harness installed, under the asyncio backend.
    return _load("conformance.aio_bridge:mysql_async", mysql_time_zones)


@pytest.fixture(scope="session")
def mysql_async_compact_harness(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    return _load("conformance.aio_bridge:mysql_async_compact", mysql_time_zones)


@pytest.fixture(scope="session")
def mysql_async_chain_harness(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    return _load("conformance.aio_bridge:mysql_async_chain", mysql_time_zones)


@pytest.fixture
def mysql_async_db(mysql_async_harness: SqlHarness) -> Iterator[SqlHarness]:
    mysql_async_harness.clear()
    yield mysql_async_harness
    mysql_async_harness.close()


@pytest.fixture
def mysql_async_compact_db(mysql_async_compact_harness: SqlHarness) -> Iterator[SqlHarness]:
    mysql_async_compact_harness.clear()
    yield mysql_async_compact_harness
    mysql_async_compact_harness.close()


@pytest.fixture
def mysql_async_chain_db(mysql_async_chain_harness: SqlHarness) -> Iterator[SqlHarness]:
    mysql_async_chain_harness.clear()
    yield mysql_async_chain_harness
    mysql_async_chain_harness.close()


class TestMySQLAsync(BackendSuite):
    @pytest.fixture
    def harness(self, mysql_async_db: SqlHarness) -> SqlHarness:
        return mysql_async_db


class TestMySQLAsyncBatch(WorkerSuite):
    """The worker clauses in batch mode on the asyncio backend."""

    @pytest.fixture
    def harness(self, mysql_async_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = mysql_async_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


class TestMySQLAsyncCompact(WorkerSuite):
    """The worker clauses on the compact plan: a job's archive and delete in one multi-statement query."""

    @pytest.fixture
    def harness(self, mysql_async_compact_db: SqlHarness) -> SqlHarness:
        return mysql_async_compact_db


class TestMySQLAsyncChain(WorkerSuite):
    """The worker clauses with chained claims: each job still its own transaction, claimed and run once."""

    @pytest.fixture
    def harness(self, mysql_async_chain_db: SqlHarness) -> SqlHarness:
        return mysql_async_chain_db


class TestMySQLAsyncChainBatch(WorkerSuite):
    """The worker clauses in batch mode with chained claims: each batch its own transaction."""

    @pytest.fixture
    def harness(self, mysql_async_chain_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = mysql_async_chain_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


class TestMySQLAsyncChainClauses(ChainedClaimTests):
    """J1-J7 on the asyncio backend's chained plan."""

    __test__ = True

    @pytest.fixture
    def harness(self, mysql_async_chain_db: SqlHarness) -> SqlHarness:
        return mysql_async_chain_db
