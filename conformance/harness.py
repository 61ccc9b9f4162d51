"""Harnesses: a backend under test plus its own tables and a way to read them, named by "module:factory"."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from proletarian_ref.backend import ArchivedJobRecord, Backend, Capabilities, JobRecord
from proletarian_ref.backends.memory import MemoryBackend, MemoryDatabase
from proletarian_ref.schema import schema_statements
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE


class Harness:
    """What the suite and the benchmarks need around a backend; subclass SqlHarness or this."""

    name: str
    job_table: str
    archived_job_table: str

    def __init__(self, name: str, job_table: str, archived_job_table: str) -> None:
        self.name = name
        self.job_table = job_table
        self.archived_job_table = archived_job_table
        self._backends: list[Backend] = []

    # -- to provide ------------------------------------------------------------------------------------

    def make_backend(self) -> Backend:
        """A new backend with its own data source."""
        raise NotImplementedError

    def connect(self) -> Any:
        """A new caller connection, as an application would pass to enqueue; the caller commits."""
        raise NotImplementedError

    def jobs(self) -> list[JobRecord]:
        """Committed rows of the job table."""
        raise NotImplementedError

    def archived_jobs(self) -> list[ArchivedJobRecord]:
        """Committed rows of the archived job table."""
        raise NotImplementedError

    def install(self) -> None:
        """Create (or recreate) this harness's tables."""
        raise NotImplementedError

    def clear(self) -> None:
        """Empty both tables."""
        raise NotImplementedError

    # -- given -----------------------------------------------------------------------------------------

    @property
    def data_source(self) -> Any:
        """What create_queue_worker takes for this backend."""
        return self.backend()

    def backend(self) -> Backend:
        """A backend that close() closes."""
        backend = self.make_backend()
        self._backends.append(backend)
        return backend

    @property
    def capabilities(self) -> Capabilities:
        return self.make_backend().capabilities

    @property
    def table_options(self) -> dict[str, Any]:
        return {"job_table": self.job_table, "archived_job_table": self.archived_job_table}

    def close(self) -> None:
        backends, self._backends = self._backends, []
        for backend in backends:
            backend.close()


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class SqlHarness(Harness):
    """Any DB-API driver: `connect` opens connections; `backend_class(connect)` is the backend."""

    def __init__(
        self,
        name: str,
        *,
        dialect: str,
        connect: Callable[[], Any],
        backend_class: Callable[[Callable[[], Any]], Backend],
        job_table: str = DEFAULT_JOB_TABLE,
        archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
    ) -> None:
        super().__init__(name, job_table, archived_job_table)
        self.dialect = dialect
        self._connect = connect
        self._backend_class = backend_class

    def make_backend(self) -> Backend:
        return self._backend_class(self._connect)

    def connect(self) -> Any:
        return self._connect()

    @property
    def data_source(self) -> Any:
        return self._connect

    @property
    def capabilities(self) -> Capabilities:
        caps: Capabilities = self._backend_class.capabilities  # type: ignore[attr-defined]
        return caps

    def _session(self, cursor: Any) -> None:
        # Read TIMESTAMP columns as UTC wall-clock time, as the MySQL backend writes them.
        if self.dialect == "mysql":
            cursor.execute("SET time_zone = '+00:00'")

    def execute(self, statement: str, params: Any = None) -> None:
        """Run one statement in its own committed transaction."""
        conn = self._connect()
        try:
            cursor = conn.cursor()
            self._session(cursor)
            cursor.execute(statement, params)
            cursor.close()
            conn.commit()
        finally:
            conn.close()

    def select(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            cursor = conn.cursor()
            self._session(cursor)
            cursor.execute(statement, params)
            rows = [tuple(row) for row in cursor.fetchall()]
            cursor.close()
            conn.rollback()
            return rows
        finally:
            conn.close()

    def jobs(self) -> list[JobRecord]:
        rows = self.select(
            "SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at "
            f"FROM {self.job_table}"
        )
        return [
            JobRecord(
                job_id=row[0],
                queue=row[1],
                job_type=row[2],
                payload=row[3],
                attempts=row[4],
                enqueued_at=_utc(row[5]),
                process_at=_utc(row[6]),
            )
            for row in rows
        ]

    def archived_jobs(self) -> list[ArchivedJobRecord]:
        rows = self.select(
            "SELECT job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at "
            f"FROM {self.archived_job_table}"
        )
        return [
            ArchivedJobRecord(
                job_id=row[0],
                queue=row[1],
                job_type=row[2],
                payload=row[3],
                attempts=row[4],
                status=row[5],
                enqueued_at=_utc(row[6]),
                process_at=_utc(row[7]),
                finished_at=_utc(row[8]),
            )
            for row in rows
        ]

    def install(self) -> None:
        for table in (self.job_table, self.archived_job_table):
            self.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in schema_statements(
            self.dialect, job_table=self.job_table, archived_job_table=self.archived_job_table
        ):
            self.execute(statement)

    def clear(self) -> None:
        self.execute(f"DELETE FROM {self.job_table}")
        self.execute(f"DELETE FROM {self.archived_job_table}")


class MemoryHarness(Harness):
    """The in-memory backend: one MemoryDatabase shared by every backend and connection of the harness."""

    def __init__(
        self, job_table: str = DEFAULT_JOB_TABLE, archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE
    ) -> None:
        super().__init__("memory", job_table, archived_job_table)
        self.dialect = "memory"
        self.memory = MemoryDatabase()

    def make_backend(self) -> Backend:
        return MemoryBackend(self.memory)

    def connect(self) -> Any:
        return self.memory.connect()

    @property
    def capabilities(self) -> Capabilities:
        return MemoryBackend.capabilities

    def jobs(self) -> list[JobRecord]:
        return self.memory.jobs(self.job_table)

    def archived_jobs(self) -> list[ArchivedJobRecord]:
        return self.memory.archived_jobs(self.archived_job_table)

    def install(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.memory.clear(self.job_table, self.archived_job_table)


def load_harness(spec: str, **kwargs: Any) -> Harness:
    """Call the factory named "package.module:callable" (keyword arguments passed on) for a Harness."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"backend factory {spec!r} must look like 'package.module:callable'")
    factory = getattr(importlib.import_module(module_name), attribute, None)
    if not callable(factory):
        raise ValueError(f"{attribute!r} in module {module_name!r} is not a callable factory")
    harness = factory(**kwargs)
    if not isinstance(harness, Harness):
        raise TypeError(f"factory {spec!r} returned {type(harness).__name__}, not a conformance Harness")
    return harness
