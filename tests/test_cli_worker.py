"""`proletarian-ref worker`: handler loading, retries, and what SIGTERM/SIGINT do to jobs in flight."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import (
    Target,
    drop_tables,
    harness_for,
    interrupt_twice,
    isolate,
    parametrize_dialects,
    run,
    sigterm_to_self,  # noqa: F401 (a fixture, used by name)
    start_cli,
    stop_once_its_job_fails_at_the_bound,
    subprocess_env,
    table_names,
    target,
    wait_for,
)

from conformance import builtin
from proletarian_ref.backends.mysql import MySQLBackend
from proletarian_ref.backends.postgres import PostgresBackend, notification_channel
from proletarian_ref.cli import ExitCode
from proletarian_ref.log import LISTENING_FOR_JOBS
from proletarian_ref.log import logger as ev_logger
from proletarian_ref.tables import table_name

pytest_generate_tests = parametrize_dialects


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "worker")


def _enqueue(
    capsys: pytest.CaptureFixture[str], database: Target, payload: object, job_type: str = "t/job"
) -> str:
    result = run(capsys, "enqueue", job_type, json.dumps(payload), *database.args)
    assert result.code == ExitCode.OK, result.err
    return result.out.strip()


# -- handler paths and options that are wrong ---------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        ("cli_handlers", "must look like 'package.module:function'"),
        ("no_such_module_cli:handle", "no module named 'no_such_module_cli'"),
        ("cli_handlers:no_such_function", "has no attribute 'no_such_function'"),
        ("cli_handlers:NOT_CALLABLE", "is a int, not a function"),
    ],
)
def test_a_handler_that_does_not_resolve_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target, handler: str, message: str
) -> None:
    result = run(capsys, "worker", "--handler", handler, *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert message in result.err


def test_a_handler_module_that_raises_on_import_is_reported(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database: Target
) -> None:
    (tmp_path / "cli_broken_jobs.py").write_text(
        "raise RuntimeError('refuses to import')\n", encoding="utf-8"
    )
    # The current directory is on the import path, as for `python -m`.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run(capsys, "worker", "--handler", "cli_broken_jobs:handle", *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert "importing 'cli_broken_jobs' failed: RuntimeError: refuses to import" in result.err


def test_delays_without_retries_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(capsys, "worker", "--handler", "cli_handlers:by_job", "--delays", "10,20", *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert "--delays needs --retries" in result.err


@pytest.mark.parametrize("delays", ["10,,20", "-5", "ten"])
def test_malformed_delays_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target, delays: str
) -> None:
    result = run(
        capsys,
        "worker",
        "--handler",
        "cli_handlers:by_job",
        "--retries",
        "1",
        f"--delays={delays}",
        *database.args,
    )
    assert result.code == ExitCode.USAGE_ERROR


def test_an_invalid_queue_is_a_usage_error(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    result = run(capsys, "worker", "--handler", "cli_handlers:by_job", "--queue", "a b", *database.args)
    assert result.code == ExitCode.USAGE_ERROR
    assert "invalid --queue" in result.err


def test_missing_tables_exit_4_before_the_worker_starts(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    job, archived = table_names("absent")
    result = run(
        capsys,
        "worker",
        "--handler",
        "cli_handlers:by_job",
        "--dsn",
        database.dsn,
        "--job-table",
        job,
        "--archived-job-table",
        archived,
    )
    assert result.code == ExitCode.SCHEMA_MISSING
    assert "install the schema with" in result.err
    assert "worker running" not in result.err


# -- running jobs -------------------------------------------------------------------------------------


def _stop_when(condition: Callable[[], object], timeout: float) -> threading.Thread:
    """SIGTERM this process once `condition()` holds, as a service manager would stop the worker."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.usefixtures("sigterm_to_self")
@pytest.mark.parametrize("batch", [[], ["--batch-size", "4"]], ids=["one-job-a-transaction", "batch-mode"])
def test_worker_runs_jobs_retries_failures_and_stops_on_sigterm(
    capsys: pytest.CaptureFixture[str], database: Target, batch: list[str]
) -> None:
    _enqueue(capsys, database, {"n": 1})
    _enqueue(capsys, database, {"n": 2, "fail": True})
    watcher = _stop_when(lambda: len(database.archived_jobs()) == 2, timeout=30)
    result = run(
        capsys,
        "worker",
        "--handler",
        "cli_handlers:fails_when_asked",
        "--retries",
        "2",
        "--delays",
        "0",
        "--polling-interval-ms",
        "20",
        "--threads",
        "2",
        *batch,
        *database.args,
    )
    watcher.join(timeout=5)
    assert result.code == ExitCode.OK, result.err
    archived = sorted((a.status, a.attempts) for a in database.archived_jobs())
    assert archived == [(":failure", 3), (":success", 1)]
    assert database.jobs() == []
    assert "SIGTERM: stopping" in result.err
    assert "worker stopped" in result.err


