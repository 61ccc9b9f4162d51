"""Harnesses: a backend under test plus its own tables and a way to read them, named by "module:factory"."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from proletarian_ref.backend import ArchivedJobRecord, Backend, Capabilities, JobRecord
from proletarian_ref.backends.memory import MemoryBackend, MemoryDatabase
from proletarian_ref.job_ids import JobIdStrategy, default_job_id_strategy
from proletarian_ref.schema import schema_statements
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, table_name

H = TypeVar("H", bound="Harness")

# The harness's own statements (install, clear, reads) must never wait long for a lock some broken backend
# left behind: a stuck test should fail in seconds, not after MySQL's default 50 s or PostgreSQL's forever.
_HARNESS_LOCK_TIMEOUT_S = 10


@dataclass(frozen=True, slots=True)
class HarnessFactory:
    """How load_harness made a harness, so that another process can make the same one."""

    spec: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    worker_options: dict[str, Any] = field(default_factory=dict)

    def load(self) -> Harness:
        harness = load_harness(self.spec, **self.kwargs)
        return harness.with_worker_options(**self.worker_options) if self.worker_options else harness


class Harness:
    """What the suite and the benchmarks need around a backend; subclass SqlHarness or this."""

    name: str
    dialect: str
    job_table: str
    archived_job_table: str
    # Set by load_harness; tests that start separate processes need it to rebuild the harness there.
    factory: HarnessFactory | None = None

    def __init__(self, name: str, job_table: str, archived_job_table: str) -> None:
        self.name = name
        self.job_table = job_table
        self.archived_job_table = archived_job_table
        # Options of create_queue_worker and process_next_job (batch_size, ...) that every worker and
        # every run of the suite gets: see with_worker_options.
        self.worker_options: dict[str, Any] = {}
        self._backends: list[Backend] = []
        self._backends_lock = threading.Lock()
        # What every enqueue of the suite adds, e.g. {"notify": True} to run the suite with the wake-up
        # announcement in every enqueuer's transaction.
        self.enqueue_options: dict[str, Any] = {}

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

    def analyze(self) -> None:
        """Refresh the planner's statistics of the job table, as autovacuum would in production.

        The plan can change with them: PostgreSQL reads a small table in heap order once it knows how
        few rows there are, and only an ORDER BY then keeps the claim oldest-first. Does nothing here.
        """

    # -- optional: the session, isolation, zone and size clauses skip, saying why, without these ------

    def supports(self, feature: str) -> bool:
        """Whether this harness provides `feature`: "sessions" (session_of, kill_session, session_state),
        "caller_writes" (caller_write, caller_markers), "zones" (zoned) or "payload_bytes"."""
        return False

    def session_of(self, conn: Any) -> Any:
        """The server's id of the session behind `conn` (pg_backend_pid(), CONNECTION_ID())."""
        raise NotImplementedError

    def kill_session(self, session: Any) -> None:
        """End that session from another one, as an operator or a failover does, and wait until it is gone."""
        raise NotImplementedError

    def session_state(self, conn: Any) -> dict[str, str]:
        """Everything a library could change in the session of `conn`: server settings, user variables,
        the driver's autocommit and isolation flags. Read inside the caller's transaction; changes nothing."""
        raise NotImplementedError

    def caller_write(self, conn: Any, marker: int) -> None:
        """A write of the caller's own (a row in a table of its own) on `conn`, uncommitted."""
        raise NotImplementedError

    def caller_markers(self) -> list[int]:
        """The committed markers of caller_write."""
        raise NotImplementedError

    def zoned(self, zone: str) -> Harness:
        """The same backend and tables, every new session (callers' and the backend's) in time zone `zone`
        (an offset such as "+05:30" or a named zone such as "America/New_York")."""
        raise NotImplementedError

    def payload_bytes(self) -> tuple[list[bytes], list[bytes]]:
        """The payload column's stored bytes (UTF-8) of every committed job and archived job."""
        raise NotImplementedError

    @property
    def payload_limit_bytes(self) -> int | None:
        """The payload column's size limit in UTF-8 bytes, or None when it has none worth testing."""
        return None

    # -- given -----------------------------------------------------------------------------------------

    def with_worker_options(self: H, **options: Any) -> H:
        """The same harness (database, tables, backend class) whose queue workers and process_next_job
        runs all get `options` too, e.g. batch_size=8 to run the suite in batch mode.

        A process rebuilding it from its factory gets the same options. It opens its own backends (and
        connections): close it as well as this one.
        """
        twin = copy.copy(self)
        twin.name = f"{self.name} with {', '.join(f'{k}={v!r}' for k, v in options.items())}"
        twin.worker_options = {**self.worker_options, **options}
        twin._forget_open_resources()
        if self.factory is not None:
            twin.factory = dataclasses.replace(self.factory, worker_options=twin.worker_options)
        return twin

    @property
    def data_source(self) -> Any:
        """What create_queue_worker takes for this backend."""
        return self.backend()

    def _forget_open_resources(self) -> None:
        """In a copy (with_worker_options): open nothing of the original's, close nothing of it."""
        self._backends = []
        self._backends_lock = threading.Lock()

    def backend(self) -> Backend:
        """A backend that close() closes."""
        backend = self.make_backend()
        with self._backends_lock:
            self._backends.append(backend)
        return backend

    @property
    def capabilities(self) -> Capabilities:
        backend = self.make_backend()
        try:
            return backend.capabilities
        finally:
            backend.close()

    def job_id_strategy(self) -> JobIdStrategy:
        """The id strategy enqueuers and workers of this backend share; override for other id columns."""
        return default_job_id_strategy(self.dialect)

    @property
    def table_options(self) -> dict[str, Any]:
        return {"job_table": self.job_table, "archived_job_table": self.archived_job_table}

    def close(self) -> None:
        with self._backends_lock:
            backends, self._backends = self._backends, []
        for backend in backends:
            backend.close()


