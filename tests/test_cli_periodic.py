"""`schema install --with periodic,unique`, `periodic list` and `worker --schedules`, on both databases."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

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

from conformance.side_tables import tick_once
from proletarian_ref import side_tables
from proletarian_ref.backends import backend_for_connection
from proletarian_ref.cli import ExitCode
from proletarian_ref.periodic import Schedule
from proletarian_ref.tables import table_name

pytest_generate_tests = parametrize_dialects
SCHEDULES = """\
from proletarian_ref.periodic import Schedule
SCHEDULES = [Schedule("hourly", "0 * * * *", "app/hourly", {"n": 1})]
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Iterator[Target]:
    for found in target(request, "periodic"):
        # The side tables of this module's job table, installed by the command under test and emptied.
        result = run(capsys, "schema", "install", *found.args, "--with", "periodic,unique")
        assert result.code == ExitCode.OK, result.err
        for feature in ("periodic", "unique"):
            found.harness.execute(f"DELETE FROM {side_tables.side_table(found.job_table, feature)}")
        yield found


def _exists(database: Target, feature: str) -> bool:
    conn = database.harness.connect()
    try:
        backend = backend_for_connection(conn)
        return side_tables.exists(backend, conn, feature, table_name(database.job_table))
    finally:
        conn.close()


def test_schema_install_with_creates_the_side_tables_beside_the_job_table(database: Target) -> None:
    assert _exists(database, "periodic")
    assert _exists(database, "unique")


def test_schema_install_with_an_unknown_feature_is_a_usage_error(
    database: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run(capsys, "schema", "install", *database.args, "--with", "periodic,cron")
    assert result.code == ExitCode.USAGE_ERROR
    assert "unknown side table 'cron'" in result.err


def test_periodic_list_shows_last_and_next_tick_and_schedules_no_longer_in_code(
    database: Target, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "periodic_list_schedules.py").write_text(SCHEDULES, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    gone = Schedule("gone", "*/5 * * * *", "app/gone")
    hourly = Schedule("hourly", "0 * * * *", "app/hourly", {"n": 1})
    first_seen, now = datetime(2026, 1, 1, 9, 30, tzinfo=UTC), datetime(2026, 1, 1, 10, 1, tzinfo=UTC)
    assert len(tick_once(database.harness, [hourly, gone], first_seen, now)) == 2
    result = run(
        capsys, "periodic", "list", *database.args, "--schedules", "periodic_list_schedules:SCHEDULES"
    )
    assert result.code == ExitCode.OK, result.err
    lines = result.out.splitlines()
    assert lines[0].split() == ["SCHEDULE", "LAST", "TICK", "NEXT", "TICK", "DEFINITION"]
    # In code first, then the rows of schedules no code names any more.
    assert lines[1].startswith("hourly ") and "2026-01-01 10:00:00Z" in lines[1]
    assert lines[2].startswith("gone ") and "2026-01-01 10:00:00Z" in lines[2] and "(not in code)" in lines[2]


def test_worker_schedules_runs_a_scheduler_beside_the_queue_workers(database: Target, tmp_path: Path) -> None:
    (tmp_path / "worker_schedules.py").write_text(
        SCHEDULES + "def handle(job_type, payload):\n    pass\n", encoding="utf-8"
    )
    process = start_cli(
        "worker",
        *database.args,
        "--handler",
        "worker_schedules:handle",
        "--schedules",
        "worker_schedules:SCHEDULES",
        env=subprocess_env(),
        cwd=tmp_path,
    )
    table = side_tables.side_table(database.job_table, "periodic")
    try:
        # The scheduler registers its schedules as it starts: the row is there before the first tick.
        wait_for(
            lambda: database.harness.select(f"SELECT schedule_name FROM {table}") == [("hourly",)],
            timeout=60,
            what="the scheduler to register its schedule",
            process=process,
        )
    finally:
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == ExitCode.OK, err
    assert "scheduler running 1 schedule from worker_schedules:SCHEDULES" in err
