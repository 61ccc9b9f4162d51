"""The list, show, retry, cancel, reschedule, purge and health commands on PostgreSQL and MySQL, and the
CLI's clear errors for bad input."""

from __future__ import annotations

import io
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import (
    Target,
    copy_to_job_table,
    fail_next,
    isolate,
    parametrize_dialects,
    run,
    target,
)
from fix_throwaway import free_port

from proletarian_ref.cli import ExitCode, build_parser
from proletarian_ref.cli.env import apply_env_defaults
from proletarian_ref.ops.durations import parse_duration
from proletarian_ref.ops.jobs import jsonable

pytest_generate_tests = parametrize_dialects


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "ops")


def _enqueue(capsys: pytest.CaptureFixture[str], database: Target, *argv: str) -> str:
    result = run(capsys, "enqueue", *argv, *database.args)
    assert result.code == ExitCode.OK, result.err
    return result.out.strip()


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    result = run(capsys, *argv, "--json")
    assert result.code == ExitCode.OK, result.err
    return json.loads(result.out)


def test_list_filters_and_pages_with_the_printed_cursor(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    ids = [_enqueue(capsys, database, "a/t", f'{{"n": {n}}}', "--process-in", str(n)) for n in range(5)]
    _enqueue(capsys, database, "b/t", "{}", "--queue", "other/q")
    first = _json(capsys, "list", "--queue", "proletarian/default", "--limit", "3", *database.args)
    assert [j["job_id"] for j in first["jobs"]] == ids[:3]
    second = _json(
        capsys, "list", "--queue", "proletarian/default", "--after", first["next_cursor"], *database.args
    )
    assert ([j["job_id"] for j in second["jobs"]], second["next_cursor"]) == (ids[3:], None)
    [other] = _json(capsys, "list", "--job-type", "b/t", *database.args)["jobs"]
    assert (other["queue"], other["state"], other["attempts"]) == ("other/q", "due", 0)
    text = run(capsys, "list", "--limit", "2", *database.args)
    assert text.code == ExitCode.OK and ids[0] in text.out and "--after " in text.err


def test_show_prints_the_payload_a_handler_gets(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    job_id = _enqueue(capsys, database, "a/t", '{"email": "a@b", "n": [1, 2]}')
    shown = _json(capsys, "show", job_id, *database.args)
    assert shown["payload"] == {"email": "a@b", "n": [1, 2]}
    assert shown["payload_transit"] == '["^ ","~:email","a@b","~:n",[1,2]]'
    missing = run(capsys, "show", "00000000-0000-4000-8000-000000000000", *database.args)
    assert missing.code == ExitCode.RUNTIME_ERROR and "no job" in missing.err


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "not-an-id"],
        ["list", "--older-than", "soon"],
        ["list", "--queue", "has space"],
        ["list", "--after", "garbage"],
        ["cancel", "12x"],
        ["purge", "--older-than", "-3d"],
        ["reschedule", "--all"],
    ],
)
def test_bad_input_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target, argv: list[str]
) -> None:
    result = run(capsys, *argv, *database.args)
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert "error" in result.err


def test_a_whole_number_id_is_a_usage_error_where_ids_are_uuids(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(capsys, "cancel", "123", "--yes", *database.args)
    if database.dialect == "postgresql":
        assert result.code == ExitCode.USAGE_ERROR and "holds UUIDs" in result.err
    else:
        # BINARY(16) compares with a number without complaint: the job is simply not there.
        assert result.code == ExitCode.RUNTIME_ERROR and result.out.startswith("123 not-found: in neither")


def test_a_dsn_of_no_known_database_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "list", "--dsn", "oracle://db/x")
    assert result.code == ExitCode.USAGE_ERROR, result.err


