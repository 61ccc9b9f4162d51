"""The recipe of docs/conformance.md, run as written against backends on drivers the project does not ship.

pg8000's backend is the one docs/backends.md prints, taken from that page; mysql-connector-python's and
psycopg2's live in their own directories beside this file, as a third party's package would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = ROOT / "docs"
PG_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
MYSQL_DSN: Final = "mysql://root@127.0.0.1:3306/test"
# What each recipe author ships: a Backend class and a zero-argument connect(), from the test DSNs.
MY_PACKAGES: Final = {
    "pg8000": f'''"""pg8000's backend, as docs/backends.md prints it."""
import os
from urllib.parse import urlsplit

import pg8000.dbapi
from my_pg8000_backend import Pg8000Backend as MyBackend


def connect():
    url = urlsplit(os.environ.get("PROLETARIAN_TEST_PG_DSN", "{PG_DSN}"))
    return pg8000.dbapi.connect(user=url.username, password=url.password, host=url.hostname,
                                port=url.port or 5432, database=url.path.lstrip("/"))
''',
    "mysql-connector": f'''"""mysql-connector-python's backend (tests/third_party/mysql_connector_backend)."""
import os
from urllib.parse import urlsplit

import mysql.connector
from mysql_connector_backend import MySQLConnectorBackend as MyBackend


def connect():
    url = urlsplit(os.environ.get("PROLETARIAN_TEST_MYSQL_DSN", "{MYSQL_DSN}"))
    return mysql.connector.connect(user=url.username, password=url.password or "", host=url.hostname,
                                   port=url.port or 3306, database=url.path.lstrip("/"))
''',
    "psycopg2": f'''"""psycopg2's backend, from tests/third_party/psycopg2_backend."""
import os

import psycopg2
from psycopg2_backend import Psycopg2Backend as MyBackend


def connect():
    return psycopg2.connect(os.environ.get("PROLETARIAN_TEST_PG_DSN", "{PG_DSN}"))
''',
}
# psycopg2 runs one clause of each family the recipe has to carry (its whole suite runs in-process in
# test_psycopg2_backend.py); the others run every clause.
SELECTED: Final = (
    "joins_the_callers_transaction or skipped_by_a_second_transaction or killed_inside_a_claim "
    "or callers_session_state or committed_while_a_worker or instants_whatever or character_class "
    "or worker_killed_mid_handler"
)


def fenced_python(document: Path, heading: str) -> str:
    """The first Python block under `heading` in `document`."""
    text = document.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, f"{document.name} has no Python block under {heading}"
    return match.group(1)


def write_recipe(tmp_path: Path, driver: str) -> Path:
    """The recipe, the author's package and its backend laid out as a project; returns the tests folder."""
    code = fenced_python(DOCS / "conformance.md", "## Recipe")
    first_line = code.splitlines()[0]
    assert first_line.startswith("# tests/"), "the recipe names the file it goes in on its first line"
    test_file = tmp_path / first_line.removeprefix("# ").strip()
    test_file.parent.mkdir(parents=True)
    test_file.write_text(code, encoding="utf-8")
    package = tmp_path / "src" / "my_package"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(MY_PACKAGES[driver], encoding="utf-8")
    backend = fenced_python(DOCS / "backends.md", "## A whole backend")
    name = backend.splitlines()[0].removeprefix("# ").split(":")[0]
    assert name == "my_pg8000_backend.py", "docs/backends.md's backend names its file on its first line"
    (tmp_path / "src" / name).write_text(backend, encoding="utf-8")
    return test_file.parent


def run_recipe(tmp_path: Path, driver: str, *options: str) -> str:
    """pytest on the recipe in a subprocess with this interpreter; its output, after checking it passed."""
    tests = write_recipe(tmp_path, driver)
    # The author's package and backends, and this checkout's conformance and core.
    path = [str(tmp_path / "src"), str(Path(__file__).resolve().parent), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")])}
    # Without xdist the recipe names its tables after this; apart from other runs on the same server.
    env["PYTEST_XDIST_WORKER"] = (
        f"{os.environ.get('PROLETARIAN_TEST_TABLE_PREFIX', '')}{driver.replace('-', '_')}"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options],
        cwd=tests.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"the recipe's run on {driver} failed:\n{output[-6000:]}"
    return output


def passed(output: str) -> int:
    found = re.search(r"(\d+) passed", output)
    assert found is not None, f"no test passed:\n{output[-3000:]}"
    return int(found.group(1))


def test_the_docs_recipe_proves_the_docs_pg8000_backend_under_xdist(tmp_path: Path) -> None:
    pytest.importorskip("pg8000", reason="the test extra installs pg8000")
    output = run_recipe(tmp_path, "pg8000", "-n", "2")
    # Every clause but B1 (PostgreSQL's TEXT has no limit worth testing) and N1 (no Notifications).
    assert passed(output) >= 40, output[-3000:]


def test_the_docs_recipe_proves_a_mysql_connector_backend_under_xdist(tmp_path: Path) -> None:
    pytest.importorskip("mysql.connector", reason="the test extra installs mysql-connector-python")
    output = run_recipe(tmp_path, "mysql-connector", "-n", "2")
    # Every clause but S7 (InnoDB locks the record ending the scan) and N1 (no Notifications).
    assert passed(output) >= 40, output[-3000:]


def test_the_docs_recipe_runs_on_the_psycopg2_backend(tmp_path: Path) -> None:
    pytest.importorskip("psycopg2", reason="the test extra installs psycopg2-binary")
    output = run_recipe(tmp_path, "psycopg2", "-p", "no:xdist", "-k", SELECTED)
    assert passed(output) >= 8, output[-3000:]