@pytest.mark.usefixtures("sigterm_to_self")
def test_advanced_handler_mode_passes_the_job(capsys: pytest.CaptureFixture[str], database: Target) -> None:
    _enqueue(capsys, database, {}, job_type="my.app/advanced")
    watcher = _stop_when(lambda: len(database.archived_jobs()) == 1, timeout=30)
    result = run(
        capsys,
        "worker",
        "--handler",
        "cli_handlers:by_job",
        "--handler-mode",
        "advanced",
        "--retries",
        "1",
        "--polling-interval-ms",
        "20",
        *database.args,
    )
    watcher.join(timeout=5)
    assert result.code == ExitCode.OK, result.err
    [archived] = database.archived_jobs()
    assert (archived.status, archived.attempts) == (":success", 2)


_ARCHIVED_COLUMNS = "job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at"
_JOB_COLUMNS = "job_id, queue, job_type, payload, attempts, enqueued_at, process_at"


@pytest.mark.usefixtures("sigterm_to_self")
@pytest.mark.parametrize("switch", ["--compact", "PROLETARIAN_COMPACT=1"])
@pytest.mark.parametrize("batch", [[], ["--batch-size", "4"]], ids=["one-job-a-transaction", "batch-mode"])
def test_the_compact_plan_runs_every_job_once_and_archives_the_rows_of_the_plain_plan(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    database: Target,
    batch: list[str],
    switch: str,
) -> None:
    runs = tmp_path / "runs"
    for n in range(6):
        _enqueue(capsys, database, {"n": n, "runs": str(runs), "fail": n == 3})
    # The compact writes the worker sends, by name: none on the plain plan.
    compact_writes: list[str] = []
    backend_class = MySQLBackend if database.dialect == "mysql" else PostgresBackend
    for name in ("archive_and_delete_job", "archive_and_delete_jobs"):
        original = getattr(backend_class, name)

        def spy(self: Any, *args: Any, _name: str = name, _original: Any = original) -> None:
            compact_writes.append(_name)
            _original(self, *args)

        monkeypatch.setattr(backend_class, name, spy)
    db = database.harness
    job_rows = db.select(f"SELECT {_JOB_COLUMNS} FROM {db.job_table}")
    archived: dict[str, list[tuple[object, ...]]] = {}
    for plan in ("plain", "compact"):
        db.clear()
        for row in job_rows:
            db.execute(f"INSERT INTO {db.job_table} ({_JOB_COLUMNS}) VALUES ({', '.join(['%s'] * 7)})", row)
        runs.write_text("", encoding="utf-8")
        compact_writes.clear()
        extra: list[str] = []
        if plan == "compact" and switch == "--compact":
            extra = ["--compact"]
        elif plan == "compact":
            monkeypatch.setenv("PROLETARIAN_COMPACT", "1")
        watcher = _stop_when(lambda: len(database.archived_jobs()) == 6, timeout=30)
        result = run(
            capsys,
            "worker",
            "--handler",
            "cli_handlers:records_runs",
            "--polling-interval-ms",
            "20",
            "--threads",
            "2",
            *batch,
            *extra,
            *database.args,
        )
        watcher.join(timeout=5)
        monkeypatch.delenv("PROLETARIAN_COMPACT", raising=False)
        assert result.code == ExitCode.OK, result.err
        assert ("on the compact plan" in result.err) is (plan == "compact")
        if plan == "plain":
            assert compact_writes == []
        else:
            # Job 3's failure archive is one job's; the successes are a batch's in batch mode.
            assert "archive_and_delete_job" in compact_writes
            assert ("archive_and_delete_jobs" in compact_writes) is bool(batch)
        # Every job ran exactly once (job 3 failed, without retries), across both threads.
        assert sorted(int(n) for n in runs.read_text(encoding="utf-8").split()) == list(range(6))
        assert database.jobs() == []
        # finished_at apart (the worker's own clock), every column as the driver reads it.
        archived[plan] = sorted(db.select(f"SELECT {_ARCHIVED_COLUMNS} FROM {db.archived_job_table}"))
    assert [row[5] for row in archived["plain"]].count(":failure") == 1
    assert archived["compact"] == archived["plain"]


