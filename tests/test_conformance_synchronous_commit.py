"""The asynchronous commit clauses (W) on every PostgreSQL backend with synchronous_commit_off=True, and
their mutants: a session SET instead of SET LOCAL, and the SET skipped."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Final

import pytest
from fix_db import _load
from mutants import SYNCHRONOUS_COMMIT_MUTANTS, Mutant
from mutants_aio import ASYNCPG_SYNCHRONOUS_COMMIT_MUTANTS, POSTGRESQL_ASYNC_SYNCHRONOUS_COMMIT_MUTANTS
from test_mutants import _survivors as survivors

from conformance.aio_bridge import blocking_backend_class
from conformance.harness import SqlHarness
from conformance.synchronous_commit import SynchronousCommitTests
from proletarian_ref import sql
from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend
from proletarian_ref.backends.mysql import MySQLBackend
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.backends.postgres_async import AsyncPostgresBackend
from proletarian_ref.errors import ConfigurationError


class TestPostgreSQLSynchronousCommitOff(SynchronousCommitTests):
    @pytest.fixture
    def harness(self, pg_db: SqlHarness) -> SqlHarness:
        return pg_db.with_backend(
            functools.partial(PostgresBackend, synchronous_commit_off=True), "postgresql-sync-commit-off"
        )


class TestPostgreSQLPipelineSynchronousCommitOff(SynchronousCommitTests):
    """The same with the pipelined statement plan: the SET LOCAL is queued with the claim."""

    @pytest.fixture
    def harness(self, pg_db: SqlHarness) -> SqlHarness:
        backend_class = functools.partial(PostgresBackend, pipeline=True, synchronous_commit_off=True)
        return pg_db.with_backend(backend_class, "postgresql-pipeline-sync-commit-off")


def _bridged(pg_dsn: str, factory: str, backend: Callable[..., Any], name: str) -> SqlHarness:
    """The asyncio bridge `factory`'s harness, its backend `backend` with synchronous_commit_off=True."""
    backend_class = functools.partial(backend, synchronous_commit_off=True)
    return _load(factory, pg_dsn).with_backend(blocking_backend_class(backend_class), name)


@pytest.fixture
def pg_async_sync_commit_db(pg_harness: SqlHarness, pg_dsn: str) -> Iterator[SqlHarness]:
    harness = _bridged(
        pg_dsn,
        "conformance.aio_bridge:postgresql_async",
        AsyncPostgresBackend,
        "postgresql-async-sync-commit-off",
    )
    yield harness
    harness.close()


@pytest.fixture
def pg_asyncpg_sync_commit_db(pg_harness: SqlHarness, pg_dsn: str) -> Iterator[SqlHarness]:
    harness = _bridged(
        pg_dsn,
        "conformance.aio_bridge:postgresql_asyncpg",
        AsyncpgBackend,
        "postgresql-asyncpg-sync-commit-off",
    )
    yield harness
    harness.close()


class TestPostgreSQLAsyncSynchronousCommitOff(SynchronousCommitTests):
    @pytest.fixture
    def harness(self, pg_async_sync_commit_db: SqlHarness) -> SqlHarness:
        return pg_async_sync_commit_db


@pytest.fixture
def pg_async_pipeline_sync_commit_db(pg_harness: SqlHarness, pg_dsn: str) -> Iterator[SqlHarness]:
    harness = _bridged(
        pg_dsn,
        "conformance.aio_bridge:postgresql_async",
        functools.partial(AsyncPostgresBackend, pipeline=True, compact=True, chain=True),
        "postgresql-async-pipeline-chain-sync-commit-off",
    )
    yield harness
    harness.close()


class TestPostgreSQLAsyncPipelineChainSynchronousCommitOff(SynchronousCommitTests):
    """The same on the asyncio backend's chained pipeline: the SET LOCAL goes with each BEGIN, queued."""

    @pytest.fixture
    def harness(self, pg_async_pipeline_sync_commit_db: SqlHarness) -> SqlHarness:
        return pg_async_pipeline_sync_commit_db


class TestAsyncpgSynchronousCommitOff(SynchronousCommitTests):
    @pytest.fixture
    def harness(self, pg_asyncpg_sync_commit_db: SqlHarness) -> SqlHarness:
        return pg_asyncpg_sync_commit_db


class BriefSynchronousCommit(SynchronousCommitTests):
    __test__ = False
    step_timeout: ClassVar[float] = 1.5


@pytest.mark.parametrize("mutant", SYNCHRONOUS_COMMIT_MUTANTS, ids=lambda m: m.name)
def test_the_asynchronous_commit_clauses_catch_the_mutant(
    mutant: Mutant, pg_db: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    harness = pg_db.with_backend(mutant.backend_class, name=f"mutant {mutant.name}")
    survived = survivors(mutant, harness, record_property, BriefSynchronousCommit)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


# Each async driver's mutants, with the bridge harness factory that drives its backend.
_ASYNC_MUTANTS: Final = [
    *(("conformance.aio_bridge:postgresql_async", m) for m in POSTGRESQL_ASYNC_SYNCHRONOUS_COMMIT_MUTANTS),
    *(("conformance.aio_bridge:postgresql_asyncpg", m) for m in ASYNCPG_SYNCHRONOUS_COMMIT_MUTANTS),
]


@pytest.mark.parametrize(("factory", "mutant"), _ASYNC_MUTANTS, ids=lambda v: getattr(v, "name", None))
def test_the_asynchronous_commit_clauses_catch_the_async_driver_mutant(
    factory: str,
    mutant: Mutant,
    pg_harness: SqlHarness,
    pg_dsn: str,
    record_property: Callable[[str, object], None],
) -> None:
    base = _load(factory, pg_dsn)
    harness = base.with_backend(blocking_backend_class(mutant.backend_class), name=f"mutant {mutant.name}")
    try:
        survived = survivors(mutant, harness, record_property, BriefSynchronousCommit)
    finally:
        harness.close()
        base.close()
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


def test_the_option_off_sends_nothing_and_on_sends_the_dialects_set_local() -> None:
    assert PostgresBackend(None)._job_transaction_setting is None
    on = PostgresBackend(None, synchronous_commit_off=True)
    assert on._job_transaction_setting == sql.queries("postgresql")["synchronous_commit_off"]
    assert on._job_transaction_setting.strip() == "SET LOCAL synchronous_commit = off"
    assert AsyncPostgresBackend(None, synchronous_commit_off=True)._job_transaction_setting == (
        on._job_transaction_setting
    )


def test_a_non_boolean_option_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="synchronous_commit_off must be True or False, got 'yes'"):
        PostgresBackend(None, synchronous_commit_off="yes")  # type: ignore[arg-type]


def test_mysql_does_not_offer_the_option() -> None:
    """MySQL has no per-transaction asynchronous commit (innodb_flush_log_at_trx_commit is global)."""
    with pytest.raises(TypeError, match="synchronous_commit_off"):
        MySQLBackend(None, synchronous_commit_off=True)  # type: ignore[call-arg]
