"""`proletarian-ref schema print|install` on PostgreSQL and MySQL, with custom table names."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import drop_tables, dsn_for, harness_for, isolate, parametrize_dialects, run

from conformance.harness import SqlHarness
from proletarian_ref.cli import ExitCode
from proletarian_ref.ops.stats import schema_lock
from proletarian_ref.schema import schema_statements


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
    assert "schema installed" in first.err
    fresh.execute(
        f"INSERT INTO {fresh.job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, "
        "process_at) VALUES (%s, ':q', ':t', '[]', 0, '2030-01-01 00:00:00', '2030-01-01 00:00:00')",
        (b"0123456789abcdef" if fresh.dialect == "mysql" else "00000000-0000-4000-8000-000000000001",),
    )
    second = run(capsys, *argv)
    assert second.code == ExitCode.OK, second.err
    assert len(fresh.jobs()) == 1, "running install again must keep the rows"
    assert fresh.archived_jobs() == []


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