def _connections_of(monkeypatch: pytest.MonkeyPatch, backend_class: type[Any], name: str) -> list[Any]:
    """The connections `backend_class.name` (a chained claim) is called on from now on, one a call."""
    seen: list[Any] = []
    original = getattr(backend_class, name)

    def spy(self: Any, conn: Any, *args: Any) -> Any:
        seen.append(conn)
        return original(self, conn, *args)

    monkeypatch.setattr(backend_class, name, spy)
    return seen


@pytest.mark.usefixtures("sigterm_to_self")
@pytest.mark.parametrize("switch", ["--chain", "PROLETARIAN_CHAIN=1"])
def test_chained_claims_run_every_job_once_on_both_databases(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    database: Target,
    switch: str,
) -> None:
    runs = tmp_path / "runs"
    for n in range(6):
        _enqueue(capsys, database, {"n": n, "runs": str(runs), "fail": n == 3})
    backend_class = MySQLBackend if database.dialect == "mysql" else PostgresBackend
    chained = _connections_of(monkeypatch, backend_class, "commit_and_get_next_job")
    extra = ["--chain"] if switch == "--chain" else []
    if not extra:
        monkeypatch.setenv("PROLETARIAN_CHAIN", "1")
    command = ["worker", "--handler", "cli_handlers:records_runs", "--polling-interval-ms", "20"]
    watcher = _stop_when(lambda: len(database.archived_jobs()) == 6, timeout=30)
    result = run(capsys, *command, "--threads", "2", "--compact", *extra, *database.args)
    watcher.join(timeout=5)
    assert result.code == ExitCode.OK, result.err
    assert "on the compact plan with chained claims" in result.err
    assert chained, "no job's commit was chained to the next claim"
    # Every job ran exactly once (job 3 failed, without retries, and ended its chain), across both threads.
    assert sorted(int(n) for n in runs.read_text(encoding="utf-8").split()) == list(range(6))
    assert database.jobs() == []
    statuses = sorted(a.status for a in database.archived_jobs())
    assert statuses == [":failure"] + [":success"] * 5


@pytest.fixture
def mysqlclient_database(mysql_dsn: str) -> Iterator[Target]:
    """MySQL through a mysql+mysqlclient:// DSN, on tables of its own."""
    harness = harness_for("mysql", mysql_dsn, "worker_mysqlclient")
    harness.install()
    harness.clear()
    try:
        yield Target("mysql", builtin.mysqlclient_dsn(mysql_dsn), harness)
    finally:
        drop_tables(harness)
        harness.close()


@pytest.mark.usefixtures("sigterm_to_self")
def test_a_mysqlclient_dsn_runs_the_chained_worker_on_mysqlclients_connections(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    mysqlclient_database: Target,
) -> None:
    database = mysqlclient_database
    runs = tmp_path / "runs"
    for n in range(6):
        _enqueue(capsys, database, {"n": n, "runs": str(runs), "fail": n == 3})
    chained = _connections_of(monkeypatch, MySQLBackend, "commit_and_get_next_job")
    command = ["worker", "--handler", "cli_handlers:records_runs", "--polling-interval-ms", "20"]
    watcher = _stop_when(lambda: len(database.archived_jobs()) == 6, timeout=30)
    result = run(capsys, *command, "--threads", "2", "--compact", "--chain", *database.args)
    watcher.join(timeout=5)
    assert result.code == ExitCode.OK, result.err
    # The worker's connections are mysqlclient's, opened for multi-statement queries (the chain's).
    assert {type(conn).__module__ for conn in chained} == {"MySQLdb.connections"}
    assert sorted(int(n) for n in runs.read_text(encoding="utf-8").split()) == list(range(6))
    assert database.jobs() == []
    assert sorted(a.status for a in database.archived_jobs()) == [":failure"] + [":success"] * 5


def test_a_mysqlclient_dsn_without_mysqlclient_names_the_extra_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, mysqlclient_database: Target
) -> None:
    # import MySQLdb now fails, as on a machine without it.
    monkeypatch.setitem(sys.modules, "MySQLdb", None)
    result = run(capsys, "enqueue", "t/job", "{}", *mysqlclient_database.args)
    assert result.code != ExitCode.OK
    assert "needs the mysqlclient driver: pip install 'proletarian-ref[mysqlclient]'" in result.err


