"""`proletarian-ref schema print|install` on PostgreSQL and MySQL, with custom table names."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cli_support import drop_tables, dsn_for, harness_for, isolate, parametrize_dialects, run
from fix_db import table_suffix

from conformance import builtin
from conformance.harness import SqlHarness
from proletarian_ref.cli import ExitCode
from proletarian_ref.cli.database import Tables
from proletarian_ref.cli.schema import installed_message
from proletarian_ref.ops.stats import TableLocation, schema_lock
from proletarian_ref.schema import schema_statements
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, table_name


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


pytest_generate_tests = parametrize_dialects


@pytest.fixture
def fresh(request: pytest.FixtureRequest) -> Iterator[SqlHarness]:
    """Table names that do not exist yet; dropped again afterwards."""
    dialect = str(request.param)
    harness = harness_for(dialect, dsn_for(request, dialect), "install")
    drop_tables(harness)
    try:
        yield harness
    finally:
        drop_tables(harness)
        harness.close()


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_print_shows_the_dialects_ddl_with_custom_table_names(
    capsys: pytest.CaptureFixture[str], dialect: str
) -> None:
    result = run(capsys, "schema", "print", "--dialect", dialect, "--job-table", "app.jobs_cli")
    assert result.code == ExitCode.OK
    for statement in schema_statements(dialect, job_table="app.jobs_cli"):
        assert statement + ";" in result.out
    assert "app.jobs_cli" in result.out
    assert "proletarian.job " not in result.out


def test_print_without_dsn_or_dialect_is_postgresql(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "schema", "print")
    assert result.code == ExitCode.OK
    assert "UUID PRIMARY KEY" in result.out
    assert "CREATE SCHEMA IF NOT EXISTS proletarian" in result.out


def test_print_takes_the_dialect_from_the_dsn(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROLETARIAN_DSN", "mysql://nobody@127.0.0.1:1/none")
    result = run(capsys, "schema", "print")
    assert result.code == ExitCode.OK
    assert "BINARY(16)" in result.out


def test_print_refuses_an_invalid_table_name(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "schema", "print", "--job-table", "jobs; DROP TABLE x")
    assert result.code == ExitCode.USAGE_ERROR
    assert "--job-table" in result.err


def test_install_creates_both_tables_and_is_idempotent(
    capsys: pytest.CaptureFixture[str], fresh: SqlHarness, request: pytest.FixtureRequest
) -> None:
    argv = [
        "schema",
        "install",
        "--dsn",
        dsn_for(request, fresh.dialect),
        "--job-table",
        fresh.job_table,
        "--archived-job-table",
        fresh.archived_job_table,
    ]
    first = run(capsys, *argv)
    assert first.code == ExitCode.OK, first.err
    # Unqualified names go where the DSN's session puts them: its database's `public` schema on
    # PostgreSQL, the DSN's database itself on MySQL; the message names them qualified.
    dsn_database = urlsplit(dsn_for(request, fresh.dialect)).path.lstrip("/")
    home = "public" if fresh.dialect == "postgresql" else dsn_database
    assert f"installed {home}.{fresh.job_table} and {home}.{fresh.archived_job_table} " in first.err
    fresh.execute(
        f"INSERT INTO {fresh.job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, "
        "process_at) VALUES (%s, ':q', ':t', '[]', 0, '2030-01-01 00:00:00', '2030-01-01 00:00:00')",
        (b"0123456789abcdef" if fresh.dialect == "mysql" else "00000000-0000-4000-8000-000000000001",),
    )
    second = run(capsys, *argv)
    assert second.code == ExitCode.OK, second.err
    assert "installed" not in second.err
    assert (
        f"{home}.{fresh.job_table} and {home}.{fresh.archived_job_table} already existed: nothing created, "
        "their rows kept"
    ) in second.err
    assert len(fresh.jobs()) == 1, "running install again must keep the rows"
    assert fresh.archived_jobs() == []


@pytest.fixture
def elsewhere(fresh: SqlHarness, request: pytest.FixtureRequest) -> Iterator[SqlHarness]:
    """Tables qualified with a schema (PostgreSQL) or database (MySQL) the DSN does not name."""
    dialect = fresh.dialect
    place = f"cli_{table_suffix()}_elsewhere"
    factory = builtin.postgresql if dialect == "postgresql" else builtin.mysql
    harness = factory(dsn_for(request, dialect), f"{place}.job", f"{place}.archived_job")
    drop = f"DROP {'SCHEMA' if dialect == 'postgresql' else 'DATABASE'} IF EXISTS {place}"
    drop += " CASCADE" if dialect == "postgresql" else ""
    harness.execute(drop)
    try:
        yield harness
    finally:
        harness.execute(drop)
        harness.close()


def test_install_names_the_schema_or_database_the_tables_really_went_to(
    capsys: pytest.CaptureFixture[str], elsewhere: SqlHarness, request: pytest.FixtureRequest
) -> None:
    dsn = dsn_for(request, elsewhere.dialect)
    place = elsewhere.job_table.split(".")[0]
    argv = ["schema", "install", "--dsn", dsn, "--job-table", elsewhere.job_table]
    result = run(capsys, *argv, "--archived-job-table", elsewhere.archived_job_table)
    assert result.code == ExitCode.OK, result.err
    dsn_database = urlsplit(dsn).path.lstrip("/")
    installed = f"installed {place}.job and {place}.archived_job"
    if elsewhere.dialect == "mysql":
        where = f"(database `{place}`; your DSN's database is `{dsn_database}`)"
    else:
        where = f"(schema `{place}` of database `{dsn_database}`)"
    assert f"proletarian-ref: {installed} {where} on " in result.err
    assert elsewhere.jobs() == [], "the job table is where the message says"


def test_the_default_tables_on_mysql_are_reported_in_the_database_proletarian() -> None:
    # The seed's DDL qualifies the tables, so MySQL puts them in the database `proletarian` whatever
    # database the DSN names; the message must not let the DSN suggest otherwise.
    tables = Tables(table_name(DEFAULT_JOB_TABLE), table_name(DEFAULT_ARCHIVED_JOB_TABLE))
    located: list[TableLocation | None] = [TableLocation("proletarian", None, "test")] * 2
    assert installed_message(tables, located) == (
        "installed proletarian.job and proletarian.archived_job "
        "(database `proletarian`; your DSN's database is `test`)"
    )


def test_install_on_a_dsn_that_does_not_connect_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "schema", "install", "--dsn", "postgresql://someone:s3cret@127.0.0.1:1/nothing")
    assert result.code == ExitCode.CANNOT_CONNECT
    assert "postgresql://someone:***@127.0.0.1:1/nothing" in result.err
    assert "s3cret" not in result.err


def test_the_schema_lock_lets_one_session_install_at_a_time(fresh: SqlHarness) -> None:
    first, second = fresh.connect(), fresh.connect()
    acquired_at: list[float] = []

    def take_it_too() -> None:
        with schema_lock(second, dialect=fresh.dialect):
            acquired_at.append(time.monotonic())

    try:
        with schema_lock(first, dialect=fresh.dialect):
            contender = threading.Thread(target=take_it_too, daemon=True)
            contender.start()
            time.sleep(0.5)
            released_at = time.monotonic()
            assert acquired_at == [], "a second session got the lock while the first held it"
        contender.join(timeout=30)
        assert len(acquired_at) == 1
        assert acquired_at[0] >= released_at
    finally:
        first.close()
        second.close()
