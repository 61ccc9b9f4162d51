"""list, show and stats print what rows hold without letting it drive the terminal or forge a line.

The rows are written as a Clojure service or a hand-written INSERT could write them: straight through the
backend, with no keyword check. proletarian_ref.cli.terminal does the escaping.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cli_support import Target, isolate, parametrize_dialects, run, target

from proletarian_ref.backend import JobRecord
from proletarian_ref.cli import ExitCode
from proletarian_ref.cli.terminal import printable
from proletarian_ref.tables import table_name

pytest_generate_tests = parametrize_dialects

QUEUE = ":evil/q\x1b]0;pwned\x07"
JOB_TYPE = ":evil/t\n00000000-0000-0000-0000-000000000000  forged/queue"
PAYLOAD = '["^ ","~:clear","\x1b[2J\x1b[H\u202e"]'


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "terminal")


def _insert_hostile_row(database: Target, enqueued_ago: timedelta = timedelta(0)) -> str:
    job_id = uuid.uuid4()
    backend = database.harness.make_backend()
    stored_id = job_id.bytes if database.dialect == "mysql" else job_id
    now = datetime.now(UTC).replace(microsecond=0) - enqueued_ago
    conn = database.harness.connect()
    try:
        job = JobRecord(stored_id, QUEUE, JOB_TYPE, PAYLOAD, 0, now, now)
        backend.enqueue(conn, table_name(database.job_table), job)
        conn.commit()
    finally:
        conn.close()
    return str(job_id)


def _assert_safe(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "forged/queue" not in "".join(line for line in text.splitlines() if line.startswith("0000"))


def test_list_escapes_control_characters_and_keeps_one_line_a_job(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    _insert_hostile_row(database)
    result = run(capsys, "list", *database.args)
    assert result.code == ExitCode.OK, result.err
    _assert_safe(result.out)
    [_header, row] = result.out.splitlines()
    assert "evil/q\\x1b]0;pwned\\x07" in row and "evil/t\\n00000000-" in row
    # JSON carries the text exactly; JSON's own escapes keep it safe.
    listed = json.loads(run(capsys, "list", "--json", *database.args).out)
    assert [(j["queue"], j["job_type"]) for j in listed["jobs"]] == [(QUEUE[1:], JOB_TYPE[1:])]


def test_show_escapes_the_stored_transit_text_and_every_field(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    job_id = _insert_hostile_row(database)
    result = run(capsys, "show", job_id, *database.args)
    assert result.code == ExitCode.OK, result.err
    _assert_safe(result.out)
    assert "\\x1b[2J\\x1b[H\\u202e" in result.out
    shown = json.loads(run(capsys, "show", job_id, "--json", *database.args).out)
    assert shown["payload_transit"] == PAYLOAD


def test_stats_escapes_queue_names(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    _insert_hostile_row(database)
    result = run(capsys, "stats", *database.args)
    assert result.code == ExitCode.OK, result.err
    _assert_safe(result.out)
    assert printable(QUEUE[1:]) in result.out


def test_health_escapes_the_name_of_a_lagging_queue(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    _insert_hostile_row(database, enqueued_ago=timedelta(hours=1))
    result = run(capsys, "health", "--max-lag", "1m", *database.args)
    assert result.code == ExitCode.QUEUE_LAGGING, result.out + result.err
    _assert_safe(result.out)
    assert f"on {printable(QUEUE[1:])}\n" in result.out


def test_printable_leaves_ordinary_text_alone_and_escapes_controls() -> None:
    assert printable("my.app/send-email ünïcode 日本 \\n") == "my.app/send-email ünïcode 日本 \\n"
    assert printable("a\tb\rc\x00d\x7fe\x9bf\u2028g") == "a\\tb\\rc\\x00d\\x7fe\\x9bf\\u2028g"