@pytest.mark.usefixtures("sigterm_to_self")
def test_chained_claims_with_a_batch_size_chain_whole_batches_on_both_databases(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    database: Target,
) -> None:
    runs = tmp_path / "runs"
    for n in range(9):
        _enqueue(capsys, database, {"n": n, "runs": str(runs), "fail": n == 4})
    backend_class = MySQLBackend if database.dialect == "mysql" else PostgresBackend
    chained = _connections_of(monkeypatch, backend_class, "commit_and_get_next_jobs")
    command = ["worker", "--handler", "cli_handlers:records_runs", "--polling-interval-ms", "20"]
    command += ["--chain", "--batch-size", "3", *database.args]
    watcher = _stop_when(lambda: len(database.archived_jobs()) == 9, timeout=30)
    result = run(capsys, *command, "--compact")
    watcher.join(timeout=5)
    assert result.code == ExitCode.OK, result.err
    assert chained, "no batch's commit was chained to the next batch's claim"
    # Every job ran exactly once; job 4's failure was written in its batch, which the chain went on from.
    assert sorted(int(n) for n in runs.read_text(encoding="utf-8").split()) == list(range(9))
    assert database.jobs() == []
    statuses = sorted(a.status for a in database.archived_jobs())
    assert statuses == [":failure"] + [":success"] * 8


@pytest.mark.usefixtures("sigterm_to_self")
@pytest.mark.parametrize("batch_size", [1, 3])
def test_pipelined_chained_claims_send_a_checked_archive_with_the_next_claim_and_are_refused_on_mysql(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    database: Target,
    batch_size: int,
) -> None:
    runs = tmp_path / "runs"
    for n in range(6):
        _enqueue(capsys, database, {"n": n, "runs": str(runs), "fail": False})
    queued: list[str] = []
    original = PostgresBackend._queue_write

    def spy(self: PostgresBackend, lease: Any, statement: str, params: Any, what: str, job_id: Any) -> None:
        queued.append(what)
        original(self, lease, statement, params, what, job_id)

    monkeypatch.setattr(PostgresBackend, "_queue_write", spy)
    command = ["worker", "--handler", "cli_handlers:records_runs", "--polling-interval-ms", "20"]
    command += ["--compact", "--pipeline", "--batch-size", str(batch_size), *database.args]
    if database.dialect == "mysql":
        # Without --chain, which MySQL refuses first.
        result = run(capsys, *command)
        assert result.code == ExitCode.USAGE_ERROR, result.err
        assert "--pipeline is PostgreSQL's" in result.err
        assert not runs.exists() and len(database.jobs()) == 6
        return
    watcher = _stop_when(lambda: len(database.archived_jobs()) == 6, timeout=30)
    result = run(capsys, *command, "--chain")
    watcher.join(timeout=5)
    assert result.code == ExitCode.OK, result.err
    assert "on the compact plan with chained claims with pipelining" in result.err
    # Every archive was the one whose count the server checks, sent with the next claim (docs/worker.md).
    checked = "archive_and_delete_job_checked" if batch_size == 1 else "archive_and_delete_jobs_checked"
    assert queued and set(queued) == {checked}
    assert sorted(int(n) for n in runs.read_text(encoding="utf-8").split()) == list(range(6))
    assert database.jobs() == []
    assert sorted(a.status for a in database.archived_jobs()) == [":success"] * 6


# -- signals and jobs in flight (a real process) ------------------------------------------------------


def _start_worker(database: Target, handler: str, *extra: str) -> subprocess.Popen[str]:
    return start_cli(
        "worker",
        "--handler",
        f"cli_handlers:{handler}",
        "--polling-interval-ms",
        "50",
        *extra,
        *database.args,
        env=subprocess_env(),
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_handler_that_ignores_the_stop_finishes_and_its_job_is_archived(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path, signum: signal.Signals
) -> None:
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 1.5})
    process = _start_worker(database, "ignores_stop")
    wait_for(marker.exists, timeout=30, what="the job to start", process=process)
    process.send_signal(signum)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert f"{signum.name}: stopping" in err
    # The handler saw proletarian_ref.interrupted() turn true, ignored it, and its job still counts.
    assert Path(str(marker) + ".interrupted").read_text(encoding="utf-8") == "True"
    assert database.jobs() == []
    [archived] = database.archived_jobs()
    assert (archived.status, archived.attempts) == (":success", 1)


