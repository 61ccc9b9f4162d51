"""The recipe of docs/conformance.md, run as written against a backend in a package of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

pytest.importorskip("psycopg2", reason="the recipe's backend is the psycopg2 one (tox -e thirdparty)")

ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = ROOT / "docs" / "conformance.md"
# The package the recipe imports from: a thin my_package over a backend that lives in its own directory.
MY_PACKAGE: Final = '''"""What the recipe's author ships: a Backend class and a zero-argument connect()."""
import os

import psycopg2
from psycopg2_backend import Psycopg2Backend as MyBackend

__all__ = ["MyBackend", "connect"]


def connect():
    return psycopg2.connect(os.environ.get("PROLETARIAN_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"))
'''
# One clause of each family the recipe has to carry: the caller's transaction, a lock, a killed session,
# the caller's session, isolation, zones, bytes, and a killed worker process (which rebuilds the harness
# in another process from the recipe's "module:factory").
SELECTED: Final = (
    "joins_the_callers_transaction or skipped_by_a_second_transaction or killed_inside_a_claim "
    "or callers_session_state or committed_while_a_worker or instants_whatever or character_class "
    "or worker_killed_mid_handler"
)


def recipe() -> str:
    """The first Python block under "## Recipe"."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Recipe") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "docs/conformance.md has no Python block under ## Recipe"
    return match.group(1)


def test_the_docs_recipe_runs_as_written_against_a_backend_in_another_package(tmp_path: Path) -> None:
    code = recipe()
    first_line = code.splitlines()[0]
    assert first_line.startswith("# tests/"), "the recipe names the file it goes in on its first line"
    test_file = tmp_path / first_line.removeprefix("# ").strip()
    test_file.parent.mkdir(parents=True)
    test_file.write_text(code, encoding="utf-8")
    package = tmp_path / "src" / "my_package"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(MY_PACKAGE, encoding="utf-8")
    # The backend's own directory, the author's package, and this checkout's conformance and core.
    path = [str(Path(__file__).resolve().parent), str(tmp_path / "src"), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-k", SELECTED],
        cwd=test_file.parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"the recipe's run failed:\n{output[-6000:]}"
    passed = re.search(r"(\d+) passed", output)
    assert passed is not None and int(passed.group(1)) >= 8, f"too few clauses ran:\n{output[-3000:]}"
