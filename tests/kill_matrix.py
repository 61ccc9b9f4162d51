"""Pytest plugin: the mutant x clause kill matrix, gathered from the mutant tests, printed after the run."""

from __future__ import annotations

import json
from typing import Any, Final

import pytest

# The user property a mutant test records its outcomes under; xdist carries it to the controller.
KILL_MATRIX_PROPERTY: Final = "conformance_kill_matrix"
# Clause families in the order docs/conformance.md lists them.
_FAMILIES: Final = "ESADRTKCIZBPM"

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


def kill_matrix_lines(rows: dict[str, dict[str, str]]) -> list[str]:
    """One line per mutant, one column per clause: X killed it, ! named but did not, . not named."""
    columns = sorted({clause for outcomes in rows.values() for clause in outcomes}, key=_clause_order)
    width = max(len(name) for name in rows)
    lines = [" " * width + " " + " ".join(f"{c:>3}" for c in columns)]
    for mutant in sorted(rows):
        outcomes = rows[mutant]
        cells = []
        for clause in columns:
            outcome = outcomes.get(clause)
            cells.append("  ." if outcome is None else "  X" if outcome == "killed" else "  !")
        lines.append(f"{mutant:<{width}} " + " ".join(cells))
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
