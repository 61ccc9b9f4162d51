"""benchmarks.server_cores: the database on cores of its own, and every affinity as it was after."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from fix_db import table_suffix

for _module in ("matplotlib", "psutil", "rich"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"needs the bench extra ({_module}): pip install -e '.[bench]'", allow_module_level=True)

from benchmarks.common import BackendSpec, open_harness  # noqa: E402
from benchmarks.server_cores import (  # noqa: E402
    STATE_PREFIX,
    server_cores,
    split_cpus,
    sweep_leftovers,
)
from benchmarks.settings import TINY  # noqa: E402

DIALECTS = [
    pytest.param("postgresql", "pg_dsn", marks=pytest.mark.postgresql),
    pytest.param("mysql", "mysql_dsn", marks=pytest.mark.mysql),
]

if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("the database on cores of its own needs two CPUs", allow_module_level=True)


def _harness(factory: str, dsn: str) -> Any:
    return open_harness(BackendSpec(f"conformance.builtin:{factory}", {"dsn": dsn}), "cores", table_suffix())


def _tid(path: str) -> int:
    return int(Path(path).parent.name)


# Prints the OS thread id serving a new connection of its own (the PostgreSQL backend's pid, or the
# MariaDB thread's TID), then holds the connection for `argv[2]` seconds.
_HOLDER = """
import sys, time
from proletarian_ref.backends.dsn import connection_factory, dialect_of_dsn
dsn = sys.argv[1]
conn = connection_factory(dsn)()
cur = conn.cursor()
if dialect_of_dsn(dsn) == "postgresql":
    cur.execute("SELECT pg_backend_pid()")
else:
    cur.execute("SELECT TID FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()")
print(cur.fetchone()[0], flush=True)
time.sleep(float(sys.argv[2]))
"""


def _holder(dsn: str, seconds: float, *, foreign: bool = False) -> tuple[int, int]:
    """A process holding a connection: its pid and its server side's thread id. A `foreign` one is nobody's
    child here: its parent exits at once, so this test's process tree holds no connection of it. The caller
    kills it (_end)."""
    if foreign:
        launcher = (
            "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c'] + sys.argv[1:], "
            "start_new_session=True); print(p.pid, flush=True)"
        )
        argv = [sys.executable, "-c", launcher, _HOLDER, dsn, str(seconds)]
    else:
        argv = [sys.executable, "-c", _HOLDER, dsn, str(seconds)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline()) if foreign else process.pid
    tid = int(process.stdout.readline())
    _started.append(process)
    return pid, tid


_started: list[subprocess.Popen[str]] = []


def _end(pid: int) -> None:
    """Kill a holder and reap what this test started for it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while _started:
        process = _started.pop()
        process.kill()
        process.wait(timeout=30)
        assert process.stdout is not None
        process.stdout.close()


def test_the_clients_get_the_first_half_of_the_cpus_and_the_server_the_rest() -> None:
    assert split_cpus({0, 1}) == ({0}, {1})
    assert split_cpus({3, 1, 2, 0}) == ({0, 1}, {2, 3})
    assert split_cpus({0, 1, 2}) == ({0}, {1, 2})
    with pytest.raises(RuntimeError, match="two CPUs or more"):
        split_cpus({0})


@pytest.mark.parametrize(("factory", "dsn_fixture"), DIALECTS)
def test_only_this_process_trees_connections_move_and_all_get_their_cpus_back(
    factory: str, dsn_fixture: str, request: pytest.FixtureRequest
) -> None:
    dsn = request.getfixturevalue(dsn_fixture)
    harness = _harness(factory, dsn)
    before = os.sched_getaffinity(0)
    client, server = split_cpus(before)
    foreign, foreign_tid = _holder(dsn, 30, foreign=True)
    try:
        with server_cores(harness) as found:
            # A child started inside the block: on the client CPUs, its connection's server side moved.
            child, child_tid = _holder(dsn, 1.0)
            child_cpus = os.sched_getaffinity(child)
            time.sleep(0.5)
            during = {tid: os.sched_getaffinity(tid) for tid in (child_tid, foreign_tid)}
        assert child_cpus == client
        assert during == {child_tid: server, foreign_tid: before}
        assert found["pinned"] >= 1 and found["failures"] == []
        assert found["client_cpus"] == sorted(client) and found["server_cpus"] == sorted(server)
        assert os.sched_getaffinity(0) == before
        # Every thread it moved has its CPUs back (a PostgreSQL backend ends with its connection; a
        # MariaDB thread stays, in the thread cache).
        with contextlib.suppress(OSError):
            assert os.sched_getaffinity(child_tid) == before
        assert not (Path(tempfile.gettempdir()) / f"{STATE_PREFIX}{os.getpid()}.json").exists()
    finally:
        _end(foreign)
        harness.close()


@pytest.mark.mysql
def test_a_killed_runs_pinned_server_threads_get_their_cpus_back_at_the_next_run(mysql_dsn: str) -> None:
    # A MariaDB server thread outlives its connection (the thread cache): the state file is what mends it.
    from benchmarks.costs import _server_pid

    holder, tid = _holder(mysql_dsn, 10)
    try:
        before = os.sched_getaffinity(0)
        _client, server = split_cpus(before)
        path = f"/proc/{_server_pid([tid])}/task/{tid}/stat"
        text = Path(path).read_text()
        started = int(text[text.rindex(")") + 2 :].split()[19])
        os.sched_setaffinity(tid, server)
        # A pid no process has: the run that wrote it is gone.
        state = Path(tempfile.gettempdir()) / f"{STATE_PREFIX}99999999.json"
        state.write_text(json.dumps({path: [started, sorted(before)]}), encoding="utf-8")
        assert sweep_leftovers() >= 1
        assert os.sched_getaffinity(tid) == before and not state.exists()
    finally:
        _end(holder)


@pytest.mark.parametrize(("factory", "dsn_fixture"), DIALECTS)
def test_a_throughput_run_with_server_cores_says_where_it_ran(
    factory: str, dsn_fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from benchmarks.__main__ import limit_points_settings
    from benchmarks.progress import Progress
    from benchmarks.runner import run_all

    dsn = request.getfixturevalue(dsn_fixture)
    before = os.sched_getaffinity(0)
    settings = limit_points_settings(
        TINY.with_(
            benchmarks=("throughput",),
            profile=False,
            throughput_async=False,
            server_cores=True,
            table_suffix=f"_sc{table_suffix()}",
        ),
        "1x2",
    )
    results = run_all(
        [BackendSpec(f"conformance.builtin:{factory}", {"dsn": dsn})], settings, tmp_path, Progress()
    )
    (throughput,) = results["benchmarks"]["throughput"]
    assert "error" not in throughput, throughput.get("traceback")
    cores = throughput["server_cores"]
    # The drains', the raw loop's and the limit tool's connections all moved.
    assert cores["pinned"] >= 4 and cores["failures"] == [] and cores["restored"] >= 0
    assert os.sched_getaffinity(0) == before
    printed = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "the database on cores of its own (`--server-cores`): the clients (drains, pgbench, " in printed
