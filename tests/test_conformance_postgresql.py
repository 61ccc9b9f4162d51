"""The PostgreSQL backend (psycopg 3) through the conformance suite, exactly as a third party runs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fix_db import _load

from conformance import BackendSuite, SqlHarness, WorkerSuite
from conformance.contract_chain import ChainedClaimTests


class TestPostgreSQL(BackendSuite):
    @pytest.fixture
    def harness(self, pg_db: SqlHarness) -> SqlHarness:
        return pg_db


class TestPostgreSQLBatch(WorkerSuite):
    """The clauses that run a worker again, every queue worker and process_next_job in batch mode."""

    @pytest.fixture
    def harness(self, pg_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = pg_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


class TestPostgreSQLWithNotify(BackendSuite):
    """The same suite with every enqueue announcing its job (notify=True), as wake-up users enqueue."""

    @pytest.fixture
    def harness(self, pg_db: SqlHarness) -> Iterator[SqlHarness]:
        pg_db.enqueue_options = {"notify": True}
        try:
            yield pg_db
        finally:
            pg_db.enqueue_options = {}


class TestPostgreSQLPipeline(BackendSuite):
    """The same suite with the backend on its pipelined statement plan (PostgresBackend(pipeline=True))."""

    @pytest.fixture
    def harness(self, pg_pipeline_db: SqlHarness) -> SqlHarness:
        return pg_pipeline_db


class TestPostgreSQLCompact(BackendSuite):
    """The same suite with the backend on its compact statement plan (PostgresBackend(compact=True))."""

    @pytest.fixture
    def harness(self, pg_compact_db: SqlHarness) -> SqlHarness:
        return pg_compact_db


class TestPostgreSQLPipelineBatch(WorkerSuite):
    """The worker clauses in batch mode with the backend on its pipelined statement plan."""

    @pytest.fixture
    def harness(self, pg_pipeline_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = pg_pipeline_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


class TestPostgreSQLCompactBatch(WorkerSuite):
    """The worker clauses in batch mode on the compact plan: a batch's archive and delete in one statement."""

    @pytest.fixture
    def harness(self, pg_compact_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = pg_compact_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


@pytest.fixture(params=["postgresql_chain", "postgresql_pipeline_chain"])
def pg_chain_db(request: pytest.FixtureRequest, pg_db: SqlHarness, pg_dsn: str) -> Iterator[SqlHarness]:
    """The same tables under a backend with chained claims (compact plan; and in pipeline mode)."""
    chained = _load(f"conformance.builtin:{request.param}", pg_dsn)
    try:
        yield chained
    finally:
        chained.close()


class TestPostgreSQLChain(WorkerSuite):
    """The worker clauses with chained claims: each job still its own transaction, claimed and run once."""

    @pytest.fixture
    def harness(self, pg_chain_db: SqlHarness) -> SqlHarness:
        return pg_chain_db


class TestPostgreSQLChainClauses(ChainedClaimTests):
    """J1-J7, what a backend with chained claims owes the worker (skipped on every other class here)."""

    __test__ = True

    @pytest.fixture
    def harness(self, pg_chain_db: SqlHarness) -> SqlHarness:
        return pg_chain_db
