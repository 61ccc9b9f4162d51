"""`proletarian-ref demo` on PostgreSQL and MySQL: the summary it prints is what the archive holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import (
    Target,
    expected_numbers,
    isolate,
    parametrize_dialects,
    run,
    summary_numbers,
    table_names,
    target,
)

from proletarian_ref.cli import ExitCode

pytest_generate_tests = parametrize_dialects


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "demo")


def test_the_plan_has_failures_retries_and_successes() -> None:
    numbers = expected_numbers(40)
    assert numbers["failed"] > 0
    assert numbers["retried"] > numbers["failed"]
    assert numbers["succeeded"] > numbers["retried"]


def test_demo_processes_every_job_and_sums_up_from_the_archive(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(capsys, "demo", "--jobs", "30", "--threads", "3", *database.args)
    assert result.code == ExitCode.OK, result.err
    assert summary_numbers(result.out) == expected_numbers(30)
    assert "jobs/s" in result.out
    archived = database.archived_jobs()
    assert len(archived) == 30
    assert sum(1 for a in archived if a.status == ":failure") == expected_numbers(30)["failed"]
    assert database.jobs() == []


def test_demo_counts_only_its_own_run(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    assert run(capsys, "demo", "--jobs", "5", *database.args).code == ExitCode.OK
    second = run(capsys, "demo", "--jobs", "7", *database.args)
    assert second.code == ExitCode.OK, second.err
    assert summary_numbers(second.out)["processed"] == 7


def test_demo_with_missing_tables_exits_4(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    job, archived = table_names("absent")
    result = run(capsys, "demo", "--dsn", database.dsn, "--job-table", job, "--archived-job-table", archived)
    assert result.code == ExitCode.SCHEMA_MISSING


@pytest.mark.parametrize("argv", [["--jobs", "0"], ["--threads", "many"], ["--timeout", "-1"]])
def test_demo_refuses_out_of_range_options(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    result = run(capsys, "demo", *argv)
    assert result.code == ExitCode.USAGE_ERROR
