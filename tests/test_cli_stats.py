"""`proletarian-ref stats`: due, scheduled, oldest due age and archived jobs per queue; table and JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from cli_support import Target, isolate, parametrize_dialects, run, table_names, target

from proletarian_ref.cli import ExitCode
from proletarian_ref.ops.durations import format_duration as format_age

pytest_generate_tests = parametrize_dialects


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "stats")


def _insert(database: Target, n: int, queue: str, *, due_seconds_ago: int) -> None:
    job_id = f"00000000-0000-4000-8000-{n:012d}"
    id_param: object = bytes.fromhex(job_id.replace("-", "")) if database.dialect == "mysql" else job_id
    when = (
        f"NOW() - INTERVAL {due_seconds_ago} SECOND"
        if database.dialect == "mysql"
        else f"NOW() - INTERVAL '{due_seconds_ago} seconds'"
    )
    database.harness.execute(
        f"INSERT INTO {database.job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, "
        f"process_at) VALUES (%s, %s, ':t', '[]', 0, {when}, {when})",
        (id_param, queue),
    )


def _archive(database: Target, n: int, queue: str, status: str) -> None:
    job_id = f"00000000-0000-4000-9000-{n:012d}"
    id_param: object = bytes.fromhex(job_id.replace("-", "")) if database.dialect == "mysql" else job_id
    database.harness.execute(
        f"INSERT INTO {database.archived_job_table} (job_id, queue, job_type, payload, attempts, status, "
        "enqueued_at, process_at, finished_at) VALUES (%s, %s, ':t', '[]', 1, %s, NOW(), NOW(), NOW())",
        (id_param, queue, status),
    )


@pytest.fixture
def populated(database: Target, capsys: pytest.CaptureFixture[str]) -> Target:
    # Through the CLI: two jobs due now on the default queue, one scheduled in an hour.
    for argv in (["a/b", "{}"], ["a/b", "{}"], ["a/b", "{}", "--process-in", "3600"]):
        assert run(capsys, "enqueue", *argv, *database.args).code == ExitCode.OK
    # By hand, so the ages are known: a mail queue whose oldest due job is about two minutes old.
    _insert(database, 1, ":my.app/mail", due_seconds_ago=120)
    _insert(database, 2, ":my.app/mail", due_seconds_ago=5)
    for n, status in enumerate([":success", ":success", ":failure"]):
        _archive(database, n, ":my.app/mail", status)
    _archive(database, 9, ":only/archived", ":success")
    return database


def test_json_counts_due_scheduled_and_archived_jobs_per_queue(
    capsys: pytest.CaptureFixture[str], populated: Target
) -> None:
    result = run(capsys, "stats", "--json", *populated.args)
    assert result.code == ExitCode.OK, result.err
    stats = json.loads(result.out)
    assert (stats["job_table"], stats["archived_job_table"]) == (
        populated.job_table,
        populated.archived_job_table,
    )
    queues = {q["queue"]: q for q in stats["queues"]}
    assert sorted(queues) == ["my.app/mail", "only/archived", "proletarian/default"]
    default, mail, archived_only = (
        queues["proletarian/default"],
        queues["my.app/mail"],
        queues["only/archived"],
    )
    assert (default["due"], default["scheduled"], default["archived"]) == (2, 1, {})
    assert 0 <= default["oldest_due_age_seconds"] < 60
    assert (mail["due"], mail["scheduled"]) == (2, 0)
    assert 110 <= mail["oldest_due_age_seconds"] < 200
    assert mail["archived"] == {"success": 2, "failure": 1}
    assert archived_only == {
        "queue": "only/archived",
        "due": 0,
        "running": 0,
        "scheduled": 0,
        "oldest_due_age_seconds": None,
        "archived": {"success": 1},
    }
    assert stats["archived"] == {"failure": 1, "success": 3}


def test_table_shows_readable_queue_names_and_ages(
    capsys: pytest.CaptureFixture[str], populated: Target
) -> None:
    result = run(capsys, "stats", *populated.args)
    assert result.code == ExitCode.OK, result.err
    lines = result.out.splitlines()
    assert lines[1].split() == ["QUEUE", "DUE", "RUNNING", "SCHEDULED", "OLDEST", "DUE", "SUCCESS", "FAILURE"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["proletarian/default"][:3] == ["2", "0", "1"]
    assert rows["my.app/mail"][0:3] == ["2", "0", "0"]
    assert rows["my.app/mail"][3] in ("2m", "3m")
    assert rows["my.app/mail"][-2:] == ["2", "1"]
    assert rows["only/archived"] == ["0", "0", "0", "-", "1", "0"]
    assert ":" not in " ".join(rows)


def test_empty_tables_say_so(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    result = run(capsys, "stats", *database.args)
    assert result.code == ExitCode.OK, result.err
    assert "no jobs, queued or archived" in result.out
    as_json = json.loads(run(capsys, "stats", "--json", *database.args).out)
    assert (as_json["queues"], as_json["archived"]) == ([], {})


def test_missing_tables_exit_4(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    job, archived = table_names("absent")
    result = run(capsys, "stats", "--dsn", database.dsn, "--job-table", job, "--archived-job-table", archived)
    assert result.code == ExitCode.SCHEMA_MISSING
    assert "schema install" in result.err


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.25, "0.2s"), (59.9, "59.9s"), (61, "1m 01s"), (3600 * 2 + 180, "2h 03m"), (86400 + 7200, "1d 02h")],
)
def test_ages_are_shown_in_the_largest_sensible_unit(seconds: float, shown: str) -> None:
    assert format_age(timedelta(seconds=seconds)) == shown
