"""PgBouncer in transaction mode in front of PostgreSQL: what works, and the clear error for what does not.

The claim transaction holds one server connection from its SELECT ... FOR UPDATE SKIP LOCKED to its
COMMIT, so the worker needs nothing from the session and works through transaction pooling. psycopg's
automatic prepared statements do not: they live on one server connection, and the next transaction may
run on another (PgBouncer 1.18, Debian 12's).
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cli_support import isolate, run, run_cli, start_cli, subprocess_env, wait_for
from fix_cluster import PGBOUNCER_POOL_SIZE, PgBouncer
from support import RecordingLog, wait_until

from benchmarks.scale.scenario import run_load
from conformance import builtin
from conformance.harness import SqlHarness
from proletarian_ref import create_queue_worker, enqueue, process_next_job
from proletarian_ref import log as ev
from proletarian_ref.backends.dsn import connection_factory, postgresql_connect_args
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.errors import ConfigurationError, DatabaseError, TransientDatabaseError

pytestmark = pytest.mark.cluster

JOBS = 600
NO_PREPARE = "?prepare_threshold=none"


def _harness(pgbouncer: PgBouncer, name: str, dsn: str | None = None) -> SqlHarness:
    harness = builtin.postgresql(
        dsn or pgbouncer.dsn + NO_PREPARE, f"scale_pgb_{name}_job", f"scale_pgb_{name}_archived"
    )
    harness.install()
    harness.clear()
    return harness


def _server_connections(pgbouncer: PgBouncer) -> int:
    """Client backends on the PostgreSQL behind the bouncer (read directly, not through it)."""
    with psycopg.connect(pgbouncer.server.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> "
            "pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_prepared_statement_lost_behind_pgbouncer_is_a_clear_error_and_the_job_is_kept(
    pgbouncer: PgBouncer,
) -> None:
    """psycopg prepares the claim after 5 runs on one server connection; run 6 lands on another.

    The backend says what happened and what to do, as a DatabaseError that is not transient (retrying
    cannot cure it: the worker would fail on every other poll). The claim rolled back: the job is kept
    with attempts unchanged.
    """
    harness = _harness(pgbouncer, "prepared")
    for n in range(8):
        conn = harness.connect()
        enqueue(conn, "scale/prepared", n, job_table=harness.job_table)
        conn.commit()
        conn.close()
    backend = PostgresBackend(connection_factory(pgbouncer.dsn))  # psycopg's default prepare_threshold
    options: dict[str, Any] = {
        "job_table": harness.job_table,
        "archived_job_table": harness.archived_job_table,
    }
    try:
        # Alone, this client's transactions all run on the bouncer's one idle server connection.
        for _ in range(6):
            assert process_next_job(None, lambda t, p: None, backend=backend, **options)
        # Another client's open transaction takes that server connection; the next claim gets a new one.
        other = psycopg.connect(pgbouncer.dsn)
        try:
            other.execute("SELECT 1").fetchone()
            with pytest.raises(DatabaseError) as caught:
                process_next_job(None, lambda t, p: None, backend=backend, **options)
        finally:
            other.close()
    finally:
        backend.close()
    assert not isinstance(caught.value, TransientDatabaseError)
    message = str(caught.value)
    assert 'prepared statement "_pg3_' in message
    assert "PgBouncer in transaction mode" in message
    assert "prepare_threshold=None" in message
    assert "?prepare_threshold=none" in message
    assert [job.attempts for job in harness.jobs()] == [0, 0]


def test_workers_and_enqueuers_through_pgbouncer_archive_every_job_exactly_once(
    pgbouncer: PgBouncer,
) -> None:
    """Two workers of three threads and two enqueuers share the bouncer's four server connections.

    With prepare_threshold=None on every connection (the DSN option), no error of any kind; PostgreSQL
    sees at most the pool's connections, fewer than the clients.
    """
    harness = _harness(pgbouncer, "load")
    source = connection_factory(pgbouncer.dsn + NO_PREPARE)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            peak[0] = max(peak[0], _server_connections(pgbouncer))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outcome = run_load(
            harness,
            jobs=JOBS,
            worker_sources=[source, source],
            threads=3,
            enqueue_connects=[source, source],
            batch=20,
            timeout_s=50,
        )
    finally:
        stop.set()
        watcher.join()
    assert outcome.problems == []
    assert outcome.committed == set(range(JOBS))
    assert outcome.extra_runs == 0
    assert not outcome.events.named(ev.SQL_TRANSIENT_EXCEPTION)
    assert 0 < peak[0] <= PGBOUNCER_POOL_SIZE


def test_a_psycopg_pool_through_pgbouncer_works_with_prepare_threshold_none(pgbouncer: PgBouncer) -> None:
    """A pool lent to the worker, its connections made with prepare_threshold=None by the caller."""
    from psycopg_pool import ConnectionPool

    harness = _harness(pgbouncer, "pool")
    with ConnectionPool(
        pgbouncer.dsn, min_size=1, max_size=3, kwargs={"prepare_threshold": None}, open=True
    ) as pool:
        outcome = run_load(
            harness,
            jobs=JOBS // 3,
            worker_sources=[pool],
            threads=3,
            enqueue_connects=[connection_factory(pgbouncer.dsn + NO_PREPARE)],
            timeout_s=40,
        )
    assert outcome.problems == []


def test_the_cli_enqueues_runs_and_reports_through_pgbouncer(
    pgbouncer: PgBouncer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """schema install, enqueue, worker (3 threads, a subprocess) and stats, all with --dsn on the bouncer."""
    isolate(monkeypatch, tmp_path)
    job, archived = "scale_pgb_cli_job", "scale_pgb_cli_archived"
    dsn = pgbouncer.dsn + NO_PREPARE
    args = ["--dsn", dsn, "--job-table", job, "--archived-job-table", archived]
    harness = builtin.postgresql(pgbouncer.server.dsn, job, archived)
    harness.execute(f"DROP TABLE IF EXISTS {job}")
    harness.execute(f"DROP TABLE IF EXISTS {archived}")
    assert run(capsys, "schema", "install", *args).code == 0
    jobs = 30
    for n in range(jobs):
        result = run(capsys, "enqueue", "scale/cli", json.dumps({"n": n}), *args)
        assert result.code == 0, result.err
    worker = start_cli(
        "worker", "--handler", "cli_handlers:fails_when_asked", "--threads", "3",
        "--polling-interval-ms", "20", *args, env=subprocess_env(),
    )  # fmt: skip
    try:
        wait_for(lambda: not harness.jobs(), timeout=40, what="the worker to drain the queue", process=worker)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "job-worker-error" not in err
    stats = run_cli("stats", "--json", *args, env=subprocess_env())
    assert stats.code == 0, stats.err
    [queue] = json.loads(stats.out)["queues"]
    assert (queue["due"], queue["archived"]) == (0, {"success": jobs}), queue


def test_prepare_threshold_in_a_dsn_goes_to_psycopg_not_to_libpq() -> None:
    """libpq refuses options it does not know, so the DSN option is taken out of the conninfo."""
    assert postgresql_connect_args("postgresql://u@h:6432/db?prepare_threshold=none&sslmode=disable") == (
        "postgresql://u@h:6432/db?sslmode=disable",
        {"prepare_threshold": None},
    )
    assert postgresql_connect_args("postgresql://u@h/db?prepare_threshold=0") == (
        "postgresql://u@h/db",
        {"prepare_threshold": 0},
    )
    assert postgresql_connect_args("postgresql://u@h/db?connect_timeout=3") == (
        "postgresql://u@h/db?connect_timeout=3",
        {},
    )


@pytest.mark.parametrize("value", ["off", "-1", "", "5.5"])
def test_a_prepare_threshold_that_is_not_none_or_a_count_is_refused(value: str) -> None:
    with pytest.raises(ConfigurationError, match="prepare_threshold must be none or a whole number"):
        postgresql_connect_args(f"postgresql://u:secret@h/db?prepare_threshold={value}")


def test_behind_pgbouncer_in_transaction_mode_the_listener_says_so_and_polling_runs_notified_jobs(
    pgbouncer: PgBouncer,
) -> None:
    """LISTEN through transaction pooling holds on no server session: notifications never arrive.

    The worker's listener finds out with a test notification, logs listener-unconfirmed with what to
    do, and the jobs, notified or not, run at the polling interval. With listen_data_source= on the
    server directly, the listener hears the notifications sent through the bouncer.
    """
    harness = _harness(pgbouncer, "notify")
    done: list[Any] = []
    log = RecordingLog()
    options: dict[str, Any] = {"log": log, **harness.table_options}
    with create_queue_worker(
        harness.data_source, lambda t, p: done.append(p), polling_interval_ms=200, **options
    ):
        assert wait_until(lambda: bool(log.named(ev.LISTENER_UNCONFIRMED)), timeout=30)
        assert "listen_data_source" in log.named(ev.LISTENER_UNCONFIRMED)[0]["advice"]
        conn = harness.connect()
        enqueue(conn, "scale/notified", 1, job_table=harness.job_table, notify=True)
        conn.commit()
        conn.close()
        assert wait_until(lambda: done == [1])
    direct = connection_factory(pgbouncer.server.dsn)
    log = RecordingLog()
    options["log"] = log
    with create_queue_worker(
        harness.data_source,
        lambda t, p: done.append(p),
        polling_interval_ms=60_000,
        listen_data_source=direct,
        **options,
    ):
        assert wait_until(lambda: bool(log.named(ev.LISTENING_FOR_JOBS)), timeout=30)
        conn = harness.connect()
        enqueue(conn, "scale/notified", 2, job_table=harness.job_table, notify=True)
        conn.commit()
        conn.close()
        assert wait_until(lambda: done == [1, 2], timeout=5)  # woken: the interval is a minute
    assert not log.named(ev.LISTENER_UNCONFIRMED)