def test_retry_by_id_moves_the_failure_back_and_bulk_retry_needs_yes_off_a_terminal(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    ids = [_enqueue(capsys, database, "a/t", f'{{"n": {n}}}') for n in range(3)]
    for _ in ids:
        fail_next(database)
    one = run(capsys, "retry", ids[0], *database.args)
    assert one.code == ExitCode.OK, one.err
    assert one.out == f"{ids[0]} retried\n"
    assert [j["job_id"] for j in _json(capsys, "list", *database.args)["jobs"]] == [ids[0]]
    refused = run(capsys, "retry", "--all", *database.args)
    assert refused.code == ExitCode.USAGE_ERROR and "--yes" in refused.err
    dry = run(capsys, "retry", "--all", "--dry-run", *database.args)
    assert dry.code == ExitCode.OK and "retry 2 failure job(s)" in dry.err
    assert len(database.archived_jobs()) == 2
    bulk = _json(capsys, "retry", "--all", "--yes", *database.args)
    assert bulk["counts"] == {"retried": 2}
    assert (len(database.jobs()), database.archived_jobs()) == (3, [])
    again = run(capsys, "retry", ids[1], *database.args)
    assert (again.code, again.out) == (
        ExitCode.RUNTIME_ERROR,
        f"{ids[1]} queued: still queued, not archived\n",
    )


def test_cancel_archives_as_cancelled_and_reports_a_running_job(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    free = _enqueue(capsys, database, "a/t", "{}")
    busy = _enqueue(capsys, database, "a/t", '{"busy": true}')
    holder = database.harness.connect()
    stored: object = bytes.fromhex(busy.replace("-", "")) if database.dialect == "mysql" else busy
    cursor = holder.cursor()
    cursor.execute(f"SELECT job_id FROM {database.job_table} WHERE job_id = %s FOR UPDATE", (stored,))
    try:
        result = run(capsys, "cancel", free, busy, "--yes", *database.args)
    finally:
        holder.rollback()
        holder.close()
    assert result.code == ExitCode.RUNTIME_ERROR
    assert result.out == f"{free} cancelled\n{busy} running\n"
    [archived] = database.archived_jobs()
    assert (archived.status, archived.attempts) == (":cancelled", 0)
    listed = _json(capsys, "list", "--status", "cancelled", *database.args)
    assert [j["job_id"] for j in listed["jobs"]] == [free]


def test_reschedule_by_filter_moves_only_the_matching_jobs(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    mail = _enqueue(capsys, database, "a/mail", "{}")
    _enqueue(capsys, database, "a/other", "{}")
    result = _json(
        capsys, "reschedule", "--job-type", "a/mail", "--process-in", "3600", "--yes", *database.args
    )
    assert result["results"] == [{"job_id": mail, "outcome": "rescheduled"}]
    states = {j["job_type"]: j["state"] for j in _json(capsys, "list", *database.args)["jobs"]}
    assert states == {"a/mail": "scheduled", "a/other": "due"}


def test_purge_deletes_old_archived_rows_with_progress(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    for n in range(3):
        _enqueue(capsys, database, "a/t", f'{{"n": {n}}}')
        fail_next(database)
    assert run(capsys, "purge", "--older-than", "1h", "--yes", *database.args).out == "0\n"
    database.harness.execute(
        f"UPDATE {database.archived_job_table} SET finished_at = {_two_hours_ago(database)}"
    )
    result = run(capsys, "purge", "--older-than", "1h", "--batch-size", "2", "--yes", *database.args)
    assert (result.code, result.out) == (ExitCode.OK, "3\n")
    assert "deleted 2 of 3" in result.err and "deleted 3 of 3" in result.err
    assert database.archived_jobs() == []


def test_health_exit_codes_tell_a_probe_what_is_wrong(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    healthy = _json(capsys, "health", *database.args)
    assert healthy["healthy"] is True
    _enqueue(capsys, database, "a/t", "{}", "--queue", "slow/q")
    _make_due_two_hours_ago(database, ":slow/q")
    lagging = run(capsys, "health", "--max-lag", "60s", "--json", *database.args)
    assert lagging.code == ExitCode.QUEUE_LAGGING
    assert json.loads(lagging.out)["checks"][2]["lag_seconds"]["slow/q"] >= 3600
    holder = database.harness.connect()
    cursor = holder.cursor()
    cursor.execute(
        f"SELECT job_id FROM {database.job_table} WHERE queue = ':slow/q' LIMIT 1 FOR UPDATE SKIP LOCKED"
    )
    try:
        # MySQL reports transaction ages in whole seconds: over 2 s real is over 1 s there too.
        time.sleep(2.1)
        stuck = run(capsys, "health", "--max-lag", "3h", "--max-claim", "1s", *database.args)
    finally:
        holder.rollback()
        holder.close()
    assert stuck.code == ExitCode.CLAIM_HELD_TOO_LONG, stuck.out
    assert "FAIL claims" in stuck.out
    missing = run(capsys, "health", "--dsn", database.dsn, "--job-table", "no_such_job")
    assert missing.code == ExitCode.SCHEMA_MISSING
    down = (
        "postgresql://postgres@127.0.0.1:1/test"
        if database.dialect == "postgresql"
        else "mysql://root@127.0.0.1:1/test"
    )
    unreachable = run(capsys, "health", "--dsn", down)
    assert unreachable.code == ExitCode.CANNOT_CONNECT


def _two_hours_ago(database: Target) -> str:
    return "NOW() - INTERVAL 2 HOUR" if database.dialect == "mysql" else "NOW() - INTERVAL '2 hours'"


def _make_due_two_hours_ago(database: Target, queue: str) -> None:
    database.harness.execute(
        f"UPDATE {database.job_table} SET process_at = {_two_hours_ago(database)} WHERE queue = %s", (queue,)
    )


def test_every_option_can_come_from_a_proletarian_variable(
    capsys: pytest.CaptureFixture[str], database: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _enqueue(capsys, database, "a/t", "{}")
    monkeypatch.setenv("PROLETARIAN_DSN", database.dsn)
    monkeypatch.setenv("PROLETARIAN_JOB_TABLE", database.job_table)
    monkeypatch.setenv("PROLETARIAN_ARCHIVED_JOB_TABLE", database.archived_job_table)
    monkeypatch.setenv("PROLETARIAN_JSON", "true")
    result = run(capsys, "list")
    assert result.code == ExitCode.OK, result.err
    assert [j["job_id"] for j in json.loads(result.out)["jobs"]] == [job_id]
    monkeypatch.setenv("PROLETARIAN_LIMIT", "zero")
    bad = run(capsys, "list")
    assert bad.code == ExitCode.USAGE_ERROR and "PROLETARIAN_LIMIT" in bad.err


def test_json_log_format_writes_one_object_a_line(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(capsys, "cancel", "--all", "--yes", "--log-format", "json", *database.args)
    assert result.code == ExitCode.OK
    lines = [json.loads(line) for line in result.err.splitlines()]
    assert lines and all(line["event"] == "proletarian-ref.cli/notice" for line in lines)


def test_a_repeated_option_on_the_command_line_replaces_its_variable_rather_than_adding_to_it() -> None:
    environ = {"PROLETARIAN_QUEUE": "a/q,b/q", "PROLETARIAN_HANDLER": "app.jobs:handle"}
    for argv, queues in ((["worker"], ["a/q", "b/q"]), (["worker", "--queue", "c/q"], ["c/q"])):
        parser = build_parser()
        apply_env_defaults(parser, argv, environ)
        args = parser.parse_args(argv)
        assert (args.queue, args.handler) == (queues, "app.jobs:handle")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("1h30m", 5400), ("7d", 604800), ("250ms", 0.25)],
)
def test_durations_read_as_people_write_them(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


def test_retry_reports_each_job_and_a_conflict_as_its_own_line(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    ids = []
    for n in range(3):
        ids.append(_enqueue(capsys, database, "a/t", f'{{"n": {n}}}'))
        fail_next(database)
    copy_to_job_table(database, str(ids[1]))
    result = run(capsys, "retry", *ids, *database.args)
    assert result.code == ExitCode.RUNTIME_ERROR
    lines = result.out.splitlines()
    assert [line.split()[:2] for line in lines] == [
        [ids[0], "retried"],
        [ids[1], "conflict:"],
        [ids[2], "retried"],
    ]
    assert "Traceback" not in result.err and "1 conflict, 2 retried" in result.err


# -- bad input the CLI once met with a traceback or a wrong exit code: each is a usage error (exit 2) that
# names what is wrong and writes nothing, or has an exit code of its own (a port already taken).

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (DEEP, "nested too deeply"),
        ("NaN", "NaN is not standard JSON"),
        ('{"x": -Infinity}', "-Infinity is not standard JSON"),
        ("1e400", "the number 1e400 is too large"),
    ],
)
def test_a_payload_json_cannot_hold_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target, payload: str, named: str
) -> None:
    result = run(capsys, "enqueue", "a/b", payload, *database.args)
    assert (result.code, result.out) == (ExitCode.USAGE_ERROR, "")
    assert named in result.err and "Traceback" not in result.err
    assert database.jobs() == []


def test_every_bad_line_of_from_is_named_once_and_nothing_is_written(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    good = '{"job_type": "a/b", "payload": 1}'
    source = tmp_path / "jobs.jsonl"
    lines = [good, '{"job_type": "a/b", "payload": }', good, '{"job_type": "a/b", "payload": NaN}']
    lines += ['{"job_type": "a/b", "payload": ' + DEEP + "}"]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run(capsys, "enqueue", "--from", str(source), *database.args)
    assert (result.code, result.out) == (ExitCode.USAGE_ERROR, "")
    assert "3 bad lines, nothing was enqueued" in result.err
    assert f"{source} line 2: not JSON: Expecting value at column 32" in result.err
    assert f"{source} line 4: NaN is not standard JSON" in result.err
    assert f"{source} line 5: nested too deeply" in result.err
    assert result.err.count("line 2") == 1
    assert database.jobs() == []


@pytest.mark.parametrize("argv", [["enqueue", "--from", "-"], ["enqueue", "a/b", "-"]])
def test_reading_a_closed_stdin_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, database: Target, argv: list[str]
) -> None:
    monkeypatch.setattr("sys.stdin", None)
    result = run(capsys, *argv, *database.args)
    assert result.code == ExitCode.USAGE_ERROR and "stdin is closed" in result.err
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr("sys.stdin", closed)
    result = run(capsys, *argv, *database.args)
    assert result.code == ExitCode.USAGE_ERROR and "stdin is closed" in result.err


@pytest.mark.parametrize(
    ("dsn", "named"),
    [
        ("mysql://root@127.0.0.1:abc/test", "port 'abc' is not a port number"),
        ("mysql://root@127.0.0.1:99999/test", "port '99999' is not a port number"),
        ("mysql://root@127.0.0.1/test?connect_timeout=soon", "'soon'"),
        ("postgresql://postgres@127.0.0.1:abc/test", "port 'abc' is not a port number"),
        ("postgresql://postgres@h1:5432,h2:70000/test", "port '70000' is not a port number"),
    ],
)
def test_a_malformed_dsn_is_a_usage_error_on_both_databases(
    capsys: pytest.CaptureFixture[str], dsn: str, named: str
) -> None:
    result = run(capsys, "list", "--dsn", dsn)
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert "malformed DSN" in result.err and named in result.err and "Traceback" not in result.err


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--handler", "json:dumps", "--metrics-port", "99999"],
        ["dashboard", "--port", "0"],
        ["enqueue", "a/b", "1", "--process-in", "1e12"],
        ["reschedule", "--all", "--process-in", "3e11"],
    ],
)
def test_an_option_out_of_range_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    # No DSN and no embedded server: a refusal by the parser happens before either is looked for.
    result = run(capsys, *argv)
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert "Traceback" not in result.err and "embedded" not in result.err


def test_a_dashboard_port_already_taken_is_its_own_error_and_never_claims_to_serve(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    pytest.importorskip("uvicorn")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(capsys, "dashboard", "--port", str(port), *database.args)
    assert result.code == ExitCode.CANNOT_LISTEN and int(result.code) == 7
    assert f"cannot listen on 127.0.0.1:{port}" in result.err
    assert "dashboard on" not in result.err


def test_non_finite_numbers_of_a_stored_payload_are_shown_as_strings_in_standard_json() -> None:
    shown = jsonable({"a": float("nan"), "b": [float("inf"), -float("inf")], "c": 1.5})
    assert json.loads(json.dumps(shown, allow_nan=False)) == {
        "a": "NaN",
        "b": ["Infinity", "-Infinity"],
        "c": 1.5,
    }


def test_list_and_purge_status_archived_mean_every_archived_job(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    failed = _enqueue(capsys, database, "a/t", "{}")
    fail_next(database)
    cancelled = _enqueue(capsys, database, "a/t", "{}")
    assert run(capsys, "cancel", cancelled, "--yes", *database.args).code == ExitCode.OK
    listed = _json(capsys, "list", "--status", "archived", *database.args)
    assert sorted(j["job_id"] for j in listed["jobs"]) == sorted([failed, cancelled])
    assert sorted(j["state"] for j in listed["jobs"]) == ["cancelled", "failure"]
    purged = run(capsys, "purge", "--older-than", "0s", "--status", "archived", "--yes", *database.args)
    assert (purged.code, purged.out) == (ExitCode.OK, "2\n")
    assert database.archived_jobs() == []


def test_a_metrics_port_already_taken_exits_7_before_any_job_runs(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    pytest.importorskip("prometheus_client")
    _enqueue(capsys, database, "a/t", "{}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(capsys, "worker", "--handler", "json:dumps", "--metrics-port", str(port), *database.args)
    assert result.code == ExitCode.CANNOT_LISTEN, result.err
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.err
    assert len(database.jobs()) == 1
