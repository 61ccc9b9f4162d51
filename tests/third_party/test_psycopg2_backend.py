"""A backend the project does not ship, on psycopg2, proven by the conformance suite as its author would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Final

import pytest

from conformance import BackendSuite, SqlHarness, installed, load_harness
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE

psycopg2 = pytest.importorskip("psycopg2", reason="the psycopg2 backend needs psycopg2 (tox -e thirdparty)")

from psycopg2_backend import Psycopg2Backend  # noqa: E402 - only once psycopg2 is known to be there

DSN_ENV: Final = "PROLETARIAN_TEST_PG_DSN"
DEFAULT_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"


def psycopg2_harness(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """The harness factory: what the suite's worker processes call to build the same harness."""
    target = dsn or os.environ.get(DSN_ENV) or DEFAULT_DSN

    def connect() -> Any:
        return psycopg2.connect(target)

    return SqlHarness(
        "psycopg2",
        dialect="postgresql",
        connect=connect,
        backend_class=Psycopg2Backend,
        job_table=job_table,
        archived_job_table=archived_job_table,
    )


def _table_names() -> dict[str, str]:
    # Tables of their own per run and per xdist worker: the suite's lock tests need committed rows.
    suffix = os.environ.get("PROLETARIAN_TEST_TABLE_PREFIX", "") + os.environ.get(
        "PYTEST_XDIST_WORKER", "main"
    )
    return {"job_table": f"psycopg2_job_{suffix}", "archived_job_table": f"psycopg2_archived_job_{suffix}"}


class TestPsycopg2Backend(BackendSuite):
    @pytest.fixture(scope="class")
    @classmethod
    def harness(cls) -> Iterator[SqlHarness]:
        try:
            psycopg2.connect(os.environ.get(DSN_ENV) or DEFAULT_DSN).close()
        except psycopg2.OperationalError as exc:
            pytest.skip(f"no PostgreSQL for the psycopg2 backend (set {DSN_ENV}): {exc}")
        harness = load_harness(f"{__name__}:psycopg2_harness", **_table_names())
        assert isinstance(harness, SqlHarness)
        with installed(harness):
            yield harness
