"""Choosing the database of a command (--dsn, PROLETARIAN_DSN, else embedded PostgreSQL) and connecting."""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from proletarian_ref import schema
from proletarian_ref.backend import Backend
from proletarian_ref.backends.dsn import connection_factory, dialect_of_dsn, redact, scrub
from proletarian_ref.backends.mysql_driver import DRIVER_MODULES, MULTI_STATEMENTS, driver_of
from proletarian_ref.cli.errors import CannotConnectError, CliError, SchemaMissingCliError, UsageError
from proletarian_ref.cli.logs import notice
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.ops import embedded
from proletarian_ref.ops.stats import missing_tables, schema_lock
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName, table_name

DSN_ENV: Final = "PROLETARIAN_DSN"
CONNECT_TIMEOUT_S: Final = 10
# The package and extra of each driver a DSN may name, by the module it imports.
_DRIVER_EXTRAS: Final = {
    "psycopg": ("psycopg", "postgresql"),
    "pymysql": ("PyMySQL", "mysql"),
    "MySQLdb": ("mysqlclient", "mysqlclient"),
}
_DIALECT_DRIVERS: Final = {"postgresql": "psycopg", "mysql": "pymysql"}


def add_database_options(parser: argparse.ArgumentParser, *, dsn: bool = True) -> None:
    group = parser.add_argument_group("database")
    if dsn:
        group.add_argument(
            "--dsn",
            help=f"postgresql://... or mysql://... (default: ${DSN_ENV}, else the embedded PostgreSQL)",
        )
    group.add_argument("--job-table", default=DEFAULT_JOB_TABLE, help="job table (default: %(default)s)")
    group.add_argument(
        "--archived-job-table",
        default=DEFAULT_ARCHIVED_JOB_TABLE,
        help="archived job table (default: %(default)s)",
    )


@dataclass(frozen=True, slots=True)
class Tables:
    job: TableName
    archived: TableName

    @property
    def as_list(self) -> list[TableName]:
        return [self.job, self.archived]

    @property
    def are_default(self) -> bool:
        return (str(self.job), str(self.archived)) == (DEFAULT_JOB_TABLE, DEFAULT_ARCHIVED_JOB_TABLE)


def tables_from(args: argparse.Namespace) -> Tables:
    try:
        job = table_name(args.job_table, option="--job-table")
        archived = table_name(args.archived_job_table, option="--archived-job-table")
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from exc
    if job == archived:
        raise UsageError(f"--job-table and --archived-job-table must differ, both are {job}")
    return Tables(job, archived)


def given_dsn(args: argparse.Namespace, *, ignore_env: bool = False) -> tuple[str | None, str]:
    """The DSN given and its origin: (dsn, "--dsn"), (dsn, "PROLETARIAN_DSN") or (None, "")."""
    if getattr(args, "dsn", None):
        return str(args.dsn), "--dsn"
    from_env = None if ignore_env else os.environ.get(DSN_ENV)
    if from_env:
        return from_env, DSN_ENV
    return None, ""


@dataclass(slots=True)
class Database:
    """The database a command works on, with a way to open connections to it."""

    dsn: str
    dialect: str
    source: str
    tables: Tables
    factory: Callable[[], Any]
    server: embedded.EmbeddedServer | None = None

    def describe(self) -> str:
        origin = "the embedded PostgreSQL" if self.server is not None else self.source
        return f"{redact(self.dsn)} ({origin})"

    def connect(self) -> Any:
        """A new connection; a failure is a CannotConnectError naming the (redacted) DSN."""
        try:
            return self.factory()
        except Exception as exc:
            raise cannot_connect(self, exc) from exc

    def install_command(self) -> str:
        """The command that installs the missing tables, with the options this command was given."""
        parts = ["proletarian-ref schema install"]
        if self.source == "--dsn":
            parts.append(f"--dsn {shlex.quote(redact(self.dsn))}")
        if str(self.tables.job) != DEFAULT_JOB_TABLE:
            parts.append(f"--job-table {self.tables.job}")
        if str(self.tables.archived) != DEFAULT_ARCHIVED_JOB_TABLE:
            parts.append(f"--archived-job-table {self.tables.archived}")
        command = " ".join(parts)
        if self.source == "--dsn" and redact(self.dsn) != self.dsn:
            command += "   (with the real password in place of ***)"
        return command


def cannot_connect(db: Database, exc: BaseException) -> CannotConnectError:
    detail = scrub(" ".join(str(exc).split()), db.dsn)
    return CannotConnectError(f"cannot connect to {db.describe()}: {type(exc).__name__}: {detail}")


def is_driver_error(exc: BaseException) -> bool:
    return driver_of(exc) in ("psycopg", "psycopg_pool", *DRIVER_MODULES)


def malformed_port(dsn: str) -> str | None:
    """What is wrong with a port of the DSN (each host's, for a libpq multi-host DSN), or None.

    Checked before the driver sees the DSN: PyMySQL would raise a bare ValueError, and libpq a connection
    error that reads like a server that is down.
    """
    hosts = urlsplit(dsn).netloc.rpartition("@")[2]
    for host in hosts.split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        if ":" not in port:
            continue
        text = port.rpartition(":")[2]
        if text and not (text.isascii() and text.isdigit() and 0 < int(text) < 65536):
            return f"port {text!r} is not a port number (1 to 65535)"
    return None


