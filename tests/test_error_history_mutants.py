"""The error history's clauses have teeth: a store writing apart from the job's transaction fails F2, one
whose purge leaves the rows fails F3."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from mutants import ERROR_HISTORY_MUTANTS, Mutant
from test_mutants import _survivors as survivors

from conformance import builtin
from conformance.error_history import ErrorHistoryTests
from conformance.harness import Harness, SqlHarness


class BriefErrorHistory(ErrorHistoryTests):
    __test__ = False


def _caught(mutant: Mutant, base: Harness, record_property: Callable[[str, object], None]) -> None:
    harness = base.with_backend(mutant.backend_class, name=f"mutant {mutant.name}")  # type: ignore[attr-defined]
    survived = survivors(mutant, harness, record_property, BriefErrorHistory)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


def _named(prefix: str) -> list[Mutant]:
    return [m for m in ERROR_HISTORY_MUTANTS if m.name.startswith(prefix)]


@pytest.mark.parametrize("mutant", _named("pg_"), ids=lambda m: m.name)
def test_the_error_history_clauses_catch_the_postgresql_mutant(
    mutant: Mutant, pg_db: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    _caught(mutant, pg_db, record_property)


@pytest.mark.parametrize("mutant", _named("mysql_"), ids=lambda m: m.name)
def test_the_error_history_clauses_catch_the_mysql_mutant(
    mutant: Mutant, mysql_db: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    _caught(mutant, mysql_db, record_property)


@pytest.mark.parametrize("mutant", _named("memory_"), ids=lambda m: m.name)
def test_the_error_history_clauses_catch_the_memory_mutant(
    mutant: Mutant, record_property: Callable[[str, object], None]
) -> None:
    _caught(mutant, builtin.memory(), record_property)
