"""Bad input the CLI once met with a traceback or a wrong exit code: each is a usage error (exit 2) that
names what is wrong and writes nothing, or has an exit code of its own (a port already taken)."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import Target, free_port, isolate, parametrize_dialects, run, target

from proletarian_ref.cli import ExitCode
from proletarian_ref.ops.jobs import jsonable

pytest_generate_tests = parametrize_dialects


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "errors")


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
