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
from fix_db import table_suffix

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "tests" / "django_project"

pytestmark = pytest.mark.sql_only


def _django_python() -> str:
    python = os.environ.get("PROLETARIAN_DJANGO_PYTHON") or str(ROOT / ".venv-django" / "bin" / "python")
    if not os.access(python, os.X_OK):
        pytest.fail(
            f"no Python with Django 6 at {python}: ci/test.sh makes .venv-django (pyenv's 3.12 with "
            "'.[postgresql,mysql,django]'), or set PROLETARIAN_DJANGO_PYTHON",
            pytrace=False,
        )
    return python


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
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
    checks = [line for line in run.stdout.splitlines() if line.startswith("ok ")]
    assert len(checks) == 6, run.stdout
