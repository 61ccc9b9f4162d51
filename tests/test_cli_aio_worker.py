"""`proletarian-ref worker --handler module:coroutine`: the asyncio worker, its signals and exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import (
    Result,
    Target,
    interrupt_twice,
    isolate,
    run,
    start_cli,
    stop_once_its_job_fails_at_the_bound,
    subprocess_env,
    target,
    wait_for,
)

from proletarian_ref.backends.dsn import asyncpg_connect_args
from proletarian_ref.backends.postgres import notification_channel
from proletarian_ref.cli import ExitCode
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.tables import table_name


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "aioworker")


on_postgresql = pytest.mark.parametrize("database", ["postgresql"], indirect=True)
# aiomysql on MySQL, psycopg (the default) or asyncpg (--async-driver) on PostgreSQL: the same command,
# the dialect's and driver's own asyncio backend. `driver` is the --async-driver given (None: left out).
on_every_driver = pytest.mark.parametrize(
    ("database", "driver"),
    [("postgresql", None), ("postgresql", "asyncpg"), ("mysql", None)],
    indirect=["database"],
)
on_each_postgresql_driver = pytest.mark.parametrize(
    ("database", "driver"), [("postgresql", "psycopg"), ("postgresql", "asyncpg")], indirect=["database"]
)
_DEFAULT_DRIVERS = {"postgresql": "psycopg", "mysql": "aiomysql"}


def _driver_args(driver: str | None) -> list[str]:
    return [] if driver is None else ["--async-driver", driver]


# --loop: the asyncio worker on asyncio's own event loop (the default, left out) or on uvloop's.
on_each_loop = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])


def _loop_args(loop: str) -> list[str]:
    return [] if loop == "asyncio" else ["--loop", loop]


def _on_loop(loop: str) -> str:
    """What the start line adds after the driver on `loop`."""
    return "" if loop == "asyncio" else f", on {loop}'s event loop"


def _enqueue(capsys: pytest.CaptureFixture[str], database: Target, payload: object) -> None:
    result = run(capsys, "enqueue", "t/job", json.dumps(payload), *database.args)
    assert result.code == ExitCode.OK, result.err


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


@on_every_driver
@on_each_loop
def test_a_coroutine_handler_runs_each_job_once_on_the_asyncio_worker_and_sigterm_stops_it(
    capsys: pytest.CaptureFixture[str], database: Target, driver: str | None, loop: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    _enqueue(capsys, database, {"runs": str(runs), "n": 1})
    _enqueue(capsys, database, {"runs": str(runs), "n": 2, "fail": True})
    process = _start_worker(
        database,
        "records_runs_async",
        "--retries",
        "1",
        "--delays",
        "0",
        "--threads",
        "2",
        *_driver_args(driver),
        *_loop_args(loop),
    )
    wait_for(lambda: len(database.archived_jobs()) == 2, timeout=60, what="both jobs", process=process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    # Job 2 failed once and was retried once: three runs, each job's attempts as the threaded worker's.
    assert sorted(runs.read_text(encoding="utf-8").split()) == ["1", "2", "2"]
    archived = sorted((a.status, a.attempts) for a in database.archived_jobs())
    assert archived == [(":failure", 2), (":success", 1)]
    assert database.jobs() == []
    assert "with 2 asyncio tasks, handler cli_handlers:records_runs_async" in err
    # The pool the tasks ran on is the chosen driver's (told from the open pool's type), and the loop the
    # one --loop chose (told from the running loop's type).
    assert f"asyncio worker on {driver or _DEFAULT_DRIVERS[database.dialect]}{_on_loop(loop)}\n" in err
    assert "SIGTERM: stopping" in err
    assert "worker stopped" in err


@on_each_postgresql_driver
@pytest.mark.parametrize(
    ("signum", "loop"), [(signal.SIGTERM, "asyncio"), (signal.SIGINT, "asyncio"), (signal.SIGTERM, "uvloop")]
)
def test_a_coroutine_still_running_at_the_shutdown_timeout_is_released_with_exit_1(
    capsys: pytest.CaptureFixture[str],
    database: Target,
    driver: str,
    tmp_path: Path,
    signum: signal.Signals,
    loop: str,
) -> None:
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 60})
    process = _start_worker(
        database, "sleeps_async", "--shutdown-timeout-ms", "300", *_driver_args(driver), *_loop_args(loop)
    )
    wait_for(marker.exists, timeout=60, what="the job to start", process=process)
    process.send_signal(signum)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.RUNTIME_ERROR, err
    assert f"{signum.name}: stopping" in err
    assert "Could not shut down the queue worker within 300 ms" in err
    assert "released back to the queue" in err
    # The handler's task was cancelled at its await and its transaction rolled back: never archived, the
    # job waits with its attempts unchanged.
    assert not Path(str(marker) + ".finished").exists()
    [job] = wait_for(database.jobs, timeout=10, what="the job to be visible")
    assert job.attempts == 0
    assert database.archived_jobs() == []


@on_each_postgresql_driver
def test_job_timeout_ms_cancels_a_coroutine_past_its_bound_and_fails_its_job(
    capsys: pytest.CaptureFixture[str], database: Target, driver: str, tmp_path: Path
) -> None:
    """--job-timeout-ms on the asyncio worker: past the bound and its grace the coroutine is cancelled at
    its await, and the job fails with JobTimeoutError, archived once its retries are used."""
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 60})
    process = _start_worker(
        database,
        "sleeps_async",
        "--job-timeout-ms",
        "200",
        "--job-timeout-grace-ms",
        "100",
        *_driver_args(driver),
    )
    stop_once_its_job_fails_at_the_bound(database, process, timeout=60)
    assert not Path(str(marker) + ".finished").exists()


@on_each_postgresql_driver
@on_each_loop
def test_a_second_signal_ends_the_asyncio_worker_at_once_with_130(
    capsys: pytest.CaptureFixture[str], database: Target, driver: str, loop: str, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 60})
    # A 10 s shutdown timeout: the second signal cuts it short.
    process = _start_worker(database, "sleeps_async", *_driver_args(driver), *_loop_args(loop))
    err = interrupt_twice(database, process, marker, timeout=60)
    assert "interrupted" in err


@pytest.mark.parametrize("database", ["mysql"], indirect=True)
def test_compact_on_mysql_runs_the_asyncio_worker_on_the_mysql_backend(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    # --compact builds the dialect's own asyncio backend on the command's pool (an aiomysql.Pool here).
    runs = tmp_path / "runs"
    _enqueue(capsys, database, {"runs": str(runs), "n": 1})
    process = _start_worker(database, "records_runs_async", "--compact")
    wait_for(lambda: len(database.archived_jobs()) == 1, timeout=60, what="the job", process=process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert runs.read_text(encoding="utf-8").split() == ["1"]
    assert [(a.status, a.attempts) for a in database.archived_jobs()] == [(":success", 1)]
    assert database.jobs() == []


@on_postgresql
def test_compact_on_asyncpg_runs_the_asyncio_worker_on_the_asyncpg_backend(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    _enqueue(capsys, database, {"runs": str(runs), "n": 1})
    process = _start_worker(database, "records_runs_async", "--compact", "--async-driver", "asyncpg")
    wait_for(lambda: len(database.archived_jobs()) == 1, timeout=60, what="the job", process=process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert runs.read_text(encoding="utf-8").split() == ["1"]
    assert [(a.status, a.attempts) for a in database.archived_jobs()] == [(":success", 1)]
    assert "asyncio worker on asyncpg\n" in err


@on_each_postgresql_driver
def test_chained_claims_run_the_asyncio_worker_on_each_postgresql_driver(
    capsys: pytest.CaptureFixture[str], database: Target, driver: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    for n in range(4):
        _enqueue(capsys, database, {"runs": str(runs), "n": n})
    options = ["--chain", "--threads", "2", *_driver_args(driver)]
    process = _start_worker(database, "records_runs_async", *options)
    wait_for(lambda: len(database.archived_jobs()) == 4, timeout=60, what="the jobs", process=process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert sorted(runs.read_text(encoding="utf-8").split()) == ["0", "1", "2", "3"]
    assert {(a.status, a.attempts) for a in database.archived_jobs()} == {(":success", 1)}
    assert f"asyncio worker on {driver}\n" in err
    assert "on chained claims" in err


@pytest.mark.parametrize("database", ["mysql"], indirect=True)
def test_chained_claims_run_the_asyncio_worker_on_mysql(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    # AsyncMySQLBackend(compact=True, chain=True) on the command's aiomysql pool: one query a job.
    runs = tmp_path / "runs"
    for n in range(4):
        _enqueue(capsys, database, {"runs": str(runs), "n": n})
    process = _start_worker(database, "records_runs_async", "--chain", "--threads", "2")
    wait_for(lambda: len(database.archived_jobs()) == 4, timeout=60, what="the jobs", process=process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert sorted(runs.read_text(encoding="utf-8").split()) == ["0", "1", "2", "3"]
    assert {(a.status, a.attempts) for a in database.archived_jobs()} == {(":success", 1)}
    assert "asyncio worker on aiomysql\n" in err
    assert "chained claims" in err


@on_postgresql
def test_pipelined_chained_claims_run_the_asyncio_worker_on_psycopgs_pipeline_mode(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    for n in range(6):
        _enqueue(capsys, database, {"runs": str(runs), "n": n})
    options = ["--compact", "--chain", "--pipeline", "--threads", "2"]
    process = _start_worker(database, "records_runs_async", *options)
    wait_for(lambda: len(database.archived_jobs()) == 6, timeout=60, what="the jobs", process=process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert sorted(runs.read_text(encoding="utf-8").split()) == [str(n) for n in range(6)]
    assert {(a.status, a.attempts) for a in database.archived_jobs()} == {(":success", 1)}
    assert "asyncio worker on psycopg in pipeline mode\n" in err
    assert "on the compact plan with chained claims with pipelining" in err


@on_postgresql
def test_pipelining_on_asyncpg_is_refused_naming_why(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    options = ["--compact", "--chain", "--pipeline", "--async-driver", "asyncpg"]
    process = _start_worker(database, "records_runs_async", *options)
    _, err = process.communicate(timeout=60)
    assert process.returncode == ExitCode.USAGE_ERROR, err
    assert "--pipeline is psycopg's pipeline mode, and asyncpg has none" in err


@pytest.mark.parametrize("database", ["mysql"], indirect=True)
def test_pipelining_on_mysql_refuses_the_asyncio_worker_naming_why(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    process = _start_worker(database, "records_runs_async", "--compact", "--pipeline")
    _, err = process.communicate(timeout=60)
    assert process.returncode == ExitCode.USAGE_ERROR, err
    assert "--pipeline is PostgreSQL's" in err


@on_postgresql
def test_wake_up_on_asyncpg_listens_on_a_connection_outside_the_pool_of_one(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    """--threads 1 is a pool of one connection: a listener holding it would starve the poller. Polling
    once every 10 minutes, a job enqueued with --notify after the first poll runs only if the listener,
    on its own connection, wakes the worker."""
    runs = tmp_path / "runs"
    statement = f'LISTEN "{notification_channel(table_name(database.job_table))}"'

    def listening() -> bool:
        query = "SELECT count(*) FROM pg_stat_activity WHERE query = %s"
        return bool(database.harness.select(query, (statement,))[0][0])

    _enqueue(capsys, database, {"runs": str(runs), "n": 1})
    process = _start_worker(
        database, "records_runs_async", "--async-driver", "asyncpg", "--polling-interval-ms", "600000"
    )
    try:
        wait_for(
            lambda: len(database.archived_jobs()) == 1 and listening(),
            timeout=60,
            what="the first job and the listener",
            process=process,
        )
        notified = run(
            capsys, "enqueue", "t/job", json.dumps({"runs": str(runs), "n": 2}), "--notify", *database.args
        )
        assert notified.code == ExitCode.OK, notified.err
        wait_for(
            lambda: len(database.archived_jobs()) == 2, timeout=60, what="the notified job", process=process
        )
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert runs.read_text(encoding="utf-8").split() == ["1", "2"]


@on_postgresql
def test_two_processes_on_asyncpg_run_every_job_once_and_sigterm_stops_them(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    # --processes passes --async-driver on to each child with the rest of the command line.
    runs = tmp_path / "runs"
    jobs = 10
    for n in range(jobs):
        _enqueue(capsys, database, {"runs": str(runs), "n": n})
    process = _start_worker(database, "records_runs_async", "--processes", "2", "--async-driver", "asyncpg")
    try:
        wait_for(lambda: len(database.archived_jobs()) == jobs, timeout=60, what="every job", process=process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == ExitCode.OK, err
    assert sorted(int(n) for n in runs.read_text(encoding="utf-8").split()) == list(range(jobs))
    # A child that the signal reached while it still started says nothing: at least one says it.
    assert "asyncio worker on asyncpg\n" in err and "asyncio worker on psycopg" not in err
    assert "all 2 worker processes stopped" in err


# -- --async-driver's errors: each before anything runs -------------------------------------------------


def _asyncpg_worker(capsys: pytest.CaptureFixture[str], dsn: str) -> Result:
    """`worker --async-driver asyncpg` with a coroutine handler on `dsn`."""
    return run(
        capsys,
        "worker",
        "--handler",
        "cli_handlers:records_runs_async",
        "--async-driver",
        "asyncpg",
        "--dsn",
        dsn,
    )


def test_asyncpg_with_a_mysql_dsn_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1: refused before any connection is tried.
    result = _asyncpg_worker(capsys, "mysql://root@127.0.0.1:1/test")
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert "--async-driver asyncpg is a PostgreSQL driver, and the DSN (from --dsn) is MySQL's" in result.err


def test_asyncpg_from_the_environment_with_a_mysql_dsn_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROLETARIAN_ASYNC_DRIVER", "asyncpg")
    monkeypatch.setenv("PROLETARIAN_DSN", "mysql://root@127.0.0.1:1/test")
    result = run(capsys, "worker", "--handler", "cli_handlers:records_runs_async")
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert "--async-driver asyncpg is a PostgreSQL driver, and the DSN" in result.err


def test_asyncpg_with_a_plain_handler_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # asyncpg has no threaded worker, and a plain handler runs on the threaded one.
    dsn = "postgresql://postgres@127.0.0.1:1/test"
    result = run(
        capsys, "worker", "--handler", "cli_handlers:records_runs", "--async-driver", "asyncpg", "--dsn", dsn
    )
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert "--handler cli_handlers:records_runs is a plain function" in result.err


def test_asyncpg_not_installed_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # import asyncpg raises ImportError
    result = _asyncpg_worker(capsys, "postgresql://postgres@127.0.0.1:1/test")
    assert result.code == ExitCode.RUNTIME_ERROR, result.err
    assert "pip install 'proletarian-ref[asyncpg]'" in result.err


def test_loop_uvloop_with_a_plain_handler_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # A plain handler runs on the threaded worker, which has no event loop to choose.
    dsn = "postgresql://postgres@127.0.0.1:1/test"
    result = run(capsys, "worker", "--handler", "cli_handlers:records_runs", "--loop", "uvloop", "--dsn", dsn)
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert (
        "--loop uvloop is the asyncio worker's event loop, and --handler cli_handlers:records_runs is a plain"
        in result.err
    )


def test_loop_uvloop_not_installed_names_the_extra(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    dsn = "postgresql://postgres@127.0.0.1:1/test"
    result = run(
        capsys, "worker", "--handler", "cli_handlers:records_runs_async", "--loop", "uvloop", "--dsn", dsn
    )
    assert result.code == ExitCode.RUNTIME_ERROR, result.err
    assert "--loop uvloop needs uvloop: pip install 'proletarian-ref[uvloop]'" in result.err


def test_loop_from_the_environment_picks_uvloop(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # PROLETARIAN_LOOP is --loop, as every option has its variable: checked before anything connects.
    monkeypatch.setenv("PROLETARIAN_LOOP", "uvloop")
    dsn = "postgresql://postgres@127.0.0.1:1/test"
    result = run(capsys, "worker", "--handler", "cli_handlers:records_runs", "--dsn", dsn)
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert "--loop uvloop is the asyncio worker's event loop" in result.err


@on_postgresql
def test_a_libpq_only_dsn_option_on_asyncpg_is_a_usage_error_naming_it(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    dsn = database.dsn + ("&" if "?" in database.dsn else "?") + "keepalives=1"
    result = run(
        capsys,
        "worker",
        "--handler",
        "cli_handlers:records_runs_async",
        "--async-driver",
        "asyncpg",
        "--dsn",
        dsn,
        *database.tables,
    )
    assert result.code == ExitCode.USAGE_ERROR, result.err
    assert "asyncpg does not take libpq's option 'keepalives'" in result.err


def test_asyncpg_connect_args_keep_what_asyncpg_reads_and_map_psycopg_options() -> None:
    url, kwargs = asyncpg_connect_args(
        "postgresql://u:p%40ss@h:5433/db?sslmode=require&password=x&connect_timeout=7&prepare_threshold=none"
        "&application_name=w"
    )
    assert url == "postgresql://u:p%40ss@h:5433/db?sslmode=require&password=x&application_name=w"
    assert kwargs == {"timeout": 7.0, "statement_cache_size": 0}
    dsn = "postgres://u@h/db?sslrootcert=/ca.pem"
    assert asyncpg_connect_args(dsn) == (dsn, {})
    with pytest.raises(ConfigurationError, match="prepare_threshold must be none"):
        asyncpg_connect_args("postgresql://u@h/db?prepare_threshold=soon")
