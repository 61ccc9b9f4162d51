"""Many worker hosts against one database: each host a network namespace with its own address.

4 hosts x 2 worker processes x 4 threads, two enqueuers: every job archived exactly once, each host
takes part, and the database sees each host's connections come from its own address (at most
processes x threads of them). Where namespaces cannot be made the run says why and uses plain
processes. PROLETARIAN_HOSTS_JOBS sets the size (default 1,000; python -m benchmarks.scale hosts runs
more).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fix_cluster import started_network_pg

from benchmarks.scale.hosts import make_hosts, run_hosts
from conformance import builtin
from proletarian_ref.backends.dsn import connection_factory

pytestmark = pytest.mark.cluster

JOBS = int(os.environ.get("PROLETARIAN_HOSTS_JOBS", "1000"))
HOSTS = 4
PROCESSES = 2
THREADS = 4


@pytest.mark.usefixtures("pg_server_binaries")
def test_workers_on_four_hosts_archive_every_job_exactly_once(tmp_path: Path) -> None:
    with make_hosts(HOSTS) as hosts, started_network_pg(hosts.server_addresses) as server:
        harness = builtin.postgresql(server.dsn, "scale_hosts_job", "scale_hosts_archived")
        harness.install()
        enqueue = connection_factory(server.dsn)
        result = run_hosts(
            harness,
            hosts,
            dsn_for=lambda host: f"postgresql://postgres@{host.server_address}:{server.port}/postgres",
            server_dsn=server.dsn,
            jobs=JOBS,
            processes=PROCESSES,
            threads=THREADS,
            enqueue_connects=[enqueue, enqueue],
            work_dir=tmp_path,
            timeout_s=55,
        )
        harness.close()
    figures = result.figures()
    print("hosts:", figures)
    assert figures["problems"] == []
    assert result.outcome.extra_runs == 0
    assert set(result.runs_per_host) == {host.name for host in hosts.hosts}, "every host took part"
    if hosts.namespaces:
        names = {host.name for host in hosts.hosts}
        assert names <= set(result.peak_connections_per_host), result.peak_connections_per_host
        # Per worker process: a connection per thread, the listener's (wake_on_notify), and the one its
        # test notification opens and closes at start.
        per_process = THREADS + 2
        assert all(result.peak_connections_per_host[n] <= PROCESSES * per_process for n in names)
    else:
        print(f"no network namespaces ({hosts.why_not}): the hosts were plain processes")