# MySQL's TEXT column: 2^16 - 1 bytes.
MYSQL_TEXT_BYTES: Final = 65_535
# How long a killed session may take to disappear from the server's session list.
_SESSION_GONE_S: Final = 10.0
# Session variables that change by themselves (the clock, counters of the last statement, whether a
# transaction is open, which the caller's own commit ends).
_MYSQL_VOLATILE_VARIABLES: Final = frozenset(
    {
        "in_transaction",
        "timestamp",
        "last_insert_id",
        "insert_id",
        "identity",
        "warning_count",
        "error_count",
        "rand_seed1",
        "rand_seed2",
        "last_gtid",
        "gtid_seq_no",
    }
)
_OFFSET: Final = re.compile(r"^([+-])(\d\d):(\d\d)$")


def _posix_zone(zone: str) -> str:
    """PostgreSQL reads a bare "+05:30" as a POSIX zone, west of Greenwich; spell the offset so it is east."""
    match = _OFFSET.match(zone)
    if match is None:
        return zone
    sign, hours, minutes = match.groups()
    west = "-" if sign == "+" else "+"
    return f"<{sign}{hours}{minutes}>{west}{hours}:{minutes}"


def _mysql_user_variables(cursor: Any) -> list[tuple[str, Any]]:
    """The session's user variables: MariaDB's information_schema table, else MySQL 8's performance_schema."""
    for query in (
        "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.USER_VARIABLES",
        "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM performance_schema.user_variables_by_thread "
        "WHERE THREAD_ID = PS_CURRENT_THREAD_ID()",
    ):
        try:
            cursor.execute(query)
        except Exception:  # the other server's table; a failed read leaves MySQL's transaction as it was
            continue
        return [tuple(row) for row in cursor.fetchall()]
    return []


def _driver_state(conn: Any) -> dict[str, str]:
    """The driver's own session flags, which change without a statement (psycopg, PyMySQL, psycopg2)."""
    state: dict[str, str] = {}
    get_autocommit = getattr(conn, "get_autocommit", None)
    if callable(get_autocommit):
        state["driver autocommit"] = str(get_autocommit())
    for name in ("autocommit", "isolation_level", "read_only", "deferrable", "charset", "encoding"):
        value = getattr(conn, name, None)
        if value is not None and not callable(value):
            state[f"driver {name}"] = str(value)
    return state


def _execute(cursor: Any, statement: str, params: Any) -> None:
    """DB-API's execute, with no parameters argument at all when there are none.

    Drivers differ on `execute(statement, None)`: psycopg and PyMySQL take it, pg8000 refuses it. Every
    statement of the harness uses the format paramstyle (%s), which PostgreSQL's and MySQL's DB-API
    drivers share (psycopg, psycopg2, pg8000, PyMySQL, mysql-connector-python).
    """
    if params is None:
        cursor.execute(statement)
    else:
        cursor.execute(statement, params)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _job_record(row: tuple[Any, ...]) -> JobRecord:
    job_id, queue, job_type, payload, attempts, enqueued_at, process_at = row
    return JobRecord(job_id, queue, job_type, payload, int(attempts), _utc(enqueued_at), _utc(process_at))


