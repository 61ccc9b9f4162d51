"""The conformance suite has teeth: every deliberately broken backend fails the tests named to catch it."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Final

import pytest
from kill_matrix import KILL_MATRIX_PROPERTY
from mutants import (
    ERROR_HISTORY_MUTANTS,
    MEMORY_MUTANTS,
    MYSQL_CHAIN_MUTANTS,
    MYSQL_MUTANTS,
    POSTGRESQL_MUTANTS,
    SIDE_TABLE_MUTANTS,
    SYNCHRONOUS_COMMIT_MUTANTS,
    Mutant,
    in_mode,
)

from conformance import MemoryHarness, SqlHarness, load_harness
from conformance.base import SuiteBase
from conformance.contract_chain import ChainedClaimTests
from conformance.harness import Harness
from conformance.runner import run_suite_test
from conformance.suite import BackendSuite, clauses
from proletarian_ref.backends.postgres import PostgresBackend

# Enough generated examples for every property test named below to meet its mutant; measured, with
# room to spare (most fail on their first or second example).
EXAMPLES: Final = 8
# The clauses whose failures report broken invariants rather than name one verb (Mutant.fault).
PROPERTY_CLAUSES: Final = frozenset({"P1", "P2", "M1"})
DOCS: Final = Path(__file__).resolve().parent.parent / "docs" / "conformance.md"


class BriefSuite(BackendSuite):
    """The suite with a shorter wait before a blocked step counts as blocked: mutants that block are
    caught in a second, and a correct backend answers a step in milliseconds."""

    __test__ = False
    step_timeout: ClassVar[float] = 1.5


def _survivors(
    mutant: Mutant,
    harness: Harness,
    record_property: Callable[[str, object], None],
    suite: type[SuiteBase] = BriefSuite,
) -> list[str]:
    """The clauses of `suite` named to kill `mutant` that did not; each outcome goes to the kill matrix."""
    harness = in_mode(harness, mutant)
    tests = clauses(suite)
    survived = []
    outcomes: dict[str, str] = {}
    for clause in mutant.killed_by:
        name = tests[clause][0]
        result = run_suite_test(suite, name, harness, max_examples=EXAMPLES)
        outcomes[clause] = "killed" if result.outcome == "failed" else result.outcome
        if result.outcome != "failed":
            survived.append(f"{clause} {name}: {result.outcome} {result.message}".strip())
        elif clause not in PROPERTY_CLAUSES:
            unsaid = [word for word in mutant.fault if word.lower() not in result.text.lower()]
            if unsaid:
                # Killed, but by a message that does not name the fault: its reader would look elsewhere.
                survived.append(f"{clause} {name}: its failure does not say {unsaid}: {result.text[:600]}")
    record_property(KILL_MATRIX_PROPERTY, json.dumps({"mutant": mutant.name, "outcomes": outcomes}))
    return survived


@pytest.mark.parametrize("mutant", POSTGRESQL_MUTANTS, ids=lambda m: m.name)
def test_the_suite_catches_the_postgresql_mutant(
    mutant: Mutant, pg_db: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    harness = pg_db.with_backend(mutant.backend_class, name=f"mutant {mutant.name}")
    survived = _survivors(mutant, harness, record_property)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


@pytest.mark.parametrize("mutant", MYSQL_MUTANTS, ids=lambda m: m.name)
def test_the_suite_catches_the_mysql_mutant(
    mutant: Mutant, mysql_db: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    harness = mysql_db.with_backend(mutant.backend_class, name=f"mutant {mutant.name}")
    survived = _survivors(mutant, harness, record_property)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


@pytest.mark.parametrize("mutant", MYSQL_CHAIN_MUTANTS, ids=lambda m: m.name)
def test_the_suite_catches_the_mysql_chain_mutant(
    mutant: Mutant, mysql_chain_db: SqlHarness, record_property: Callable[[str, object], None]
) -> None:
    harness = mysql_chain_db.with_backend(mutant.backend_class, name=f"mutant {mutant.name}")
    survived = _survivors(mutant, harness, record_property)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


@pytest.mark.parametrize("mutant", MEMORY_MUTANTS, ids=lambda m: m.name)
def test_the_suite_catches_the_in_memory_mutant(
    mutant: Mutant, record_property: Callable[[str, object], None]
) -> None:
    base = load_harness("conformance.builtin:memory")
    assert isinstance(base, MemoryHarness)
    harness = base.with_backend(mutant.backend_class, name=f"mutant {mutant.name}")
    survived = _survivors(mutant, harness, record_property)
    assert not survived, f"{mutant.name} ({mutant.what}) survived: {survived}"


def _catching_tests(mutants: tuple[Mutant, ...]) -> list[str]:
    tests = clauses()
    return sorted({tests[clause][0] for mutant in mutants for clause in mutant.killed_by})


@pytest.mark.parametrize("test", _catching_tests(POSTGRESQL_MUTANTS))
def test_each_catching_test_passes_on_the_real_postgresql_backend(test: str, pg_db: SqlHarness) -> None:
    """The control: run the same way, the unbroken backend passes, so the mutant is what fails a test.

    A chained-claim clause runs on the backend with chained claims, as the chain mutants are built on it.
    """
    harness = pg_db
    if hasattr(ChainedClaimTests, test):
        harness = pg_db.with_backend(functools.partial(PostgresBackend, chain=True), "postgresql-chain")
    result = run_suite_test(BriefSuite, test, harness, max_examples=EXAMPLES)
    assert result.outcome == "passed", f"{test}: {result.outcome} {result.message}"


@pytest.mark.parametrize("test", _catching_tests(MYSQL_MUTANTS))
def test_each_catching_test_passes_on_the_real_mysql_backend(test: str, mysql_db: SqlHarness) -> None:
    result = run_suite_test(BriefSuite, test, mysql_db, max_examples=EXAMPLES)
    assert result.outcome == "passed", f"{test}: {result.outcome} {result.message}"


@pytest.mark.parametrize("test", _catching_tests(MYSQL_CHAIN_MUTANTS))
def test_each_catching_test_passes_on_the_real_mysql_chain_backend(
    test: str, mysql_chain_db: SqlHarness
) -> None:
    result = run_suite_test(BriefSuite, test, mysql_chain_db, max_examples=EXAMPLES)
    assert result.outcome == "passed", f"{test}: {result.outcome} {result.message}"


@pytest.mark.parametrize("test", _catching_tests(MEMORY_MUTANTS))
def test_each_catching_test_passes_on_the_real_in_memory_backend(test: str) -> None:
    result = run_suite_test(
        BriefSuite, test, load_harness("conformance.builtin:memory"), max_examples=EXAMPLES
    )
    assert result.outcome == "passed", f"{test}: {result.outcome} {result.message}"


def test_every_suite_test_names_one_clause() -> None:
    names = sorted(n for n in dir(BackendSuite) if n.startswith("test_"))
    assert sorted(name for name, _ in clauses().values()) == names


def test_every_mutant_names_known_clauses_and_a_unique_name() -> None:
    known = clauses()
    everything = POSTGRESQL_MUTANTS + MYSQL_MUTANTS + MYSQL_CHAIN_MUTANTS + MEMORY_MUTANTS
    assert len({m.name for m in everything}) == len(everything)
    for mutant in everything:
        assert mutant.killed_by, f"{mutant.name} names no clause that catches it"
        assert set(mutant.killed_by) <= set(known), f"{mutant.name}: unknown clauses"


def test_the_docs_list_every_mutant_with_the_clauses_that_catch_it() -> None:
    rows = dict(
        re.findall(r"^\| `(\w+)` \|[^\n]*\| ([A-Z0-9, ]+) \|$", DOCS.read_text(encoding="utf-8"), re.M)
    )
    documented = {name: tuple(c.strip() for c in killers.split(",")) for name, killers in rows.items()}
    everything = (
        POSTGRESQL_MUTANTS
        + MYSQL_MUTANTS
        + MYSQL_CHAIN_MUTANTS
        + MEMORY_MUTANTS
        + SIDE_TABLE_MUTANTS
        + ERROR_HISTORY_MUTANTS
        + SYNCHRONOUS_COMMIT_MUTANTS
    )
    expected = {m.name: m.killed_by for m in everything}
    assert documented == expected, "docs/conformance.md's mutant table is out of date with tests/mutants.py"


def test_the_readme_counts_every_mutant() -> None:
    readme = (DOCS.parent.parent / "README.md").read_text(encoding="utf-8")
    counts = re.findall(r"(\d+) deliberately broken backends", readme)
    assert counts == [str(len(POSTGRESQL_MUTANTS + MYSQL_MUTANTS + MYSQL_CHAIN_MUTANTS + MEMORY_MUTANTS))]
    side = re.findall(r"catch (\d+) broken stores more", re.sub(r"\s+", " ", readme))
    assert side == [str(len(SIDE_TABLE_MUTANTS + ERROR_HISTORY_MUTANTS))]


def test_the_docs_list_every_clause() -> None:
    text = DOCS.read_text(encoding="utf-8")
    missing = [clause for clause in clauses() if f"| {clause} |" not in text]
    assert not missing, f"docs/conformance.md does not list clauses {missing}"


def test_the_docs_say_what_each_clause_kills_alone() -> None:
    """Each clause once in "What each clause kills alone": the mutants only it kills, or why it is kept."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("### What each clause kills alone") :].split("\n## ", 1)[0]
    entries = re.findall(r"^- \*\*([A-Z]\d+)\*\*: (.*)$", section, re.M)
    assert sorted(clause for clause, _ in entries) == sorted(clauses()), "clauses missing or listed twice"
    mutants = {m.name: m for m in POSTGRESQL_MUTANTS + MYSQL_MUTANTS + MYSQL_CHAIN_MUTANTS + MEMORY_MUTANTS}
    for clause, entry in entries:
        if "Kept:" in entry:
            continue
        named = re.findall(r"`(\w+)`", entry)
        assert named, f"{clause} names neither its mutants nor why it is kept"
        for name in named:
            assert name in mutants, f"{clause}: no mutant {name}"
            # CI runs the clause against the mutant, so the claim is checked on every run.
            assert clause in mutants[name].killed_by, (
                f"{clause} is said to kill {name}, which does not name it"
            )
