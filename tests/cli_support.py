"""What the CLI tests share: tables of their own per xdist worker, main() in-process, and subprocesses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

import pytest
from fix_db import selected_backends, table_suffix

from conformance import builtin
from conformance.harness import SqlHarness
from proletarian_ref import process_next_job
from proletarian_ref.backend import ArchivedJobRecord, JobRecord
from proletarian_ref.cli import ExitCode, main
from proletarian_ref.cli.demo import RETRIES, plan

TESTS_DIR: Final = Path(__file__).resolve().parent
DIALECTS: Final = ("postgresql", "mysql")
_installed: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@dataclass
class Target:
    """A database with the test module's own tables (names contain "cli"; unqualified: no CREATE SCHEMA)."""

    dialect: str
    dsn: str
    harness: SqlHarness

    @property
    def job_table(self) -> str:
        return self.harness.job_table

    @property
    def archived_job_table(self) -> str:
        return self.harness.archived_job_table

    @property
    def tables(self) -> list[str]:
        return ["--job-table", self.job_table, "--archived-job-table", self.archived_job_table]

    @property
    def args(self) -> list[str]:
        return ["--dsn", self.dsn, *self.tables]

    def jobs(self) -> list[JobRecord]:
        return self.harness.jobs()

    def archived_jobs(self) -> list[ArchivedJobRecord]:
        return self.harness.archived_jobs()


def table_names(name: str) -> tuple[str, str]:
    base = f"cli_{table_suffix()}_{name}"
    return f"{base}_job", f"{base}_archived"


def harness_for(dialect: str, dsn: str, name: str) -> SqlHarness:
    job, archived = table_names(name)
    factory = builtin.postgresql if dialect == "postgresql" else builtin.mysql
    return factory(dsn, job, archived)


def parametrize_dialects(metafunc: pytest.Metafunc) -> None:
    """A module's pytest_generate_tests: `database` and `fresh` run on each chosen --backends SQL dialect."""
    chosen = [d for d in DIALECTS if d in selected_backends(metafunc.config)]
    for name in ("database", "fresh"):
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, chosen, indirect=True)


def dsn_for(request: pytest.FixtureRequest, dialect: str) -> str:
    return str(request.getfixturevalue("pg_dsn" if dialect == "postgresql" else "mysql_dsn"))


def target(request: pytest.FixtureRequest, name: str) -> Iterator[Target]:
    """The parametrised database (request.param) with tables `name`, installed once per worker and emptied."""
    dialect = str(request.param)
    dsn = dsn_for(request, dialect)
    harness = harness_for(dialect, dsn, name)
    if (dialect, name) not in _installed:
        harness.install()
        _installed.add((dialect, name))
    harness.clear()
    try:
        yield Target(dialect, dsn, harness)
    finally:
        harness.close()


def drop_tables(harness: SqlHarness) -> None:
    for table in (harness.job_table, harness.archived_job_table):
        harness.execute(f"DROP TABLE IF EXISTS {table}")


def isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test may reach a developer's PROLETARIAN_DSN or their real embedded data directory."""
    monkeypatch.delenv("PROLETARIAN_DSN", raising=False)
    monkeypatch.setenv("PROLETARIAN_EMBEDDED_DIR", str(tmp_path / "embedded-pg"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Result:
    """main(argv) in this process, with what it printed."""
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROLETARIAN_DSN"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def start_cli(*argv: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "proletarian_ref", *argv],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_cli(*argv: str, env: dict[str, str], timeout: float = 120, cwd: Path | None = None) -> Result:
    process = start_cli(*argv, env=env, cwd=cwd)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate(timeout=10)
        pytest.fail(f"proletarian-ref {' '.join(argv)} did not finish in {timeout} s:\n{err}")
    return Result(process.returncode, out, err)


def wait_for(condition: Callable[[], Any], *, timeout: float, what: str, process: Any = None) -> Any:
    """Poll `condition` until it is truthy; fail after `timeout` s, or as soon as `process` has exited."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            out, err = process.communicate(timeout=10)
            pytest.fail(f"the CLI exited with {process.returncode} while waiting for {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def summary_numbers(out: str) -> dict[str, int]:
    """The counts of the summary lines, e.g. {"processed": 40, "failed": 4, ...}."""
    found = re.finditer(r"^  (\w+) +(\d+)\b", out, flags=re.MULTILINE)
    return {m[1]: int(m[2]) for m in found if m[1] != "throughput"}


def expected_numbers(jobs: int) -> dict[str, int]:
    fails = [p["fail-attempts"] for p in plan(jobs)]
    return {
        "processed": jobs,
        "succeeded": sum(1 for f in fails if f <= RETRIES),
        "failed": sum(1 for f in fails if f > RETRIES),
        "retried": sum(1 for f in fails if f > 0),
        "attempts": sum(min(f, RETRIES) + 1 for f in fails),
    }


def fail_next(database: Target, queue: str = "proletarian/default") -> None:
    """Run the next due job of `queue` with a handler that raises, so it is archived as :failure."""

    def fails(job_type: str, payload: Any) -> None:
        raise RuntimeError("planned failure")

    assert process_next_job(
        database.harness.data_source,
        fails,
        queue=queue,
        job_table=database.job_table,
        archived_job_table=database.archived_job_table,
        log=lambda event, data: None,
    )


def copy_to_job_table(database: Target, job_id: str) -> None:
    """Put an archived job's row into the job table too, as no operation would: a conflict for retry."""
    stored: object = bytes.fromhex(job_id.replace("-", "")) if database.dialect == "mysql" else job_id
    columns = "job_id, queue, job_type, payload, attempts, enqueued_at, process_at"
    database.harness.execute(
        f"INSERT INTO {database.job_table} ({columns}) SELECT {columns} FROM {database.archived_job_table}"
        " WHERE job_id = %s",
        (stored,),
    )


@pytest.fixture
def sigterm_to_self() -> Iterator[None]:
    """SIGTERM is harmless to the test process even outside main(), so a late signal cannot kill pytest."""

    def ignore(signum: int, frame: FrameType | None) -> None:
        return None

    previous = signal.signal(signal.SIGTERM, ignore)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_once_its_job_fails_at_the_bound(
    database: Target, process: subprocess.Popen[str], timeout: float
) -> str:
    """--job-timeout-ms on a worker command (threaded or asyncio) running one job past the bound: wait for
    the job to be archived as a failure, then SIGTERM; the stderr of the worker, which ran on and exits 0."""
    try:
        wait_for(
            lambda: [job.status for job in database.archived_jobs()] == [":failure"],
            timeout=timeout,
            what="the job to fail at its bound",
            process=process,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.OK, err
    assert "proletarian.worker/job-timed-out" in err and "JobTimeoutError" in err
    assert database.jobs() == []
    return err


def interrupt_twice(database: Target, process: subprocess.Popen[str], started: Path, timeout: float) -> str:
    """A worker command (threaded or asyncio) whose job has `started`, SIGTERM then, while it drains,
    SIGINT: it exits 130 at once, its job as it was before the attempt (its transaction never committed).
    The worker's stderr."""
    wait_for(started.exists, timeout=timeout, what="the job to start", process=process)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the second signal comes while the first drains
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.INTERRUPTED, err
    [job] = wait_for(database.jobs, timeout=10, what="the job to be visible")
    assert job.attempts == 0
    assert database.archived_jobs() == []
    return err
