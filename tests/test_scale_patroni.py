"""PostgreSQL under Patroni: it decides, fences, promotes and lets rejoin; no job is lost or archived twice.

One Patroni cluster (etcd, a primary and a synchronous standby, HAProxy; tests/fix_patroni.py) takes the
faults in turn, each with load running on two paths to the leader at once: a libpq multi-host DSN with
target_session_attrs=read-write, and HAProxy routing on Patroni's REST health check. After each fault
every committed enqueue is archived exactly once on each path, and the old primary serves again as the
synchronous standby. The timings are printed, never asserted (the machine is shared).

PROLETARIAN_PATRONI_JOBS sets the jobs per path and fault (default 800; the benchmark's reference run:
python -m benchmarks.scale patroni).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from fix_patroni import PREFIX, PatroniCluster, start_time, sweep, sweep_leftovers

from benchmarks.scale.patroni import FAULTS, harnesses_for, run_round

JOBS = int(os.environ.get("PROLETARIAN_PATRONI_JOBS", "800"))
ROUND_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def paths(patroni_cluster: PatroniCluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both paths' harnesses (tables of their own) and data sources."""
    return harnesses_for(patroni_cluster)


@pytest.mark.cluster
@pytest.mark.xdist_group("patroni")
@pytest.mark.parametrize("fault", FAULTS)
def test_every_committed_job_is_archived_exactly_once_through_a_patroni_fault(
    patroni_cluster: PatroniCluster, paths: tuple[dict[str, Any], dict[str, Any]], fault: str
) -> None:
    """postmaster-kill: Patroni restarts the crashed primary in place (primary_start_timeout).
    switchover: patronictl hands the lead to the standby, the old primary follows it.
    agent-kill: the leader's agent dies, its node is reset as a watchdog would, the standby takes over
    after ttl, and the node comes back as a standby (pg_rewind if it had gone ahead).
    etcd-cut: the leader loses etcd, demotes itself after retry_timeout, the standby takes over after
    ttl, and the old primary rejoins once it reaches etcd again.
    """
    done = run_round(patroni_cluster, fault, *paths, jobs=JOBS, timeout_s=ROUND_TIMEOUT_S)
    print(f"patroni {fault}:", json.dumps(done.figures(), indent=1))
    assert done.problems == [], f"{fault} broke a promise: {done.problems}"
    if fault == "postmaster-kill":
        assert done.new_leader == done.old_leader, "a crashed postmaster is restarted in place"
    else:
        assert done.new_leader == patroni_cluster.other(done.old_leader), f"{fault} should move the lead"
    for path, outcome in done.outcomes.items():
        assert outcome.fault_to_recovery_s is not None, f"{fault}, {path}: no job archived after the fault"


def test_a_cluster_left_by_a_killed_run_is_swept_and_a_live_ones_is_kept() -> None:
    """After a kill -9 of pytest the PostgreSQL servers its agents started still run from the directory.

    A process stands in for them (`sleep`, working in the directory); the owner recorded is a process
    that has exited. The next cluster's sweep kills it and removes the directory, and leaves alone a
    directory whose owner (this test) still runs.
    """
    dead = Path(tempfile.mkdtemp(prefix=PREFIX))
    live = Path(tempfile.mkdtemp(prefix=PREFIX))
    leftover: subprocess.Popen[bytes] | None = None
    try:
        with subprocess.Popen(["true"]) as finished:
            finished.wait()
        (dead / "owner").write_text(f"{finished.pid} 0")
        (live / "owner").write_text(f"{os.getpid()} {start_time(os.getpid())}")
        leftover = subprocess.Popen(["sleep", "60"], cwd=dead)
        swept = sweep_leftovers()
        assert dead in swept and not dead.exists()
        assert live.exists() and live not in swept
        deadline = time.monotonic() + 10
        while leftover.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leftover.poll() is not None, "the process running from the swept directory survived"
    finally:
        if leftover is not None and leftover.poll() is None:
            leftover.kill()
        sweep(live)
        sweep(dead)
