"""A Proletarian backend on psycopg2, kept apart from the project as a third party's package would be."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar, Final

import psycopg2  # type: ignore[import-untyped]
import psycopg2.errors  # type: ignore[import-untyped]
import psycopg2.extras  # type: ignore[import-untyped]

from proletarian_ref.backend import Capabilities
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.errors import DatabaseError, SchemaMissingError, TransientDatabaseError

# psycopg2 neither sends nor reads uuid.UUID by itself; Proletarian's job_id column is a uuid.
psycopg2.extras.register_uuid()

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
        if isinstance(exc, psycopg2.errors.UndefinedTable):
            return SchemaMissingError(message)
        code = exc.pgcode or ""
        if (
            isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError))
            or code[:2] in _TRANSIENT_CLASSES
            or code in _TRANSIENT_CODES
        ):
            return TransientDatabaseError(message)
        return DatabaseError(message)

    def _cursor(self, conn: Any) -> Any:
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