def _archived_record(row: tuple[Any, ...]) -> ArchivedJobRecord:
    job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at = row
    return ArchivedJobRecord(
        job_id,
        queue,
        job_type,
        payload,
        int(attempts),
        status,
        _utc(enqueued_at),
        _utc(process_at),
        _utc(finished_at),
    )


def one_value(conn: Any, statement: str) -> Any:
    """The first column of the first row `statement` returns, on any DB-API connection, its cursor closed."""
    cursor = conn.cursor()
    try:
        cursor.execute(statement)
        row = cursor.fetchone()
    finally:
        cursor.close()
    return row[0]


class SqlHarness(Harness):
    """A harness over any DB-API driver; `backend_class(connect)` is the backend under test."""

    def __init__(
        self,
        name: str,
        *,
        dialect: str,
        connect: Callable[[], Any],
        backend_class: Callable[[Callable[[], Any]], Backend],
        job_table: str = DEFAULT_JOB_TABLE,
        archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
        zone: str | None = None,
    ) -> None:
        super().__init__(name, job_table, archived_job_table)
        self.dialect = dialect
        self.zone = zone
        self._base_connect = connect
        self._connect = connect if zone is None else self._zoned_connect
        self._backend_class = backend_class
        # The caller's own table, for the clauses about the caller's transaction.
        self.caller_table = str(table_name(f"{job_table}_caller"))
        # One connection for the harness's own reads and writes: the model test reads both tables after
        # every step, and a connect per read would dominate its run time.
        self._own: Any = None
        self._own_lock = threading.Lock()

    def make_backend(self) -> Backend:
        return self._backend_class(self._connect)

    def connect(self) -> Any:
        return self._connect()

    @property
    def data_source(self) -> Any:
        return self._connect

    @property
    def capabilities(self) -> Capabilities:
        caps = getattr(self._backend_class, "capabilities", None)
        if isinstance(caps, Capabilities):
            return caps
        return super().capabilities

    def with_backend(self, backend_class: Callable[[Callable[[], Any]], Backend], name: str) -> SqlHarness:
        """The same database and tables under another backend class (a fork, a deliberately broken one).

        The copy has no factory: a separate process rebuilding it would get the original backend.
        """
        return SqlHarness(
            name,
            dialect=self.dialect,
            connect=self._base_connect,
            backend_class=backend_class,
            job_table=self.job_table,
            archived_job_table=self.archived_job_table,
            zone=self.zone,
        )

    def zoned(self, zone: str) -> SqlHarness:
        """The same database, tables and backend class, every new session in time zone `zone`.

        The copy has no factory, and its own reads stay in UTC as every harness's do.
        """
        return SqlHarness(
            f"{self.name} in {zone}",
            dialect=self.dialect,
            connect=self._base_connect,
            backend_class=self._backend_class,
            job_table=self.job_table,
            archived_job_table=self.archived_job_table,
            zone=zone,
        )

    def _zoned_connect(self) -> Any:
        assert self.zone is not None
        conn = self._base_connect()
        try:
            cursor = conn.cursor()
            try:
                if self.dialect == "mysql":
                    cursor.execute("SET time_zone = %s", (self.zone,))
                else:
                    cursor.execute("SELECT set_config('TimeZone', %s, false)", (_posix_zone(self.zone),))
            finally:
                cursor.close()
        except Exception as exc:
            conn.close()
            raise RuntimeError(
                f"cannot set the session time zone {self.zone!r}: {exc} (MySQL needs its time zone tables: "
                "mariadb-tzinfo-to-sql /usr/share/zoneinfo | mariadb -uroot mysql)"
            ) from exc
        conn.commit()
        return conn

    # -- the optional features, for PostgreSQL and MySQL -----------------------------------------------

    def supports(self, feature: str) -> bool:
        return self.dialect in ("postgresql", "mysql")

    def session_of(self, conn: Any) -> Any:
        query = "SELECT pg_backend_pid()" if self.dialect == "postgresql" else "SELECT CONNECTION_ID()"
        return int(one_value(conn, query))

    def kill_session(self, session: Any) -> None:
        if self.dialect == "postgresql":
            self.select("SELECT pg_terminate_backend(%s)", (session,))
            gone = "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %s"
        else:
            self.execute("KILL %s", (session,))
            gone = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s"
        # Both servers end the session asynchronously; a later statement on it must meet a dead session.
        deadline = time.monotonic() + _SESSION_GONE_S
        while self.select(gone, (session,))[0][0]:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"session {session} was still there {_SESSION_GONE_S:g} s after the kill"
                )
            time.sleep(0.01)

    def session_state(self, conn: Any) -> dict[str, str]:
        cursor = conn.cursor()
        state: dict[str, str] = {}
        try:
            if self.dialect == "postgresql":
                cursor.execute("SELECT name, setting FROM pg_settings")
                state.update((f"setting {name}", str(value)) for name, value in cursor.fetchall())
                cursor.execute("SHOW transaction_isolation")
                state["transaction_isolation"] = str(cursor.fetchone()[0])
            else:
                cursor.execute("SHOW SESSION VARIABLES")
                state.update(
                    (f"variable {name}", str(value))
                    for name, value in cursor.fetchall()
                    if name not in _MYSQL_VOLATILE_VARIABLES
                )
                state.update((f"user variable @{n}", str(v)) for n, v in _mysql_user_variables(cursor))
        finally:
            cursor.close()
        state.update(_driver_state(conn))
        return state

    def caller_write(self, conn: Any, marker: int) -> None:
        cursor = conn.cursor()
        try:
            cursor.execute(f"INSERT INTO {self.caller_table} (marker) VALUES (%s)", (marker,))
        finally:
            cursor.close()

    def caller_markers(self) -> list[int]:
        return sorted(int(row[0]) for row in self.select(f"SELECT marker FROM {self.caller_table}"))

    def payload_bytes(self) -> tuple[list[bytes], list[bytes]]:
        as_bytes = (
            "convert_to(payload, 'UTF8')" if self.dialect == "postgresql" else "CAST(payload AS BINARY)"
        )
        return (
            [bytes(row[0]) for row in self.select(f"SELECT {as_bytes} FROM {self.job_table}")],
            [bytes(row[0]) for row in self.select(f"SELECT {as_bytes} FROM {self.archived_job_table}")],
        )

    @property
    def payload_limit_bytes(self) -> int | None:
        # MySQL's TEXT holds 65,535 bytes; PostgreSQL's holds 1 GB, too much to send in a test.
        return MYSQL_TEXT_BYTES if self.dialect == "mysql" else None

    def _session(self, cursor: Any) -> None:
        if self.dialect == "mysql":
            # Read TIMESTAMP columns as UTC wall-clock time, as the MySQL backend writes them.
            cursor.execute("SET time_zone = '+00:00'")
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {_HARNESS_LOCK_TIMEOUT_S}")
        elif self.dialect == "postgresql":
            cursor.execute(f"SET lock_timeout = '{_HARNESS_LOCK_TIMEOUT_S}s'")

    @contextmanager
    def _own_connection(self) -> Iterator[Any]:
        with self._own_lock:
            if self._own is None:
                conn = self._connect()
                cursor = conn.cursor()
                try:
                    self._session(cursor)
                finally:
                    cursor.close()
                conn.commit()
                self._own = conn
            try:
                yield self._own
            except BaseException:
                # Whatever went wrong, the next use starts from a fresh connection.
                conn, self._own = self._own, None
                # It is being dropped because it failed; closing is only tidying up.
                with contextlib.suppress(Exception):
                    conn.close()
                raise

    def execute(self, statement: str, params: Any = None) -> None:
        """Run one statement in its own committed transaction."""
        with self._own_connection() as conn:
            cursor = conn.cursor()
            try:
                _execute(cursor, statement, params)
            finally:
                cursor.close()
            conn.commit()

    def select(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Rows of one query, read in a transaction of their own (so they are the committed rows)."""
        with self._own_connection() as conn:
            cursor = conn.cursor()
            try:
                _execute(cursor, statement, params)
                rows = [tuple(row) for row in cursor.fetchall()]
            finally:
                cursor.close()
            # Ending the transaction releases its snapshot (MySQL's REPEATABLE READ would keep showing
            # these rows) and any metadata lock that would hold up a later DROP or DELETE.
            conn.rollback()
            return rows

    def jobs(self) -> list[JobRecord]:
        rows = self.select(
            "SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at "
            f"FROM {self.job_table}"
        )
        return [_job_record(row) for row in rows]

    def archived_jobs(self) -> list[ArchivedJobRecord]:
        rows = self.select(
            "SELECT job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at "
            f"FROM {self.archived_job_table}"
        )
        return [_archived_record(row) for row in rows]

    def install(self) -> None:
        for table in (self.job_table, self.archived_job_table):
            self.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in schema_statements(
            self.dialect, job_table=self.job_table, archived_job_table=self.archived_job_table
        ):
            self.execute(statement)
        self.execute(f"DROP TABLE IF EXISTS {self.caller_table}")
        self.execute(f"CREATE TABLE {self.caller_table} (marker INTEGER NOT NULL)")

    def clear(self) -> None:
        self.execute(f"DELETE FROM {self.job_table}")
        self.execute(f"DELETE FROM {self.archived_job_table}")
        self.execute(f"DELETE FROM {self.caller_table}")

    def analyze(self) -> None:
        if self.dialect == "postgresql":
            self.execute(f"ANALYZE {self.job_table}")
        elif self.dialect == "mysql":
            self.select(f"ANALYZE TABLE {self.job_table}")

    def _forget_open_resources(self) -> None:
        super()._forget_open_resources()
        self._own = None
        self._own_lock = threading.Lock()

    def close(self) -> None:
        super().close()
        with self._own_lock:
            conn, self._own = self._own, None
        if conn is not None:
            # Closing at the end of a test; a broken connection is as good as closed.
            with contextlib.suppress(Exception):
                conn.close()


class MemoryHarness(Harness):
    """The in-memory backend: one MemoryDatabase shared by every backend and connection of the harness."""

    def __init__(
        self,
        job_table: str = DEFAULT_JOB_TABLE,
        archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
        *,
        backend_class: Callable[[MemoryDatabase], Backend] = MemoryBackend,
        name: str = "memory",
        memory: MemoryDatabase | None = None,
    ) -> None:
        super().__init__(name, job_table, archived_job_table)
        self.dialect = "memory"
        self.memory = memory if memory is not None else MemoryDatabase()
        self._backend_class = backend_class

    def make_backend(self) -> Backend:
        return self._backend_class(self.memory)

    def connect(self) -> Any:
        return self.memory.connect()

    @property
    def capabilities(self) -> Capabilities:
        caps = getattr(self._backend_class, "capabilities", None)
        return caps if isinstance(caps, Capabilities) else MemoryBackend.capabilities

    def with_backend(self, backend_class: Callable[[MemoryDatabase], Backend], name: str) -> MemoryHarness:
        """The same in-memory database and tables under another backend class."""
        return MemoryHarness(
            self.job_table,
            self.archived_job_table,
            backend_class=backend_class,
            name=name,
            memory=self.memory,
        )

    def jobs(self) -> list[JobRecord]:
        return self.memory.jobs(self.job_table)

    def archived_jobs(self) -> list[ArchivedJobRecord]:
        return self.memory.archived_jobs(self.archived_job_table)

    def install(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.memory.clear(self.job_table, self.archived_job_table, self._caller_table)

    @property
    def _caller_table(self) -> str:
        return f"{self.job_table} (caller)"

    def supports(self, feature: str) -> bool:
        return feature in ("sessions", "caller_writes", "payload_bytes")

    def session_of(self, conn: Any) -> Any:
        return conn

    def kill_session(self, session: Any) -> None:
        session.kill()

    def session_state(self, conn: Any) -> dict[str, str]:
        return {"autocommit": str(conn.autocommit), "closed": str(conn.closed)}

    def caller_write(self, conn: Any, marker: int) -> None:
        with self.memory.lock:
            conn._write(self._caller_table, marker, marker)

    def caller_markers(self) -> list[int]:
        with self.memory.lock:
            return sorted(self.memory.tables.get(self._caller_table, {}).values())

    def payload_bytes(self) -> tuple[list[bytes], list[bytes]]:
        return (
            [job.payload.encode("utf-8") for job in self.jobs()],
            [job.payload.encode("utf-8") for job in self.archived_jobs()],
        )


def load_harness(spec: str, **kwargs: Any) -> Harness:
    """Call the factory named "package.module:callable" (keyword arguments passed on) for a Harness.

    The harness remembers the spec and arguments, so a worker process can build the same one.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"backend factory {spec!r} must look like 'package.module:callable'")
    factory = getattr(importlib.import_module(module_name), attribute, None)
    if not callable(factory):
        raise ValueError(f"{attribute!r} in module {module_name!r} is not a callable factory")
    harness = factory(**kwargs)
    if not isinstance(harness, Harness):
        raise TypeError(f"factory {spec!r} returned {type(harness).__name__}, not a conformance Harness")
    harness.factory = HarnessFactory(spec, dict(kwargs))
    return harness


@contextmanager
def installed(harness: H) -> Iterator[H]:
    """The harness with freshly created tables, closed afterwards: the body of a suite's harness fixture."""
    harness.install()
    try:
        yield harness
    finally:
        harness.close()
