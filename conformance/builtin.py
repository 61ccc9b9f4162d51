"""Harness factories for the project's own backends, named as a third party names theirs ("module:fn")."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Final

from conformance.harness import MemoryHarness, SqlHarness
from proletarian_ref.backend import Backend
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE

PG_ENV: Final = "PROLETARIAN_TEST_PG_DSN"
MYSQL_ENV: Final = "PROLETARIAN_TEST_MYSQL_DSN"
DEFAULT_PG_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_MYSQL_DSN: Final = "mysql://root@127.0.0.1:3306/test"

# The drivers are imported inside the factories: importing the suite must not need every driver installed.


def postgresql(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """psycopg 3 on PostgreSQL at `dsn`, else $PROLETARIAN_TEST_PG_DSN, else the local server."""
    from proletarian_ref.backends.dsn import connection_factory
    from proletarian_ref.backends.postgres import PostgresBackend

    target = dsn or os.environ.get(PG_ENV) or DEFAULT_PG_DSN
    return SqlHarness(
        "postgresql",
        dialect="postgresql",
        connect=connection_factory(target),
        backend_class=PostgresBackend,
        job_table=job_table,
        archived_job_table=archived_job_table,
    )


def postgresql_pipeline(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """The same PostgreSQL, its backend on the pipelined statement plan (PostgresBackend(pipeline=True))."""
    from proletarian_ref.backends.postgres import PostgresBackend

    harness = postgresql(dsn, job_table, archived_job_table)
    return harness.with_backend(functools.partial(PostgresBackend, pipeline=True), "postgresql-pipeline")


def postgresql_compact(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """The same PostgreSQL, its backend on the compact statement plan (PostgresBackend(compact=True))."""
    from proletarian_ref.backends.postgres import PostgresBackend

    harness = postgresql(dsn, job_table, archived_job_table)
    return harness.with_backend(functools.partial(PostgresBackend, compact=True), "postgresql-compact")


def postgresql_pipeline_compact(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """The same PostgreSQL on both plans at once: pipelined, and the archive and delete in one statement."""
    from proletarian_ref.backends.postgres import PostgresBackend

    harness = postgresql(dsn, job_table, archived_job_table)
    return harness.with_backend(
        functools.partial(PostgresBackend, pipeline=True, compact=True), "postgresql-pipeline-compact"
    )


def postgresql_chain(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """The same PostgreSQL on the compact plan with chained claims: a finished job's COMMIT goes with the
    next BEGIN, and the worker claims the next job without leaving its block (PostgresBackend(compact=True,
    chain=True), backend.ChainedClaim)."""
    from proletarian_ref.backends.postgres import PostgresBackend

    harness = postgresql(dsn, job_table, archived_job_table)
    return harness.with_backend(
        functools.partial(PostgresBackend, compact=True, chain=True), "postgresql-chain"
    )


def postgresql_pipeline_chain(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """postgresql_chain in pipeline mode: a finished job's archive (its row count checked by the server),
    its COMMIT, the next BEGIN and the next claim go in one round trip (PostgresBackend(pipeline=True,
    compact=True, chain=True))."""
    from proletarian_ref.backends.postgres import PostgresBackend

    harness = postgresql(dsn, job_table, archived_job_table)
    return harness.with_backend(
        functools.partial(PostgresBackend, pipeline=True, compact=True, chain=True),
        "postgresql-pipeline-chain",
    )


def mysql(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """PyMySQL on MySQL/MariaDB at `dsn`, else $PROLETARIAN_TEST_MYSQL_DSN, else the local server."""
    from proletarian_ref.backends.mysql import MySQLBackend

    return _mysql("mysql", dsn, job_table, archived_job_table, MySQLBackend)


def mysql_compact(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """The same MySQL, its backend on the compact statement plan (MySQLBackend(compact=True)).

    Its connections are opened with CLIENT.MULTI_STATEMENTS, which the plan needs on the backend's own.
    """
    return _mysql_multi_statements("mysql-compact", dsn, job_table, archived_job_table, compact=True)


def mysql_chain(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """mysql_compact with chained claims: a finished job's archive and delete (each count checked by the
    server), its COMMIT and the next claim go as one query, one round trip a job (MySQLBackend(compact=True,
    chain=True), backend.ChainedClaim)."""
    return _mysql_multi_statements(
        "mysql-chain", dsn, job_table, archived_job_table, compact=True, chain=True
    )


def mysql_chain_classic(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """mysql_chain with Proletarian's claim statements (MySQLBackend(compact=True, chain=True,
    bounded_claim=False)): the claims the bounded ones replace, kept under the suite and beside them in the
    benchmarks."""
    return _mysql_multi_statements(
        "mysql-chain-classic",
        dsn,
        job_table,
        archived_job_table,
        compact=True,
        chain=True,
        bounded_claim=False,
    )


def mysqlclient(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """mysqlclient (MySQLdb, the C driver) on the same MySQL/MariaDB as mysql(): the backend on Proletarian's
    plan over connections of the other driver it runs on."""
    from proletarian_ref.backends.mysql import MySQLBackend

    return _mysql("mysqlclient", mysqlclient_dsn(dsn), job_table, archived_job_table, MySQLBackend)


def mysqlclient_compact(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """mysql_compact on mysqlclient (MySQLBackend(compact=True))."""
    from proletarian_ref.backends.mysql import MySQLBackend

    backend_class = functools.partial(MySQLBackend, compact=True)
    return _mysql("mysqlclient-compact", mysqlclient_dsn(dsn), job_table, archived_job_table, backend_class)


def mysqlclient_chain(
    dsn: str | None = None,
    job_table: str = DEFAULT_JOB_TABLE,
    archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE,
) -> SqlHarness:
    """mysql_chain on mysqlclient, whose connections take multi-statement queries unless told not to."""
    from proletarian_ref.backends.mysql import MySQLBackend

    backend_class = functools.partial(MySQLBackend, compact=True, chain=True)
    return _mysql("mysqlclient-chain", mysqlclient_dsn(dsn), job_table, archived_job_table, backend_class)


def mysqlclient_dsn(dsn: str | None = None) -> str:
    """The DSN mysql() would connect to (`dsn`, else the environment's, else the local server), naming
    mysqlclient as its driver (mysql+mysqlclient://)."""
    target = dsn or os.environ.get(MYSQL_ENV) or DEFAULT_MYSQL_DSN
    return "mysql+mysqlclient" + target[target.index(":") :]


def _mysql_multi_statements(
    name: str, dsn: str | None, job_table: str, archived_job_table: str, **backend_options: bool
) -> SqlHarness:
    """MySQLBackend(**backend_options) on connections opened with CLIENT.MULTI_STATEMENTS, which the compact
    and chained plans need on the backend's own."""
    from pymysql.constants import CLIENT

    from proletarian_ref.backends.mysql import MySQLBackend

    backend_class = functools.partial(MySQLBackend, **backend_options)
    return _mysql(
        name, dsn, job_table, archived_job_table, backend_class, client_flag=CLIENT.MULTI_STATEMENTS
    )


def _mysql(
    name: str,
    dsn: str | None,
    job_table: str,
    archived_job_table: str,
    backend_class: Callable[[Callable[[], Any]], Backend],
    **connect_options: Any,
) -> SqlHarness:
    from proletarian_ref.backends.dsn import connection_factory

    target = dsn or os.environ.get(MYSQL_ENV) or DEFAULT_MYSQL_DSN
    return SqlHarness(
        name,
        dialect="mysql",
        connect=connection_factory(target, **connect_options),
        backend_class=backend_class,
        job_table=job_table,
        archived_job_table=archived_job_table,
    )


def memory(
    job_table: str = DEFAULT_JOB_TABLE, archived_job_table: str = DEFAULT_ARCHIVED_JOB_TABLE, **_: Any
) -> MemoryHarness:
    """The in-memory backend (one process only)."""
    return MemoryHarness(job_table, archived_job_table)
