"""A backend the project does not ship, on psycopg2, proven by the conformance suite as its author would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

import pytest

from conformance import BackendSuite, SqlHarness, installed, load_harness
from proletarian_ref.backend import Capabilities
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.errors import DatabaseError, SchemaMissingError, TransientDatabaseError
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE

psycopg2 = pytest.importorskip("psycopg2", reason="the psycopg2 backend needs psycopg2 (tox -e thirdparty)")
psycopg2_errors = pytest.importorskip("psycopg2.errors")
psycopg2_extras = pytest.importorskip("psycopg2.extras")

# psycopg2 neither sends nor reads uuid.UUID by itself; Proletarian's job_id column is a uuid.
psycopg2_extras.register_uuid()

DSN_ENV: Final = "PROLETARIAN_TEST_PG_DSN"
DEFAULT_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
# SQLSTATE classes and codes after which the same work may succeed on a retry, as PostgresBackend has them.
_TRANSIENT_CLASSES: Final = frozenset({"08", "40", "53", "57"})
_TRANSIENT_CODES: Final = frozenset({"55P03", "25P03"})


class Psycopg2Backend(SqlBackend):
    """Proletarian's PostgreSQL statements (the project's sql/postgresql/queries.sql) on psycopg2."""

    dialect: ClassVar[str] = "postgresql"
    capabilities: ClassVar[Capabilities] = Capabilities()

    def _translate(self, exc: BaseException) -> DatabaseError | None:
        if not isinstance(exc, psycopg2.Error):
            return None
        message = f"{type(exc).__name__}: {str(exc).strip()}"
        if isinstance(exc, psycopg2_errors.UndefinedTable):
            return SchemaMissingError(message)
        code = exc.pgcode or ""
        if (
            isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError))
            or code[:2] in _TRANSIENT_CLASSES
            or code in _TRANSIENT_CODES
        ):
            return TransientDatabaseError(message)
        return DatabaseError(message)

    def _cursor(self, conn: Any, *, reads_rows: bool = False) -> Any:
        return conn.cursor()

    def _db_time(self, value: datetime, *, what: str = "time") -> Any:
        # An ISO 8601 literal with its offset: PostgreSQL reads the exact instant into TIMESTAMPTZ.
        return value.astimezone(UTC).isoformat()

    def _from_db_time(self, value: Any) -> datetime:
        result: datetime = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return result

    def _begin(self, conn: Any) -> Any:
        was_autocommit = bool(conn.autocommit)
        if was_autocommit:
            conn.autocommit = False
        return was_autocommit

    def _end(self, conn: Any, state: Any) -> None:
        if state and not conn.closed:
            conn.autocommit = True

    def _is_broken(self, conn: Any) -> bool:
        return bool(conn.closed)

    def _generated_id(self, cursor: Any) -> Any:
        row = cursor.fetchone()
        return None if row is None else row[0]


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
