"""The recipe of docs/conformance.md, run as written against backends on drivers the project does not ship.

pg8000's backend is the one docs/backends.md prints, taken from that page; mysql-connector-python's and
psycopg2's live in their own directories beside this file, as a third party's package would. The layout
and the run are benchmarks.conformance_speed's, which times the same recipe.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

from benchmarks.conformance_speed import MY_PACKAGES, PG_DSN, ROOT, RecipeRun, run_recipe

# psycopg2 runs one clause of each family the recipe has to carry (its whole suite runs in-process in
# test_psycopg2_backend.py); the others run every clause, under xdist as the docs say they may.
SELECTED: Final = (
    "joins_the_callers_transaction or skipped_by_a_second_transaction or killed_inside_a_claim "
    "or callers_session_state or committed_while_a_worker or instants_whatever or character_class "
    "or worker_killed_mid_handler"
)


def passed(run: RecipeRun, driver: str) -> int:
    assert run.returncode == 0, f"the recipe's run on {driver} failed:\n{run.output[-6000:]}"
    found = re.search(r"(\d+) passed", run.output)
    assert found is not None, f"no test passed:\n{run.output[-3000:]}"
    return int(found.group(1))


def test_the_docs_recipe_proves_the_docs_pg8000_backend_under_xdist(tmp_path: Path) -> None:
    pytest.importorskip("pg8000", reason="the test extra installs pg8000")
    run = run_recipe(tmp_path, MY_PACKAGES["pg8000"], "-n", "2", table_tag="pg8000")
    # Every clause but B1 (PostgreSQL's TEXT has no limit worth testing) and N1 (no Notifications).
    assert passed(run, "pg8000") >= 40, run.output[-3000:]


def test_the_docs_recipe_proves_a_mysql_connector_backend_under_xdist(tmp_path: Path) -> None:
    pytest.importorskip("mysql.connector", reason="the test extra installs mysql-connector-python")
    run = run_recipe(tmp_path, MY_PACKAGES["mysql-connector"], "-n", "2", table_tag="mysql_connector")
    # Every clause but S7 (InnoDB locks the record ending the scan) and N1 (no Notifications).
    assert passed(run, "mysql-connector") >= 40, run.output[-3000:]


def test_the_docs_recipe_runs_on_the_psycopg2_backend(tmp_path: Path) -> None:
    pytest.importorskip("psycopg2", reason="the test extra installs psycopg2-binary")
    run = run_recipe(
        tmp_path, MY_PACKAGES["psycopg2"], "-p", "no:xdist", "-k", SELECTED, table_tag="psycopg2"
    )
    assert passed(run, "psycopg2") >= 8, run.output[-3000:]


_ASYNC_PACKAGE: Final = '''"""psycopg's asyncio backend as a third party's AsyncBackend."""
import os

import psycopg

from proletarian_ref.backends.postgres_async import AsyncPostgresBackend as MyAsyncBackend


async def aconnect():
    return await psycopg.AsyncConnection.connect(os.environ.get("PROLETARIAN_TEST_PG_DSN", "{dsn}"))
'''


def test_the_docs_asyncio_recipe_runs_on_an_async_backend(tmp_path: Path) -> None:
    run = run_recipe(
        tmp_path,
        _ASYNC_PACKAGE.format(dsn=PG_DSN),
        "-p",
        "no:xdist",
        "-k",
        SELECTED,
        table_tag="aio",
        heading="## An asyncio backend",
    )
    assert passed(run, "psycopg (asyncio)") >= 8, run.output[-3000:]


def test_the_docs_quote_the_named_speed_run() -> None:
    """docs/conformance.md pastes benchmarks/results/conformance-speed.md, the run its figures come from."""
    results = (ROOT / "benchmarks" / "results" / "conformance-speed.md").read_text(encoding="utf-8")
    docs = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    assert results.strip() in docs, "docs/conformance.md does not paste the named conformance-speed run"
