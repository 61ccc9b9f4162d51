"""Pytest plugin: the mutant x clause kill matrix, gathered from the mutant tests, printed after the run."""

from __future__ import annotations

import json
import sys
from typing import Any, Final

import pytest

# The user property a mutant test records its outcomes under; xdist carries it to the controller.
KILL_MATRIX_PROPERTY: Final = "conformance_kill_matrix"
# Clause families in the order docs/conformance.md lists them.
_FAMILIES: Final = "ESADRTKHCIZBGQLJNPMUY"

_rows: dict[str, dict[str, str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == KILL_MATRIX_PROPERTY:
            row: dict[str, Any] = json.loads(str(value))
            _rows[str(row["mutant"])] = {str(k): str(v) for k, v in row["outcomes"].items()}


def _clause_order(clause: str) -> tuple[int, int]:
    family = _FAMILIES.find(clause[0])
    return (family if family >= 0 else len(_FAMILIES), int(clause[1:]))


def kill_matrix_lines(rows: dict[str, dict[str, str]], *, full: bool = False) -> list[str]:
    """One line per mutant, one column per clause: X killed it, ! named but did not, . not named.

    In the `full` matrix every clause runs against every mutant, and one that does not kill shows ".".
    """
    columns = sorted({clause for outcomes in rows.values() for clause in outcomes}, key=_clause_order)
    width = max(len(name) for name in rows)
    lines = [" " * width + " " + " ".join(f"{c:>3}" for c in columns)]
    for mutant in sorted(rows):
        outcomes = rows[mutant]
        cells = []
        for clause in columns:
            outcome = outcomes.get(clause)
            survived = "  ." if full else "  !"
            cells.append("  ." if outcome is None else "  X" if outcome == "killed" else survived)
        lines.append(f"{mutant:<{width}} " + " ".join(cells))
    if not full:
        killed = sum(all(v == "killed" for v in o.values()) for o in rows.values())
        lines.append(
            f"{killed} of {len(rows)} mutants killed by every clause named for them (X killed, ! survived)"
        )
    return lines


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _rows:
        return
    terminalreporter.section("conformance kill matrix (mutant x clause)")
    for line in kill_matrix_lines(_rows):
        terminalreporter.write_line(line)


# -- the full matrix: every mutant against every clause, run by hand to find what only one clause kills ---

# The property clauses take minutes per mutant; the full matrix leaves them out.
_SLOW_CLAUSES: Final = frozenset({"P1", "P2", "M1", "T5"})


def full_matrix(backends: list[str]) -> dict[str, dict[str, str]]:
    """Run every mutant of `backends` against every clause but the slow ones (the test environment's DSNs)."""
    from mutants import MEMORY_MUTANTS, MYSQL_CHAIN_MUTANTS, MYSQL_MUTANTS, POSTGRESQL_MUTANTS, in_mode
    from test_mutants import EXAMPLES, BriefSuite

    from conformance import MemoryHarness, SqlHarness, builtin
    from conformance.runner import run_suite_test
    from conformance.suite import clauses

    tables = {
        "job_table": "proletarian.job_kill_matrix",
        "archived_job_table": "proletarian.archived_job_kill_matrix",
    }
    bases: dict[str, tuple[SqlHarness | MemoryHarness, Any]] = {
        "memory": (builtin.memory(), MEMORY_MUTANTS),
        "postgresql": (builtin.postgresql(**tables), POSTGRESQL_MUTANTS),
        "mysql": (builtin.mysql(**tables), MYSQL_MUTANTS),
        "mysql-chain": (builtin.mysql_chain(**tables), MYSQL_CHAIN_MUTANTS),
    }
    rows: dict[str, dict[str, str]] = {}
    for base, mutants in (bases[name] for name in backends):
        base.install()
        for mutant in mutants:
            harness = in_mode(base.with_backend(mutant.backend_class, name=mutant.name), mutant)
            rows[mutant.name] = {
                clause: "killed"
                if run_suite_test(BriefSuite, name, harness, max_examples=EXAMPLES).outcome == "failed"
                else "survived"
                for clause, (name, _) in clauses().items()
                if clause not in _SLOW_CLAUSES
            }
            print(mutant.name, sorted(c for c, o in rows[mutant.name].items() if o == "killed"), flush=True)
    return rows


def only_killers(rows: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Clause -> the mutants no other clause of the matrix kills."""
    found: dict[str, list[str]] = {}
    for mutant, outcomes in rows.items():
        killers = [clause for clause, outcome in outcomes.items() if outcome == "killed"]
        if len(killers) == 1:
            found.setdefault(killers[0], []).append(mutant)
    return found


if __name__ == "__main__":
    # The full matrix and, per clause, the mutants only it kills.
    # python tests/kill_matrix.py [memory] [postgresql] [mysql]: all three when none is named.
    matrix = full_matrix(sys.argv[1:] or ["memory", "postgresql", "mysql", "mysql-chain"])
    for line in kill_matrix_lines(matrix, full=True):
        print(line)
    for clause, mutants in sorted(only_killers(matrix).items(), key=lambda item: _clause_order(item[0])):
        print(f"{clause}: {', '.join(mutants)}")
