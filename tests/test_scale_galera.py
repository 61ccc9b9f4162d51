"""MariaDB Galera, three nodes on loopback ports: one writer with failover, and workers spread over nodes.

A Galera node takes `SELECT ... FOR UPDATE SKIP LOCKED` locks only on itself. Workers on two nodes can
claim the same job; both run the handler, and certification aborts the one that commits second (1213,
deadlock), which the library treats as transient: the job rolls back with attempts unchanged, and the
archive still holds it once. With all workers on one node, the node's own locks keep every claim single.

PROLETARIAN_GALERA_JOBS sets the size of the load runs (default 1,000; the benchmark runs 10,000:
python -m benchmarks.scale galera).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fix_cluster import GaleraCluster, GaleraNode
from support import wait_until

from benchmarks.scale.scenario import EventLog, run_load
from conformance.contract import ContractTests
from conformance.harness import SqlHarness, load_harness
from conformance.properties import PropertyTests
from proletarian_ref import create_queue_worker, enqueue
from proletarian_ref import log as ev
from proletarian_ref.backends.dsn import connection_factory, failover_connection_factory
from proletarian_ref.errors import ConfigurationError

# One cluster per xdist worker is three servers: keep every Galera test on one worker (--dist loadgroup).
pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("galera")]

JOBS = int(os.environ.get("PROLETARIAN_GALERA_JOBS", "1000"))
FULL_SUITE_ENV = "PROLETARIAN_GALERA_FULL_SUITE"


def galera_harness(dsn: str, name: str) -> SqlHarness:
    table = f"proletarian.scale_gal_{name}"
    # Through load_harness, so the suite's worker processes can build the same harness.
    harness = load_harness(
        "conformance.builtin:mysql", dsn=dsn, job_table=f"{table}_job", archived_job_table=f"{table}_archived"
    )
    assert isinstance(harness, SqlHarness)
    harness.install()
    harness.clear()
    return harness


class TestGaleraOneWriter(ContractTests):
    """The conformance suite's contract on one node of the cluster (its writes replicated to the others)."""

    @pytest.fixture
    def harness(self, galera: GaleraCluster) -> Iterator[SqlHarness]:
        harness = galera_harness(galera.dsns[0], "suite")
        yield harness
        harness.close()


@pytest.mark.skipif(
    not os.environ.get(FULL_SUITE_ENV),
    reason=f"the property half of the suite takes about 4 minutes on Galera; {FULL_SUITE_ENV}=1 runs it",
)
class TestGaleraOneWriterProperties(PropertyTests):
    """The suite's property tests (the model test, competing threads) on the same node."""

    @pytest.fixture
    def harness(self, galera: GaleraCluster) -> Iterator[SqlHarness]:
        harness = galera_harness(galera.dsns[0], "suite")
        yield harness
        harness.close()


def test_one_writer_fails_over_and_archives_every_job_exactly_once(galera: GaleraCluster) -> None:
    """Every worker and enqueuer writes to the first node that is up; that node is killed mid-run.

    The failover factory sends new connections to the next node; the claims in flight on the dead node
    are lost (their handlers may have run: counted) and run again; every committed job is archived once.
    """
    dsns = galera.dsns
    # The test's own reads go to a node that survives; its tables reach every node (DDL replicates).
    harness = galera_harness(dsns[1], "failover")
    source = failover_connection_factory(dsns, connect_timeout=2)
    outcome = run_load(
        harness,
        jobs=JOBS,
        worker_sources=[source, source],
        threads=3,
        enqueue_connects=[source, source],
        fault=lambda: galera.nodes[0].stop("immediate"),
        timeout_s=55,
    )
    print("galera one writer, node 0 killed:", outcome.figures())
    assert outcome.problems == []
    # A thread loses at most the job it had in flight when the node died.
    assert outcome.extra_runs <= 2 * 3
    assert outcome.fault_to_progress_s is not None, "no job was archived after the fault"
    assert outcome.events.named(ev.SQL_TRANSIENT_EXCEPTION), "the lost node should have been noticed"


