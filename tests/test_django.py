"""Django 6 tasks on Proletarian: tests/django_project's checks, run in a Python >= 3.12 with Django 6.

Django 6 needs Python 3.12 and the project's own tests run on 3.11, so the Django project runs in the
interpreter of `.venv-django` (ci/test.sh makes it with pyenv's 3.12), or PROLETARIAN_DJANGO_PYTHON. A
missing interpreter is a failure, never a skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import test_docs_examples as doc_tests
from fix_db import selected_backends, table_suffix
from test_docs_examples import Servers, _fresh_default_tables, blocks_of, run_block

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "tests" / "django_project"

pytestmark = pytest.mark.sql_only

# The doc examples' databases and one-file-at-a-time lock, as fixtures of this module too.
servers = doc_tests.servers
one_file_at_a_time = doc_tests.one_file_at_a_time


def _django_python() -> str:
    python = os.environ.get("PROLETARIAN_DJANGO_PYTHON") or str(ROOT / ".venv-django" / "bin" / "python")
    if not os.access(python, os.X_OK):
        pytest.fail(
            f"no Python with Django 6 at {python}: ci/test.sh makes .venv-django (pyenv's 3.12 with "
            "'.[postgresql,mysql,mysqlclient,django]'), or set PROLETARIAN_DJANGO_PYTHON",
            pytrace=False,
        )
    return python


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The dialects --backends chose (tox runs one an env), as the `db` fixture's parametrization does.
    if "dialect" in metafunc.fixturenames:
        chosen = [d for d in ("postgresql", "mysql") if d in selected_backends(metafunc.config)]
        # MySQL on both drivers Django's MySQL backend runs on: PyMySQL as MySQLdb, and mysqlclient.
        metafunc.parametrize("dialect", [*chosen, *(["mysqlclient"] if "mysql" in chosen else [])])


def test_the_django_project_enqueues_in_atomic_and_its_worker_runs_the_tasks(
    dialect: str, request: pytest.FixtureRequest
) -> None:
    dsn_env = "PROLETARIAN_TEST_PG_DSN" if dialect == "postgresql" else "PROLETARIAN_TEST_MYSQL_DSN"
    dsn: str = request.getfixturevalue("pg_dsn" if dialect == "postgresql" else "mysql_dsn")
    env = {
        **os.environ,
        dsn_env: dsn,
        "PROLETARIAN_DJANGO_DB": dialect,
        "PROLETARIAN_DJANGO_SUFFIX": table_suffix(),
        "PYTHONPATH": str(ROOT),
    }
    run = subprocess.run(
        [_django_python(), str(PROJECT / "scenarios.py")],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # Django's connection is the driver's that the settings named (mysqlclient: Django's own MySQL driver).
    expected = {"postgresql": "psycopg", "mysql": "pymysql", "mysqlclient": "MySQLdb"}[dialect]
    assert f"driver {expected}" in run.stdout.splitlines(), run.stdout
    checks = [line for line in run.stdout.splitlines() if line.startswith("ok ")]
    assert len(checks) == 7, run.stdout


def test_the_docs_django_example_runs_in_the_django_python(
    servers: Servers, one_file_at_a_time: None
) -> None:
    # docs/django.md marks its project example doc-test: skip, as the doc tests' Python (3.11) has no
    # Django; it runs here, as written, on the examples' database, with .venv-django's python first on PATH.
    examples = [block for block in blocks_of(ROOT / "docs" / "django.md") if block.skip]
    assert len(examples) == 1, [block.where for block in examples]
    env = dict(servers.env)
    env["PATH"] = os.pathsep.join([str(Path(_django_python()).parent), env["PATH"]])
    _fresh_default_tables(servers)
    assert run_block(examples[0], env) is None
