"""Worker log data printed as data: JSON logs carry values as JSON (retry-spec a map), text logs as text.

A failing job run by the CLI's worker on each database; the JSON line is also the example docs/cli.md
shows, which must have the keys the worker really writes.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import (
    Target,
    isolate,
    parametrize_dialects,
    run,
    start_cli,
    subprocess_env,
    target,
    wait_for,
)

from proletarian_ref import log as ev
from proletarian_ref.cli import ExitCode
from proletarian_ref.log import format_event, log_value
from proletarian_ref.retry import RetryStrategy

pytest_generate_tests = parametrize_dialects

DOCS_CLI = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "logvalues")


def _failing_run(
    capsys: pytest.CaptureFixture[str], database: Target, log_format: str
) -> tuple[str, list[str]]:
    """The id of a job that fails for good, and the worker's stderr lines while it ran."""
    result = run(capsys, "enqueue", "my.app/send-email", '{"fail": true, "n": 1}', *database.args)
    assert result.code == ExitCode.OK, result.err
    job_id = result.out.strip()
    process = start_cli(
        "worker",
        "--handler",
        "cli_handlers:fails_when_asked",
        "--retries",
        "0",
        "--polling-interval-ms",
        "50",
        "--log-format",
        log_format,
        *database.args,
        env=subprocess_env(),
    )
    try:
        wait_for(database.archived_jobs, timeout=60, what="the job to fail", process=process)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return job_id, err.splitlines()


def _event(lines: list[dict[str, Any]], event: str) -> dict[str, Any]:
    return next(line for line in lines if line.get("event") == event)


def test_json_logs_carry_values_as_json_and_the_docs_example_has_their_keys(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    job_id, err = _failing_run(capsys, database, "json")
    lines = [json.loads(line) for line in err]
    failed = _event(lines, ev.HANDLE_JOB_EXCEPTION)
    assert failed[ev.JOB_ID] == job_id
    assert failed[ev.EXCEPTION]["type"] == "PlannedFailure"
    assert failed[ev.EXCEPTION]["message"] == "job 1 fails, as asked"
    assert _event(lines, ev.NOT_RETRYING)[ev.RETRY_SPEC] == {"retries": 0, "delays": []}
    example = json.loads(_docs_example("json"))
    assert list(example) == list(failed)
    assert list(example[ev.EXCEPTION]) == list(failed[ev.EXCEPTION])
    assert {k: type(v) for k, v in example.items()} == {k: type(v) for k, v in failed.items()}
    # What does not change from run to run is the example's as written (its job-type is this test's).
    stable = ("level", "event", ev.QUEUE_WORKER_ID, ev.WORKER_THREAD_ID, ev.JOB_TYPE, ev.ATTEMPT)
    assert {k: example[k] for k in stable} == {k: failed[k] for k in stable}


def test_text_logs_print_ids_and_errors_readably(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    job_id, err = _failing_run(capsys, database, "text")
    [failed] = [line for line in err if ev.HANDLE_JOB_EXCEPTION in line]
    assert f"{ev.JOB_ID}={job_id} " in failed
    assert f'{ev.EXCEPTION}="PlannedFailure: job 1 fails, as asked"' in failed
    [given_up] = [line for line in err if ev.NOT_RETRYING in line]
    assert f'{ev.RETRY_SPEC}={{"retries": 0, "delays": []}}' in given_up
    assert not [line for line in err if re.search(r"UUID\(|\{'|Strategy\(", line)]
    assert _unstable_parts_out(_docs_example("text")) == _unstable_parts_out(failed)


def _unstable_parts_out(line: str) -> str:
    line = re.sub(r"^\S+ \S+ ", "TIME ", line)
    line = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "ID", line)
    return re.sub(r'exception=".*"$', "exception=ERROR", line)


def test_log_values_are_data_and_a_text_line_stays_one_line() -> None:
    job_id = uuid.UUID("0b6e4c1a-8d1f-4e7a-9c55-2f0d3e9a1b2c")
    assert log_value({ev.RETRY_SPEC: RetryStrategy(2, (100, 200))}) == {
        ev.RETRY_SPEC: {"retries": 2, "delays": [100, 200]}
    }
    line = format_event(ev.HANDLE_JOB_EXCEPTION, {ev.JOB_ID: job_id, ev.EXCEPTION: ValueError("a\nb")})
    assert line == f'{ev.HANDLE_JOB_EXCEPTION} job-id={job_id} exception="ValueError: a\\nb"'


def _docs_example(fence: str) -> str:
    """The first ```json or ```text block of docs/cli.md's Logs section."""
    text = DOCS_CLI.read_text(encoding="utf-8")
    section = text[text.index("### Logs and environment variables") :]
    match = re.search(rf"```{fence}\n(.*?)\n```", section, flags=re.S)
    assert match is not None, f"docs/cli.md's Logs section has no {fence} example"
    return match.group(1)
