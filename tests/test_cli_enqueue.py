"""`proletarian-ref enqueue`: what it stores, what it prints, and the errors a person can act on."""

from __future__ import annotations

import io
import json
import shlex
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cli_support import Target, isolate, parametrize_dialects, run, table_names, target

from proletarian_ref.backend import Notifications
from proletarian_ref.cli import ExitCode
from proletarian_ref.job_ids import mysql_uuid_strategy
from proletarian_ref.serializers import create_serializer
from proletarian_ref.tables import table_name

pytest_generate_tests = parametrize_dialects


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "enqueue")


def _stored_id(database: Target, printed: str) -> object:
    job_id = uuid.UUID(printed.strip())
    return mysql_uuid_strategy().encode_id(job_id) if database.dialect == "mysql" else job_id


def test_enqueue_prints_the_id_of_the_job_it_stored(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(
        capsys, "enqueue", "my.app/send-email", '{"email": "a@example.com", "tags": [1, 2]}', *database.args
    )
    assert result.code == ExitCode.OK, result.err
    [job] = database.jobs()
    assert job.job_id == _stored_id(database, result.out)
    assert (job.queue, job.job_type, job.attempts) == (":proletarian/default", ":my.app/send-email", 0)
    # Object keys are written as keywords, as Proletarian's Transit serializer writes a Clojure map.
    assert job.payload == '["^ ","~:email","a@example.com","~:tags",[1,2]]'
    assert create_serializer().decode(job.payload) == {"email": "a@example.com", "tags": [1, 2]}


def test_enqueue_uses_the_queue_given(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    result = run(capsys, "enqueue", ":my.app/job", "[]", "--queue", "my.app/mail", *database.args)
    assert result.code == ExitCode.OK, result.err
    [job] = database.jobs()
    assert (job.queue, job.job_type) == (":my.app/mail", ":my.app/job")


def test_notify_announces_the_job_on_postgresql_and_is_accepted_elsewhere(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    backend = database.harness.backend()
    listener = (
        backend.listen(table_name(database.job_table), ":proletarian/default")
        if isinstance(backend, Notifications)
        else None
    )
    try:
        result = run(capsys, "enqueue", "my.app/job", "[]", "--notify", *database.args)
        assert result.code == ExitCode.OK, result.err
        assert len(database.jobs()) == 1
        if listener is not None:
            assert listener.wait(5.0) is True
    finally:
        if listener is not None:
            listener.close()
    assert (database.dialect == "postgresql") == (listener is not None)


def test_process_in_schedules_the_job_later(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    before = datetime.now(UTC)
    result = run(capsys, "enqueue", "a/b", "null", "--process-in", "3600", *database.args)
    assert result.code == ExitCode.OK, result.err
    [job] = database.jobs()
    assert timedelta(minutes=59) < job.process_at - before < timedelta(minutes=61)


def test_process_at_takes_an_iso_time_with_an_offset(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(capsys, "enqueue", "a/b", "{}", "--process-at", "2031-05-06T09:08:07+02:00", *database.args)
    assert result.code == ExitCode.OK, result.err
    [job] = database.jobs()
    assert job.process_at == datetime(2031, 5, 6, 7, 8, 7, tzinfo=UTC)


def test_payload_dash_is_read_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, database: Target
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO('{"from": "stdin"}'))
    result = run(capsys, "enqueue", "a/b", "-", *database.args)
    assert result.code == ExitCode.OK, result.err
    [job] = database.jobs()
    assert create_serializer().decode(job.payload) == {"from": "stdin"}


def test_the_dsn_can_come_from_proletarian_dsn(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, database: Target
) -> None:
    monkeypatch.setenv("PROLETARIAN_DSN", database.dsn)
    result = run(capsys, "enqueue", "a/b", "1", *database.tables)
    assert result.code == ExitCode.OK, result.err
    assert len(database.jobs()) == 1


def test_a_payload_that_is_not_json_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(capsys, "enqueue", "a/b", "{email: a}", *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert "PAYLOAD_JSON is not JSON" in result.err
    assert database.jobs() == []


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["has space/x", "{}"], "JOB_TYPE"),
        (["::auto/x", "{}"], "JOB_TYPE"),
        (["a/b", "{}", "--queue", "q[1]"], "--queue"),
    ],
)
def test_an_invalid_keyword_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target, argv: list[str], named: str
) -> None:
    result = run(capsys, "enqueue", *argv, *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert f"invalid {named}" in result.err
    assert database.jobs() == []


def test_a_time_without_offset_is_a_usage_error(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    result = run(capsys, "enqueue", "a/b", "{}", "--process-at", "2031-05-06T09:08:07", *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert "no UTC offset" in result.err


def test_process_in_and_process_at_exclude_each_other(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(
        capsys,
        "enqueue",
        "a/b",
        "{}",
        "--process-in",
        "1",
        "--process-at",
        "2031-01-01T00:00:00Z",
        *database.args,
    )
    assert result.code == ExitCode.USAGE_ERROR


def test_a_missing_job_table_exits_4_with_the_install_command(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    job, archived = table_names("absent")
    result = run(
        capsys,
        "enqueue",
        "a/b",
        "{}",
        "--dsn",
        database.dsn,
        "--job-table",
        job,
        "--archived-job-table",
        archived,
    )
    assert result.code == ExitCode.SCHEMA_MISSING
    assert f"{job} and {archived} do not exist" in result.err
    command = f"proletarian-ref schema install --dsn {shlex.quote(database.dsn)}"
    assert f"{command} --job-table {job} --archived-job-table {archived}" in result.err


def test_a_dsn_that_cannot_connect_exits_3_with_the_password_hidden(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    scheme = "postgresql" if database.dialect == "postgresql" else "mysql"
    dsn = f"{scheme}://someone:pa55word@127.0.0.1:1/test"
    result = run(capsys, "enqueue", "a/b", "{}", "--dsn", dsn, *database.tables)
    assert result.code == ExitCode.CANNOT_CONNECT
    assert f"cannot connect to {scheme}://someone:***@127.0.0.1:1/test (--dsn)" in result.err
    assert "pa55word" not in result.err


def test_a_dsn_of_an_unknown_database_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "enqueue", "a/b", "{}", "--dsn", "oracle://scott:tiger@db/orcl")
    assert result.code == ExitCode.USAGE_ERROR
    assert "postgresql:// or mysql://" in result.err
    assert "tiger" not in result.err


JOB_LINES = (
    '{"job_type": "my.app/send-email", "payload": {"email": "a@example.com"}}\n'
    "\n"
    '{"job_type": ":my.app/job", "payload": [1, 2], "queue": "my.app/mail", "process_in": 3600}\n'
    '{"job_type": "a/b", "payload": null, "process_at": "2031-05-06T09:08:07+02:00"}\n'
)


def test_from_a_file_enqueues_one_job_a_line_and_prints_the_ids_in_order(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    source = tmp_path / "jobs.jsonl"
    source.write_text(JOB_LINES, encoding="utf-8")
    before = datetime.now(UTC)
    result = run(capsys, "enqueue", "--from", str(source), "--batch-size", "2", *database.args)
    assert result.code == ExitCode.OK, result.err
    assert "3 jobs enqueued" in result.err
    by_id = {job.job_id: job for job in database.jobs()}
    jobs = [by_id[_stored_id(database, line)] for line in result.out.splitlines()]
    assert [(job.queue, job.job_type) for job in jobs] == [
        (":proletarian/default", ":my.app/send-email"),
        (":my.app/mail", ":my.app/job"),
        (":proletarian/default", ":a/b"),
    ]
    assert jobs[0].payload == '["^ ","~:email","a@example.com"]'
    assert timedelta(minutes=59) < jobs[1].process_at - before < timedelta(minutes=61)
    assert jobs[2].process_at == datetime(2031, 5, 6, 7, 8, 7, tzinfo=UTC)


def test_from_stdin_with_json_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, database: Target
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(JOB_LINES))
    result = run(capsys, "enqueue", "--from", "-", "--queue", "bulk", "--json", *database.args)
    assert result.code == ExitCode.OK, result.err
    printed = json.loads(result.out)
    assert printed["count"] == 3 and len(printed["job_ids"]) == 3
    assert sorted(job.queue for job in database.jobs()) == [":bulk", ":bulk", ":my.app/mail"]


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "not JSON"),
        ('["a/b", 1]', "expected a JSON object"),
        ('{"job_type": "a/b"}', "no 'payload'"),
        ('{"job_type": "has space", "payload": 1}', "invalid job_type"),
        ('{"job_type": "a/b", "payload": 1, "when": 3}', "unknown key 'when'"),
        ('{"job_type": "a/b", "payload": 1, "process_at": "2031-01-01T00:00:00"}', "no UTC offset"),
        ('{"job_type": "a/b", "payload": 1, "process_in": "soon"}', "number of seconds"),
    ],
)
def test_a_bad_line_from_stdin_is_a_usage_error_naming_it_and_nothing_is_written(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    database: Target,
    bad_line: str,
    message: str,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(JOB_LINES + bad_line + "\n"))
    result = run(capsys, "enqueue", "--from", "-", *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert "stdin line 5: " in result.err and message in result.err
    assert result.out == ""
    assert database.jobs() == []


def test_a_payload_too_large_for_mysql_in_a_later_batch_writes_nothing_and_names_its_line(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    source = tmp_path / "jobs.jsonl"
    big = json.dumps({"job_type": "a/b", "payload": "x" * 70_000})
    source.write_text(JOB_LINES + big + "\n", encoding="utf-8")
    result = run(capsys, "enqueue", "--from", str(source), "--batch-size", "1", *database.args)
    if database.dialect == "postgresql":  # TEXT holds it
        assert result.code == ExitCode.OK, result.err
        assert len(database.jobs()) == 4
        return
    assert result.code == ExitCode.USAGE_ERROR
    assert f"{source} line 5: payload is 70010 bytes" in result.err
    assert database.jobs() == []  # the first three batches were in the same, uncommitted, transaction


def test_from_with_a_job_type_is_a_usage_error(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    result = run(capsys, "enqueue", "a/b", "1", "--from", "-", *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert "--from takes no JOB_TYPE" in result.err


def test_a_missing_from_file_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    result = run(capsys, "enqueue", "--from", str(tmp_path / "absent.jsonl"), *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert "cannot read --from" in result.err
