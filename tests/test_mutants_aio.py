"""The conformance suite has teeth on asyncio backends too: each broken AsyncPostgresBackend and
AsyncMySQLBackend fails the clauses named to catch it, run through conformance.aio_bridge as for the
correct one."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fix_db import _load
from mutants import Mutant
from mutants_aio import (
    ASYNCPG_MUTANTS,
    MYSQL_ASYNC_CHAIN_MUTANTS,
    MYSQL_ASYNC_MUTANTS,
    POSTGRESQL_ASYNC_MUTANTS,
    POSTGRESQL_ASYNC_SIDE_TABLE_MUTANTS,
)
from test_mutants import _survivors
from test_side_table_mutants import BriefSideTables

from conformance import SqlHarness
from conformance.aio_bridge import blocking_backend_class


def _assert_caught_on(
    base: SqlHarness, mutant: Mutant, record_property: Callable[[str, object], None]
) -> None:
    """The mutant's clauses fail on `base`'s tables (emptied first, closed after) under its backend."""
    base.clear()
    harness = base.with_backend(blocking_backend_class(mutant.backend_class), name=f"mutant {mutant.name}")
    try:
        survived = _survivors(mutant, harness, record_property)
    finally:
        base.close()
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


@pytest.fixture(scope="module")
def pg_async_mutant_base(pg_harness: SqlHarness, pg_dsn: str) -> SqlHarness:
    # The tables pg_harness installed, under the asyncio backend.
    return _load("conformance.aio_bridge:postgresql_async", pg_dsn)


@pytest.fixture
def pg_async_db_for_mutants(pg_async_mutant_base: SqlHarness) -> Iterator[SqlHarness]:
    pg_async_mutant_base.clear()
    yield pg_async_mutant_base
    pg_async_mutant_base.close()


@pytest.mark.parametrize("mutant", POSTGRESQL_ASYNC_MUTANTS, ids=lambda m: m.name)
def test_the_suite_catches_the_async_postgresql_mutant(
    mutant: Mutant, pg_async_db_for_mutants: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    harness = pg_async_db_for_mutants.with_backend(
        blocking_backend_class(mutant.backend_class), name=f"mutant {mutant.name}"
    )
    survived = _survivors(mutant, harness, record_property)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


@pytest.fixture(scope="module")
def asyncpg_mutant_base(pg_harness: SqlHarness, pg_dsn: str) -> SqlHarness:
    # The tables pg_harness installed, under the asyncpg backend.
    return _load("conformance.aio_bridge:postgresql_asyncpg", pg_dsn)


@pytest.mark.parametrize("mutant", ASYNCPG_MUTANTS, ids=lambda m: m.name)
def test_the_suite_catches_the_asyncpg_mutant(
    mutant: Mutant, asyncpg_mutant_base: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    _assert_caught_on(asyncpg_mutant_base, mutant, record_property)


@pytest.fixture(scope="module")
def mysql_async_mutant_base(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    # The tables mysql_harness installed, under the asyncio backend.
    return _load("conformance.aio_bridge:mysql_async", mysql_time_zones)


@pytest.fixture
def mysql_async_db_for_mutants(mysql_async_mutant_base: SqlHarness) -> Iterator[SqlHarness]:
    mysql_async_mutant_base.clear()
    yield mysql_async_mutant_base
    mysql_async_mutant_base.close()


@pytest.mark.parametrize("mutant", MYSQL_ASYNC_MUTANTS, ids=lambda m: m.name)
def test_the_suite_catches_the_async_mysql_mutant(
    mutant: Mutant, mysql_async_db_for_mutants: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    harness = mysql_async_db_for_mutants.with_backend(
        blocking_backend_class(mutant.backend_class), name=f"mutant {mutant.name}"
    )
    survived = _survivors(mutant, harness, record_property)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


@pytest.fixture(scope="module")
def mysql_async_chain_mutant_base(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    # The tables mysql_harness installed, under the asyncio backend's chained plan.
    return _load("conformance.aio_bridge:mysql_async_chain", mysql_time_zones)


@pytest.mark.parametrize("mutant", MYSQL_ASYNC_CHAIN_MUTANTS, ids=lambda m: m.name)
def test_the_suite_catches_the_async_mysql_chain_mutant(
    mutant: Mutant, mysql_async_chain_mutant_base: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    _assert_caught_on(mysql_async_chain_mutant_base, mutant, record_property)


@pytest.mark.parametrize("mutant", POSTGRESQL_ASYNC_SIDE_TABLE_MUTANTS, ids=lambda m: m.name)
def test_the_side_table_clauses_catch_the_async_postgresql_mutant(
    mutant: Mutant, pg_async_db_for_mutants: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    """The U clauses, whose keyed enqueues go through aio.enqueue on the bridge, fail each broken store."""
    harness = pg_async_db_for_mutants.with_backend(
        blocking_backend_class(mutant.backend_class), name=f"mutant {mutant.name}"
    )
    survived = _survivors(mutant, harness, record_property, BriefSideTables)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"
