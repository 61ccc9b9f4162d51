"""PostgreSQL failover: the primary crashes under load, its synchronous standby is promoted.

Workers and enqueuers connect with one multi-host DSN (target_session_attrs=read-write), so after the
promotion libpq finds the new primary by itself. The failover is `pg_ctl promote` driven by the test
right after the crash (no failure detector: docs/scaling.md says why and what a real one adds).

PROLETARIAN_FAILOVER_JOBS sets the size (default 1,000; the benchmark runs 10,000:
python -m benchmarks.scale pg-failover).
"""

from __future__ import annotations

import os

import pytest
from fix_cluster import PostgresPair

from benchmarks.scale.scenario import run_load
from conformance import builtin
from proletarian_ref import log as ev
from proletarian_ref.backends.dsn import connection_factory

pytestmark = pytest.mark.cluster

JOBS = int(os.environ.get("PROLETARIAN_FAILOVER_JOBS", "1000"))
WORKERS = 2
THREADS = 3


def test_every_committed_job_is_archived_exactly_once_across_a_failover(pg_pair: PostgresPair) -> None:
    """The primary crashes with jobs in flight and enqueues committing; the standby is promoted.

    Every enqueue that committed is archived exactly once on the new primary (synchronous commit put it
    on the standby before the commit returned); an enqueue whose COMMIT got no answer is archived at most
    once. No worker stops: the same worker objects reconnect through the DSN. A handler may have run
    twice: at most once more per thread, for the job it had in flight.
    """
    harness = builtin.postgresql(pg_pair.dsn, "scale_failover_job", "scale_failover_archived")
    harness.install()
    harness.clear()
    source = connection_factory(pg_pair.dsn)

    def fail_over() -> None:
        pg_pair.primary.stop("immediate")
        pg_pair.standby.promote()

    outcome = run_load(
        harness,
        jobs=JOBS,
        worker_sources=[source] * WORKERS,
        threads=THREADS,
        enqueue_connects=[source, source],
        fault=fail_over,
        timeout_s=55,
    )
    print("postgresql failover:", outcome.figures())
    assert outcome.problems == []
    assert outcome.extra_runs <= WORKERS * THREADS
    assert outcome.fault_to_progress_s is not None, "no job was archived after the fault"
    assert outcome.events.named(ev.SQL_TRANSIENT_EXCEPTION), "the crash should have been noticed"
