"""The asyncio PostgreSQL backend (psycopg AsyncConnection) through the conformance suite, as a third party
runs it: the same clauses, through conformance.aio_bridge's blocking view on a private event loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fix_db import _load

from conformance import BackendSuite, SqlHarness, WorkerSuite
from conformance.contract_chain import ChainedClaimTests
from conformance.side_tables import SideTableTests


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


class TestPostgreSQLAsyncUniqueKeys(SideTableTests):
    """U1-U4 on the asyncio backend: the clauses' keyed enqueues go through proletarian_ref.aio.enqueue
    on the bridge's async connections (conformance.side_tables.keyed_enqueue). The periodic clauses (Y)
    drive the threaded Scheduler, which has no asyncio twin yet: not run here."""

    __test__ = True
    test_a_scheduler_skips_a_schedule_another_is_ticking = None  # type: ignore[assignment]
    test_schedulers_with_crashes_and_skewed_clocks_enqueue_each_tick_once = None  # type: ignore[assignment]

    @pytest.fixture
    def harness(self, pg_async_db: SqlHarness) -> SqlHarness:
        return pg_async_db


@pytest.fixture
def pg_async_pipeline_db(pg_async_db: SqlHarness, pg_dsn: str) -> Iterator[SqlHarness]:
    """The same tables under the asyncio backend on the pipelined statement plan."""
    pipelined = _load("conformance.aio_bridge:postgresql_async_pipeline", pg_dsn)
    try:
        yield pipelined
    finally:
        pipelined.close()


class TestPostgreSQLAsyncPipeline(BackendSuite):
    """Every clause on the pipelined plan: BEGIN with the claim, the writes queued and counted before
    COMMIT."""

    @pytest.fixture
    def harness(self, pg_async_pipeline_db: SqlHarness) -> SqlHarness:
        return pg_async_pipeline_db


class TestPostgreSQLAsyncPipelineBatch(WorkerSuite):
    """The worker clauses in batch mode on the pipelined plan: the batch's counts read after a sync."""

    @pytest.fixture
    def harness(self, pg_async_pipeline_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = pg_async_pipeline_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


@pytest.fixture(params=["postgresql_async_chain", "postgresql_async_pipeline_chain"])
def pg_async_db_chain(
    request: pytest.FixtureRequest, pg_async_db: SqlHarness, pg_dsn: str
) -> Iterator[SqlHarness]:
    """The same tables under the backend with chained claims on the compact plan; and in pipeline mode,
    one round trip a job. Made by their factories, so the property clauses' worker processes rebuild them."""
    chained = _load(f"conformance.aio_bridge:{request.param}", pg_dsn)
    try:
        yield chained
    finally:
        chained.close()


class TestPostgreSQLAsyncChainBatch(WorkerSuite):
    """The worker clauses in batch mode with chained claims: a whole batch's COMMIT goes with the next
    BEGIN, and in pipeline mode its server-checked archive with them."""

    @pytest.fixture
    def harness(self, pg_async_db_chain: SqlHarness) -> Iterator[SqlHarness]:
        batched = pg_async_db_chain.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


class TestPostgreSQLAsyncChain(WorkerSuite):
    """The worker clauses with chained claims: each job still its own transaction, claimed and run once."""

    @pytest.fixture
    def harness(self, pg_async_db_chain: SqlHarness) -> SqlHarness:
        return pg_async_db_chain


class TestPostgreSQLAsyncChainClauses(ChainedClaimTests):
    """J1-J7 on the asyncio backend with chained claims."""

    __test__ = True

    @pytest.fixture
    def harness(self, pg_async_db_chain: SqlHarness) -> SqlHarness:
        return pg_async_db_chain