def test_workers_spread_over_nodes_may_run_a_job_twice_but_archive_it_once(galera: GaleraCluster) -> None:
    """One worker and one enqueuer per node: claims on different nodes do not see each other's locks.

    The loser of a double claim gets 1213 from certification at COMMIT, logged as a transient error; its
    transaction rolls back, so the archive keeps the winner's row only, and attempts are not spent.
    """
    harness = galera_harness(galera.dsns[0], "spread")
    sources = [connection_factory(dsn) for dsn in galera.dsns]
    outcome = run_load(
        harness,
        jobs=JOBS,
        worker_sources=sources,
        threads=2,
        enqueue_connects=sources,
        timeout_s=55,
    )
    print("galera spread over 3 nodes:", outcome.figures())
    assert outcome.problems == []
    transient = outcome.events.named(ev.SQL_TRANSIENT_EXCEPTION)
    # Every run beyond the first of a job is a claim that lost certification, and each is logged.
    assert outcome.extra_runs <= len(transient)
    assert all("1213" in text for text in transient), transient[:3]
    attempts = {row[0] for row in harness.select(f"SELECT attempts FROM {harness.archived_job_table}")}
    assert attempts == {1}, "a claim lost to certification does not count as an attempt"


def _on_node(dsn: str, statement: str) -> list[tuple[object, ...]]:
    import pymysql

    from proletarian_ref.backends.dsn import mysql_connect_kwargs

    conn = pymysql.connect(**mysql_connect_kwargs(dsn))
    try:
        with conn.cursor() as cursor:
            cursor.execute(statement)
            return list(cursor.fetchall())
    finally:
        conn.close()


def _set_isolated(dsn: str, isolated: bool) -> None:
    _on_node(dsn, f"SET GLOBAL wsrep_provider_options = 'gmcast.isolate={int(isolated)}'")


def _cluster_status(dsn: str) -> str:
    return str(_on_node(dsn, "SHOW STATUS LIKE 'wsrep_cluster_status'")[0][1])


def test_a_node_cut_off_from_the_cluster_answers_1047_which_is_transient(galera: GaleraCluster) -> None:
    """A node out of the primary component refuses statements with 1047 until it rejoins.

    The worker on it logs each as a transient error, drops the connection (a failover factory would
    then reach another node), and once the node is back drains the queue: nothing lost or doubled.
    """
    node = galera.nodes[0]
    harness = galera_harness(galera.dsns[1], "isolated")
    for n in range(20):
        conn = harness.connect()
        enqueue(conn, "scale/isolated", n, job_table=harness.job_table)
        conn.commit()
        conn.close()
    opened: list[int] = []
    connect = connection_factory(node.dsn)

    def counting() -> object:
        opened.append(1)
        return connect()

    _set_isolated(node.dsn, True)
    # Cut off, the node leaves the primary component once it suspects its peers (evs.suspect_timeout).
    assert wait_until(lambda: _cluster_status(node.dsn) == "non-Primary", timeout=30)
    log = EventLog()
    ran: list[int] = []
    worker = create_queue_worker(
        counting,
        lambda job_type, payload: ran.append(int(payload)),
        worker_threads=2,
        polling_interval_ms=10,
        log=log,
        **harness.table_options,
    )
    try:
        worker.start()
        assert wait_until(lambda: len(log.named(ev.SQL_TRANSIENT_EXCEPTION)) >= 3, timeout=30)
        assert ran == []
    finally:
        _set_isolated(node.dsn, False)
    try:
        assert wait_until(lambda: not harness.jobs(), timeout=45)
        assert worker.running
    finally:
        worker.stop()
        wait_until(lambda: _synced(node), timeout=60)
    errors = log.named(ev.SQL_TRANSIENT_EXCEPTION)
    assert any("1047" in text for text in errors), errors[:3]
    assert not log.named(ev.JOB_WORKER_ERROR)
    assert len(opened) > 2, "the threads replaced the connections that got 1047"
    assert sorted(ran) == list(range(20))
    assert len(harness.archived_jobs()) == 20


def _synced(node: GaleraNode) -> bool:
    try:
        node._ping()
    except Exception:
        return False
    return True


def test_a_failover_factory_with_no_node_up_raises_the_drivers_error_and_needs_a_node() -> None:
    """With no node reachable the last node's error is raised, as a plain factory's would be."""
    import pymysql
    from fix_throwaway import free_port

    down = [f"mysql://root@127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(pymysql.err.OperationalError, match="Can't connect"):
        failover_connection_factory(down, connect_timeout=1)()
    with pytest.raises(ConfigurationError, match="at least one DSN"):
        failover_connection_factory([])
