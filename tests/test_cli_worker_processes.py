"""`proletarian-ref worker --processes N`: N processes run every job once, stop together, fail together."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import cast

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

from proletarian_ref.cli import ExitCode, processes
from proletarian_ref.cli.errors import CliError

pytest_generate_tests = parametrize_dialects


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "procs")


def _enqueue(capsys: pytest.CaptureFixture[str], database: Target, payload: object) -> None:
    result = run(capsys, "enqueue", "t/job", json.dumps(payload), *database.args)
    assert result.code == ExitCode.OK, result.err


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_command_left_running() -> Iterator[None]:
    # A failed test must not leave its command polling the next test's table: two signals stop the command
    # and its children at once, a kill follows if even that hangs.
    yield
    while _STARTED:
        process = _STARTED.pop()
        for _ in range(2):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    continue
        if process.poll() is None:
            process.kill()
        process.communicate()


def _start(database: Target, handler: str, *extra: str) -> subprocess.Popen[str]:
    process = start_cli(
        "worker",
        "--handler",
        f"cli_handlers:{handler}",
        "--polling-interval-ms",
        "50",
        "--processes",
        "2",
        *extra,
        *database.args,
        env=subprocess_env(),
    )
    _STARTED.append(process)
    return process


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_processes_run_every_job_once_and_one_sigterm_stops_both(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    jobs = 40
    for n in range(jobs):
        _enqueue(capsys, database, {"runs": str(runs), "n": n})
    process = _start(database, "records_pid", "--threads", "2")
    wait_for(
        lambda: len(database.archived_jobs()) == jobs, timeout=60, what="every job archived", process=process
    )
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == ExitCode.OK, err
    [pids_line] = re.findall(r"2 worker processes running \(pids (\d+), (\d+)\)", err)
    children = {int(pid) for pid in pids_line}
    lines = [line.split() for line in runs.read_text(encoding="utf-8").splitlines()]
    assert Counter(int(n) for n, _ in lines) == Counter(range(jobs)), "each job ran exactly once"
    # Jobs ran in the children, never in the parent, which only supervises.
    assert {int(pid) for _, pid in lines} <= children
    assert database.jobs() == []
    assert {job.status for job in database.archived_jobs()} == {":success"}
    assert "SIGTERM: stopping 2 worker processes" in err
    # Every child that got as far as running its worker stops it cleanly; under load a child may still be
    # starting when the jobs are done, and the SIGTERM passed on then ends it before it has a worker.
    started = err.count("worker running on queue")
    assert started >= 1 and err.count("worker stopped") == started, err
    assert "all 2 worker processes stopped" in err
    assert not any(_alive(pid) for pid in children)


def test_sigterm_lets_every_process_finish_its_job_in_flight(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    # One thread a process and two long jobs: each process holds one, so the stop must drain both.
    markers = [tmp_path / "first", tmp_path / "second"]
    for marker in markers:
        _enqueue(capsys, database, {"marker": str(marker), "seconds": 1.5})
    process = _start(database, "ignores_stop")
    wait_for(lambda: all(m.exists() for m in markers), timeout=60, what="both jobs to start", process=process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == ExitCode.OK, err
    for marker in markers:
        assert Path(str(marker) + ".interrupted").read_text(encoding="utf-8") == "True"
    assert database.jobs() == []
    assert [job.status for job in database.archived_jobs()] == [":success", ":success"]


def test_a_crashing_process_stops_the_other_and_the_command_exits_1_naming_it(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    _enqueue(capsys, database, {"marker": str(tmp_path / "crashed")})
    process = _start(database, "crashes_once")
    _, err = process.communicate(timeout=90)
    assert process.returncode == ExitCode.RUNTIME_ERROR, err
    assert re.search(
        r"worker process [12] of 2 \(pid \d+\) was killed by SIGKILL without being asked to stop; "
        r"the other worker processes were stopped",
        err,
    ), err
    assert err.count("error:") == 1, err
    pids = [int(pid) for pid in re.findall(r"pids (\d+), (\d+)", err)[0]]
    assert not any(_alive(pid) for pid in pids)
    # The crashed process's transaction died with its connection, so its job is queued again (attempts
    # unchanged), or the other process ran it before its stop: never lost.
    queued, archived = database.jobs(), database.archived_jobs()
    assert [j.attempts for j in queued] + [a.status for a in archived] in ([0], [":success"])


def test_metrics_port_with_several_processes_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    result = run(
        capsys,
        "worker",
        "--handler",
        "cli_handlers:records_pid",
        "--processes",
        "2",
        "--metrics-port",
        "9999",
        *database.args,
    )
    assert result.code == ExitCode.USAGE_ERROR
    assert "--metrics-port serves one process's metrics" in result.err


def test_a_second_signal_makes_every_process_exit_at_once(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 20})
    process = _start(database, "ignores_stop")
    wait_for(marker.exists, timeout=60, what="the job to start", process=process)
    # Back to back: the command must pass on two stops, not one merged signal.
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == ExitCode.INTERRUPTED, err
    assert re.search(
        r"error: interrupted: worker process [12] of 2 \(pid \d+\) exited with code 130.*"
        r", exiting at once on the second signal",
        err,
    ), err
    [job] = wait_for(database.jobs, timeout=10, what="the job to be visible")
    assert job.attempts == 0


def test_processes_whose_command_was_killed_stop_by_themselves(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    _enqueue(capsys, database, {"marker": str(marker), "seconds": 60})
    process = _start(database, "honours_stop")
    assert process.stderr is not None
    first_line = process.stderr.readline()
    children = [int(pid) for pid in re.findall(r"pids (\d+), (\d+)", first_line)[0]]
    wait_for(marker.exists, timeout=60, what="the job to start", process=process)
    process.kill()  # SIGKILL: the command cannot pass anything on
    process.communicate(timeout=10)
    wait_for(lambda: not any(_alive(pid) for pid in children), timeout=30, what="both children to stop")
    # The one holding the job saw the stop (proletarian_ref.sleep raised) and left it queued.
    [job] = wait_for(database.jobs, timeout=10, what="the job to be visible")
    assert job.attempts == 0
    assert database.archived_jobs() == []


def test_two_processes_of_a_coroutine_handler_run_every_job_once(
    capsys: pytest.CaptureFixture[str], database: Target, tmp_path: Path
) -> None:
    # Each child runs the asyncio worker, as a single command with that handler would.
    runs = tmp_path / "runs"
    jobs = 20
    for n in range(jobs):
        _enqueue(capsys, database, {"runs": str(runs), "n": n})
    process = _start(database, "records_runs_async", "--threads", "2")
    wait_for(
        lambda: len(database.archived_jobs()) == jobs, timeout=60, what="every job archived", process=process
    )
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == ExitCode.OK, err
    ran = [int(n) for n in runs.read_text(encoding="utf-8").split()]
    assert Counter(ran) == Counter(range(jobs)), "each job ran exactly once"
    assert "all 2 worker processes stopped" in err


class _Ended:
    """A child process that has ended with `returncode` (what `_outcome` reads of a Popen)."""

    def __init__(self, pid: int, returncode: int) -> None:
        self.pid = pid
        self.returncode = returncode


def _outcome_of(*codes: int, at_once: bool) -> tuple[int, str]:
    children = cast("list[subprocess.Popen[bytes]]", [_Ended(100 + i, code) for i, code in enumerate(codes)])
    try:
        return processes._outcome(children, len(codes), None, at_once=at_once), ""
    except CliError as exc:
        return int(exc.exit_code), str(exc)


def test_a_child_ended_by_the_exit_at_once_sigint_itself_makes_the_command_exit_130_not_1() -> None:
    # A clean-clone CI run: the idle child had finished stopping on SIGTERM and put Python's own SIGINT
    # handler back when the passed-on SIGINT landed, so it ended by SIGINT (-2), which read as a failure (1).
    code, message = _outcome_of(-signal.SIGINT, int(ExitCode.INTERRUPTED), at_once=True)
    assert code == ExitCode.INTERRUPTED, message
    assert message == (
        "interrupted: worker process 1 of 2 (pid 100) was killed by SIGINT; worker process 2 of 2 (pid 101) "
        "exited with code 130, exiting at once on the second signal"
    )


def test_after_one_signal_a_child_killed_by_sigint_or_exiting_130_is_a_failure_of_the_stop() -> None:
    assert _outcome_of(0, -signal.SIGINT, at_once=False) == (
        ExitCode.RUNTIME_ERROR,
        "worker process 2 of 2 (pid 101) was killed by SIGINT while stopping (its messages above say why)",
    )
    assert _outcome_of(130, 0, at_once=False)[0] == ExitCode.INTERRUPTED
    assert "while stopping" in _outcome_of(130, 0, at_once=False)[1]


def test_a_second_signal_that_every_child_outran_leaves_exit_0_and_a_crash_keeps_its_code() -> None:
    assert _outcome_of(0, -signal.SIGTERM, at_once=True) == (ExitCode.OK, "")
    code, message = _outcome_of(-signal.SIGINT, 4, at_once=True)
    assert code == 4
    assert message.startswith("worker process 2 of 2 (pid 101) exited with code 4 while stopping")
