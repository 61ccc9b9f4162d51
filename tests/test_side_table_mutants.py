"""The side tables' clauses have teeth: each deliberately broken store fails the clauses named to catch it."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import pytest
from mutants import SIDE_TABLE_MUTANTS, Mutant
from test_mutants import _survivors as survivors

from conformance import builtin
from conformance.harness import Harness, SqlHarness
from conformance.side_tables import SideTableTests


class BriefSideTables(SideTableTests):
    __test__ = False
    settle_s: ClassVar[float] = 0.3


def _caught(mutant: Mutant, base: Harness, record_property: Callable[[str, object], None]) -> None:
    """`mutant` fails every side-table clause named for it on `base`'s database and tables."""
    harness = base.with_backend(mutant.backend_class, name=f"mutant {mutant.name}")  # type: ignore[attr-defined]
    survived = survivors(mutant, harness, record_property, BriefSideTables)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


@pytest.mark.parametrize(
    "mutant", [m for m in SIDE_TABLE_MUTANTS if m.name.startswith("pg_")], ids=lambda m: m.name
)
def test_the_side_table_clauses_catch_the_postgresql_mutant(
    mutant: Mutant, pg_db: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    _caught(mutant, pg_db, record_property)


@pytest.mark.parametrize(
    "mutant", [m for m in SIDE_TABLE_MUTANTS if m.name.startswith("mysql_")], ids=lambda m: m.name
)
def test_the_side_table_clauses_catch_the_mysql_mutant(
    mutant: Mutant, mysql_db: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    _caught(mutant, mysql_db, record_property)


@pytest.mark.parametrize(
    "mutant", [m for m in SIDE_TABLE_MUTANTS if m.name.startswith("memory_")], ids=lambda m: m.name
)
def test_the_side_table_clauses_catch_the_memory_mutant(
    mutant: Mutant, record_property: Callable[[str, object], None]
) -> None:
    _caught(mutant, builtin.memory(), record_property)