def _factory(dsn: str, dialect: str, **overrides: Any) -> Callable[[], Any]:
    try:
        return connection_factory(dsn, connect_timeout=CONNECT_TIMEOUT_S, **overrides)
    except ValueError as exc:
        # ConfigurationError, or the driver's own parsing of an option (a timeout that is not a number).
        raise UsageError(f"a malformed DSN {redact(dsn)!r}: {exc}") from exc
    except ImportError as exc:
        # The module that is missing says which driver: a mysql+mysqlclient:// DSN's is MySQLdb.
        missing = (exc.name or "").split(".", 1)[0]
        package, extra = _DRIVER_EXTRAS.get(missing, _DRIVER_EXTRAS[_DIALECT_DRIVERS[dialect]])
        raise CliError(
            f"a {dialect} DSN needs the {package} driver: pip install 'proletarian-ref[{extra}]' ({exc})"
        ) from exc


def refuse_pipeline(db: Database) -> None:
    """--pipeline on MySQL: a usage error before any worker starts."""
    if db.dialect == "mysql":
        raise UsageError(
            f"--pipeline is PostgreSQL's (psycopg's pipeline mode); {db.describe()} is MySQL/MariaDB, "
            "whose --compact already sends a job's archive and delete in one query"
        )


def plan_backend(db: Database, *, compact: bool, chain: bool, pipeline: bool = False) -> Backend:
    """A backend on the compact statement plan, with chained claims and/or pipelined, for the worker
    command's queue workers, closed by the caller.

    On MySQL its connections are opened with the CLIENT.MULTI_STATEMENTS flag, which the compact plan
    and chained claims need (their statements go as one multi-statement query); no other command's
    connections get it. Pipelining is PostgreSQL's: on MySQL --pipeline is refused before any worker starts.
    """
    if db.dialect == "mysql":
        if pipeline:
            refuse_pipeline(db)
        from proletarian_ref.backends.mysql import MySQLBackend

        factory = _factory(db.dsn, db.dialect, client_flag=MULTI_STATEMENTS)
        return MySQLBackend(factory, compact=True, chain=chain)
    from proletarian_ref.backends.postgres import PostgresBackend

    return PostgresBackend(db.factory, compact=compact, chain=chain, pipeline=pipeline)


def _start_embedded(tables: Tables, *, keep_running: bool = False) -> Database:
    try:
        server = embedded.start(keep_running=keep_running)
    except embedded.EmbeddedServerError as exc:
        raise CannotConnectError(str(exc)) from exc
    if server.kept:
        lifetime = "it keeps running until: proletarian-ref embedded stop"
    else:
        lifetime = "it stops when the last command using it ends"
    state = "started" if server.started_here else "already running"
    notice(
        f"no --dsn or {DSN_ENV} given: using the embedded PostgreSQL in {server.data_dir} "
        f"({state}; {lifetime})"
    )
    try:
        return Database(
            dsn=server.dsn,
            dialect="postgresql",
            source="embedded",
            tables=tables,
            factory=_factory(server.dsn, "postgresql"),
            server=server,
        )
    except BaseException:
        server.release()
        raise


def _install_once(conn: Any, db: Database) -> None:
    # Commands started together on a new embedded server would otherwise race on CREATE SCHEMA.
    with schema_lock(conn, dialect=db.dialect):
        if missing_tables(conn, db.tables.as_list, dialect=db.dialect):
            schema.install(
                conn, job_table=db.tables.job, archived_job_table=db.tables.archived, dialect=db.dialect
            )
            notice(f"installed the schema ({db.tables.job}, {db.tables.archived}) in the embedded PostgreSQL")


def _check_schema(db: Database, *, install_if_missing: bool) -> None:
    conn = db.connect()
    try:
        missing = missing_tables(conn, db.tables.as_list, dialect=db.dialect)
        if missing and install_if_missing:
            _install_once(conn, db)
            return
    finally:
        conn.close()
    if missing:
        names = " and ".join(str(t) for t in missing)
        raise SchemaMissingCliError(
            f"{names} {'does' if len(missing) == 1 else 'do'} not exist in {db.describe()}; "
            f"install the schema with:\n  {db.install_command()}"
        )


@contextmanager
def open_database(
    args: argparse.Namespace,
    tables: Tables,
    *,
    check_schema: bool = True,
    keep_embedded: bool = False,
    ignore_env: bool = False,
) -> Iterator[Database]:
    """The database for `args`, checked to connect and (with `check_schema`) to have both tables.

    With no DSN the embedded PostgreSQL is started or joined, the schema installed if missing, and
    released when the block ends.
    """
    dsn, source = given_dsn(args, ignore_env=ignore_env)
    if dsn is None:
        db = _start_embedded(tables, keep_running=keep_embedded)
    else:
        try:
            dialect = dialect_of_dsn(dsn)
        except ConfigurationError as exc:
            raise UsageError(f"{exc} (from {source})") from exc
        wrong = malformed_port(dsn)
        if wrong is not None:
            raise UsageError(f"a malformed DSN {redact(dsn)!r} (from {source}): {wrong}")
        db = Database(dsn=dsn, dialect=dialect, source=source, tables=tables, factory=_factory(dsn, dialect))
    try:
        if check_schema:
            _check_schema(db, install_if_missing=db.server is not None)
        else:
            db.connect().close()
        yield db
    finally:
        if db.server is not None:
            db.server.release()