def test_a_handler_that_honours_the_stop_leaves_its_job_queued_with_attempts_unchanged(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 60})
    process = _start_worker(database, "honours_stop")
    wait_for(marker.exists, timeout=30, what="the job to start", process=process)
    stopped_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert time.monotonic() - stopped_at < 10, "proletarian_ref.sleep must wake up at the stop"
    [job] = database.jobs()
    assert job.attempts == 0
    assert database.archived_jobs() == []


def test_a_handler_running_past_the_shutdown_timeout_exits_1_and_its_job_stays_queued(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 20})
    process = _start_worker(database, "ignores_stop", "--shutdown-timeout-ms", "300")
    wait_for(marker.exists, timeout=30, what="the job to start", process=process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=15)
    assert process.returncode == ExitCode.RUNTIME_ERROR, err
    assert "Could not shut down the queue worker within 300 ms" in err
    # Its transaction never committed, so the job is as it was before the attempt.
    [job] = wait_for(database.jobs, timeout=10, what="the job to be visible")
    assert job.attempts == 0
    assert database.archived_jobs() == []


def test_job_timeout_ms_fails_a_job_that_runs_past_it_with_job_timeout_error(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    """--job-timeout-ms: the handler (proletarian_ref.sleep) is told at the bound and its job fails,
    archived as a failure once the retries are used, while the worker runs on."""
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 60})
    process = _start_worker(database, "honours_stop", "--job-timeout-ms", "300", "--log-level", "warning")
    stop_once_its_job_fails_at_the_bound(database, process, timeout=30)


def test_a_second_signal_exits_at_once(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 20})
    process = _start_worker(database, "ignores_stop")
    interrupt_twice(database, process, marker, timeout=30)


@pytest.mark.usefixtures("sigterm_to_self")
def test_a_worker_whose_tables_disappear_stops_with_exit_4(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    harness = harness_for(database.dialect, database.dsn, "dropped")
    harness.install()
    argv = [
        "--dsn",
        database.dsn,
        "--job-table",
        harness.job_table,
        "--archived-job-table",
        harness.archived_job_table,
    ]
    try:
        assert run(capsys, "enqueue", "t/job", "{}", *argv).code == ExitCode.OK

        def drop_after_first_job() -> None:
            try:
                wait_for(harness.archived_jobs, timeout=30, what="the first job")
                drop_tables(harness)
            except BaseException:
                # Never leave the worker running: stop it, and the exit code assertion fails instead.
                os.kill(os.getpid(), signal.SIGTERM)
                raise

        dropper = threading.Thread(target=drop_after_first_job, daemon=True)
        dropper.start()
        result = run(
            capsys,
            "worker",
            "--handler",
            "cli_handlers:fails_when_asked",
            "--polling-interval-ms",
            "20",
            *argv,
        )
        dropper.join(timeout=10)
        assert result.code == ExitCode.SCHEMA_MISSING, result.err
        assert "the worker stopped" in result.err
        assert "install the schema with" in result.err
    finally:
        drop_tables(harness)
        harness.close()


@pytest.mark.usefixtures("sigterm_to_self")
@pytest.mark.parametrize("flag", [[], ["--no-wake-on-notify"]], ids=["default", "no-wake-on-notify"])
def test_the_worker_listens_on_postgresql_unless_told_not_to(
    capsys: pytest.CaptureFixture[str], database: Target, flag: list[str]
) -> None:
    listens = database.dialect == "postgresql" and not flag
    statement = f'LISTEN "{notification_channel(table_name(database.job_table))}"'

    def listening() -> bool:
        query = "SELECT count(*) FROM pg_stat_activity WHERE query = %s"
        return bool(database.harness.select(query, (statement,))[0][0])

    # The LISTEN statement shows in pg_stat_activity before the listener's confirmation probe ends and
    # the event is logged: a SIGTERM in between (a loaded machine) stops the worker before it says so.
    logged = threading.Event()

    class _Listened(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "proletarian_event", None) == LISTENING_FOR_JOBS:
                logged.set()

    handler = _Listened(logging.INFO)
    ev_logger.addHandler(handler)
    try:
        _enqueue(capsys, database, {})
        watcher = _stop_when(
            lambda: len(database.archived_jobs()) == 1 and (not listens or (listening() and logged.is_set())),
            timeout=30,
        )
        result = run(
            capsys,
            "worker",
            "--handler",
            "cli_handlers:by_job",
            "--handler-mode",
            "advanced",
            *flag,
            *database.args,
        )
    finally:
        ev_logger.removeHandler(handler)
    watcher.join(timeout=5)
    assert result.code == ExitCode.OK, result.err
    assert ("listening-for-jobs" in result.err) == listens, result.err
