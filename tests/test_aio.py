"""proletarian_ref.aio on psycopg's AsyncConnection: the sync API's promises and errors (its rows and the
jobs both APIs run: tests/test_aio_each_database.py)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from aio_support import run
from support import RecordingLog

import proletarian_ref as pr
from conformance.harness import SqlHarness
from proletarian_ref import aio, enqueue, enqueue_many, process_next_job
from proletarian_ref import log as ev
from proletarian_ref.backends.postgres_async import AsyncPostgresBackend
from proletarian_ref.errors import ConfigurationError, JobInterrupted, ShutdownTimeoutError
from proletarian_ref.job import Job, JobSpec
from proletarian_ref.retry import RetryStrategy

pytestmark = pytest.mark.postgresql


@pytest.fixture
def pg(pg_db: SqlHarness, pg_dsn: str) -> Iterator[tuple[SqlHarness, str]]:
    yield pg_db, pg_dsn


def test_async_enqueue_joins_the_callers_transaction_and_never_commits(pg: tuple[SqlHarness, str]) -> None:
    db, dsn = pg

    async def scenario() -> psycopg.pq.TransactionStatus:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await aio.enqueue(conn, "t", 1, **db.table_options)
            await aio.enqueue_many(conn, [("t", 2), ("t", 3)], **db.table_options)
            status = conn.info.transaction_status
            await conn.rollback()
            return status

    assert run(scenario()) == psycopg.pq.TransactionStatus.INTRANS
    assert db.jobs() == []


def test_a_bad_job_in_async_enqueue_many_writes_none_and_names_its_index(pg: tuple[SqlHarness, str]) -> None:
    db, dsn = pg

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with pytest.raises(ConfigurationError, match=r"jobs\[1\]") as caught:
                bad = JobSpec("t", 2, "q", "not a time")  # type: ignore[arg-type]
                await aio.enqueue_many(conn, [("t", 1), bad], **db.table_options)
            assert caught.value.index == 1
            await conn.commit()

    run(scenario())
    assert db.jobs() == []


def test_async_enqueue_refuses_a_sync_connection_clearly(pg: tuple[SqlHarness, str]) -> None:
    db, _ = pg
    conn = db.connect()
    try:
        with pytest.raises(ConfigurationError, match="AsyncConnection"):
            run(aio.enqueue(conn, "t", 1))
    finally:
        conn.close()


def _factory(dsn: str) -> Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]:
    return functools.partial(psycopg.AsyncConnection.connect, dsn)


def test_the_async_worker_runs_coroutine_handlers_in_their_jobs_transaction(
    pg: tuple[SqlHarness, str],
) -> None:
    db, dsn = pg
    for n in range(5):
        conn = db.connect()
        enqueue(conn, "t", n, **db.table_options)
        conn.commit()
        conn.close()
    done: list[int] = []

    async def scenario() -> None:
        async def handler(job_type: str, payload: int) -> None:
            await asyncio.sleep(0)
            done.append(payload)

        worker = aio.create_queue_worker(
            _factory(dsn), handler, polling_interval_ms=20, worker_threads=2, **db.table_options
        )
        async with worker:
            for _ in range(1500):
                if len(done) == 5:
                    break
                await asyncio.sleep(0.02)

    run(scenario())
    assert sorted(done) == [0, 1, 2, 3, 4]
    assert db.jobs() == []
    assert sorted(job.status for job in db.archived_jobs()) == [":success"] * 5


def test_async_retries_then_failed_job_fn_as_a_coroutine(pg: tuple[SqlHarness, str]) -> None:
    db, dsn = pg
    conn = db.connect()
    enqueue(conn, "t", 1, **db.table_options)
    conn.commit()
    conn.close()
    failed: list[Job] = []

    async def handler(job_type: str, payload: int) -> None:
        raise ValueError("boom")

    async def failed_job_fn(job: Job, exc: BaseException) -> None:
        failed.append(job)

    options = {
        "retry_strategy_fn": lambda job, exc: RetryStrategy(retries=1),
        "failed_job_fn": failed_job_fn,
        **db.table_options,
    }
    assert run(aio.process_next_job(_factory(dsn), handler, **options)) is True
    assert [job.attempts for job in db.jobs()] == [1]  # retried: attempts + 1, due again at once
    assert run(aio.process_next_job(_factory(dsn), handler, **options)) is True
    assert db.jobs() == []
    assert [(job.status, job.attempts) for job in db.archived_jobs()] == [(":failure", 2)]
    assert [job.attempts for job in failed] == [2]


def test_async_batch_mode_and_compact_plan_archive_every_job(pg: tuple[SqlHarness, str]) -> None:
    db, dsn = pg
    conn = db.connect()
    enqueue_many(conn, [("t", n) for n in range(4)], **db.table_options)
    conn.commit()
    conn.close()
    seen: list[int] = []

    async def handler(job_type: str, payload: int) -> None:
        seen.append(payload)

    async def scenario() -> bool | None:
        backend = AsyncPostgresBackend(_factory(dsn), compact=True)
        try:
            return await aio.process_next_job(
                None, handler, backend=backend, batch_size=3, **db.table_options
            )
        finally:
            await backend.close()

    assert run(scenario()) is True
    assert sorted(seen) == [0, 1, 2]
    assert len(db.jobs()) == 1
    assert sorted(job.status for job in db.archived_jobs()) == [":success"] * 3


def test_stop_drains_a_handler_that_gives_back_and_releases_one_still_running(
    pg: tuple[SqlHarness, str],
) -> None:
    db, dsn = pg
    conn = db.connect()
    enqueue(conn, "polite", 1, **db.table_options)
    enqueue(conn, "stubborn", 2, **db.table_options)
    conn.commit()
    conn.close()
    started: list[str] = []
    log = RecordingLog()

    async def scenario() -> None:
        worker: aio.AsyncQueueWorker

        async def handler(job_type: str, payload: int) -> None:
            started.append(job_type)
            while not worker.stopping():
                await asyncio.sleep(0.01)
            if job_type == "polite":
                raise JobInterrupted("stopping")
            await asyncio.sleep(3600)  # ignores the request: cancelled at the deadline

        worker = aio.create_queue_worker(
            _factory(dsn),
            handler,
            worker_threads=2,
            polling_interval_ms=20,
            await_termination_timeout_ms=3000,  # the polite one drains well within it, even on a busy machine
            log=log,
            **db.table_options,
        )
        await worker.start()
        for _ in range(1500):
            if len(started) == 2:
                break
            await asyncio.sleep(0.02)
        with pytest.raises(ShutdownTimeoutError, match="released back to the queue"):
            await worker.stop()

    run(scenario())
    assert sorted(started) == ["polite", "stubborn"]
    # Both jobs are back, as they were: the interrupted one given back, the stuck one rolled back.
    assert sorted((job.job_type, job.attempts) for job in db.jobs()) == [(":polite", 0), (":stubborn", 0)]
    assert db.archived_jobs() == []
    assert len(log.named(ev.JOB_INTERRUPTED)) == 1 and len(log.named(ev.JOB_RELEASED)) == 1


def test_the_async_worker_refuses_a_sync_handler_and_bad_options(pg: tuple[SqlHarness, str]) -> None:
    db, dsn = pg

    async def handler(job_type: str, payload: Any) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"coroutine function .*asyncio\.to_thread"):
        aio.create_queue_worker(_factory(dsn), lambda t, p: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="worker_threads"):
        aio.create_queue_worker(_factory(dsn), handler, worker_threads=0)
    with pytest.raises(ConfigurationError, match="threaded one goes to"):
        aio.create_queue_worker(db.make_backend(), handler)


def test_the_async_workers_second_stop_only_logs_and_skips_on_shutdown(pg: tuple[SqlHarness, str]) -> None:
    db, dsn = pg
    calls: list[str] = []
    log = RecordingLog()

    async def on_shutdown() -> None:
        calls.append("shutdown")

    async def handler(job_type: str, payload: Any) -> None:
        return None

    async def scenario() -> list[bool | None]:
        worker = aio.create_queue_worker(
            _factory(dsn), handler, log=log, on_shutdown=on_shutdown, **db.table_options
        )
        answers = [await worker.stop(), await worker.start(), await worker.start(), worker.stopping()]
        answers += [await worker.stop(), worker.stopping(), await worker.stop(), await worker.start()]
        return answers

    # Never started; started; already started; not stopping; stopped; stopping; again; cannot restart.
    assert run(scenario()) == [None, True, None, False, True, True, True, None]
    assert calls == ["shutdown"]  # unlike the threaded worker's, a second stop() does not call it again
    assert len(log.named(ev.ALREADY_SHUT_DOWN)) == 1


def test_the_async_worker_warns_of_a_listener_whose_test_notification_did_not_arrive(
    pg: tuple[SqlHarness, str],
) -> None:
    db, dsn = pg
    log = RecordingLog()

    class UnconfirmedBackend(AsyncPostgresBackend):
        async def listen(self, job_table: Any, queue: str, data_source: Any = None) -> Any:
            listener = await super().listen(job_table, queue, data_source)
            listener.confirmed = False  # as behind PgBouncer in transaction mode
            return listener

    async def handler(job_type: str, payload: Any) -> None:
        return None

    async def scenario() -> None:
        backend = UnconfirmedBackend(_factory(dsn))
        worker = aio.create_queue_worker(None, handler, backend=backend, log=log, **db.table_options)
        async with worker:
            for _ in range(300):
                if log.named(ev.LISTENING_FOR_JOBS):
                    break
                await asyncio.sleep(0.05)
        await backend.close()

    run(scenario())
    assert log.named(ev.LISTENING_FOR_JOBS)
    [warning] = log.named(ev.LISTENER_UNCONFIRMED)
    assert "PgBouncer" in warning["advice"]


def test_a_notified_job_wakes_the_async_worker_before_its_poll(pg: tuple[SqlHarness, str]) -> None:
    db, dsn = pg
    done = asyncio.Event

    async def scenario() -> bool:
        finished = done()

        async def handler(job_type: str, payload: Any) -> None:
            finished.set()

        # One poll at start, then none for a minute: only the notification can run the job in time.
        worker = aio.create_queue_worker(
            _factory(dsn), handler, polling_interval_ms=60_000, **db.table_options
        )
        async with worker:
            await asyncio.sleep(0.5)
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                await aio.enqueue(conn, "t", 1, notify=True, **db.table_options)
                await conn.commit()
            try:
                await asyncio.wait_for(finished.wait(), 30)
            except TimeoutError:
                return False
        return True

    assert run(scenario()) is True


def test_an_async_connection_pool_serves_enqueue_and_the_worker_and_stays_open(
    pg: tuple[SqlHarness, str],
) -> None:
    from psycopg_pool import AsyncConnectionPool

    db, dsn = pg
    seen: list[Any] = []

    async def handler(job_type: str, payload: Any) -> None:
        seen.append(payload)

    async def scenario() -> bool:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
            async with pool.connection() as conn:
                await aio.enqueue(conn, "t", "pooled", **db.table_options)
            ran = await aio.process_next_job(pool, handler, **db.table_options)
            assert ran is True
            return not pool.closed  # the worker's backend closes what it opened, never the caller's pool

    assert run(scenario()) is True
    assert seen == ["pooled"]


def test_the_async_worker_takes_the_threaded_workers_options_and_no_others(
    pg: tuple[SqlHarness, str],
) -> None:
    from proletarian_ref.keywords import to_keyword_text
    from proletarian_ref.worker import WORKER_OPTION_DEFAULTS

    _, dsn = pg

    async def handler(job_type: str, payload: Any) -> None:
        return None

    worker = aio.create_queue_worker(_factory(dsn), handler)
    assert worker.settings.queue == to_keyword_text(WORKER_OPTION_DEFAULTS["queue"], what="queue")
    assert worker._interval == WORKER_OPTION_DEFAULTS["polling_interval_ms"] / 1000
    assert worker._await_timeout == WORKER_OPTION_DEFAULTS["await_termination_timeout_ms"] / 1000
    with pytest.raises(TypeError, match="polling_interval"):
        aio.create_queue_worker(_factory(dsn), handler, polling_interval=5)
    with pytest.raises(ConfigurationError, match="polling_interval_ms"):
        aio.create_queue_worker(_factory(dsn), handler, polling_interval_ms=0)


class _Abort(BaseException):
    """Not an Exception: what escapes a handler without being the job's failure."""


def test_a_handler_escaping_with_a_base_exception_rolls_back_and_leaves_the_job_claimable_at_once(
    pg: tuple[SqlHarness, str],
) -> None:
    db, dsn = pg
    conn = db.connect()
    enqueue(conn, "t", 1, **db.table_options)
    conn.commit()
    conn.close()

    async def abort(job_type: str, payload: Any) -> None:
        raise _Abort

    async def done(job_type: str, payload: Any) -> None:
        return None

    async def scenario() -> bool | None:
        backend = AsyncPostgresBackend(_factory(dsn))
        try:
            with pytest.raises(_Abort):
                await aio.process_next_job(None, abort, backend=backend, **db.table_options)
            # Rolled back, not left to the server to notice a closed connection: no lock remains.
            return await aio.process_next_job(None, done, backend=backend, **db.table_options)
        finally:
            await backend.close()

    assert run(scenario()) is True
    # attempts 1: the archive counts the run that finished; the rolled-back one left no trace.
    assert [(job.status, job.attempts) for job in db.archived_jobs()] == [(":success", 1)]


def test_the_threaded_api_refuses_asyncio_connections_pools_and_backends_by_name(
    pg: tuple[SqlHarness, str],
) -> None:
    from psycopg_pool import AsyncConnectionPool

    db, dsn = pg

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with pytest.raises(
                ConfigurationError, match=r"AsyncConnection is an asyncio one.*proletarian_ref\.aio"
            ):
                enqueue(conn, "t", 1, **db.table_options)
        pool = AsyncConnectionPool(dsn, open=False)
        with pytest.raises(ConfigurationError, match=r"AsyncConnectionPool is an asyncio one"):
            pr.create_queue_worker(pool, lambda t, p: None)
        with pytest.raises(ConfigurationError, match=r"AsyncPostgresBackend is an asyncio one"):
            process_next_job(None, lambda t, p: None, backend=AsyncPostgresBackend(_factory(dsn)))  # type: ignore[arg-type]

    run(scenario())
    assert db.jobs() == []


def test_a_stored_time_python_cannot_hold_is_read_as_the_nearest_by_the_async_backend(
    pg: tuple[SqlHarness, str],
) -> None:
    from datetime import UTC, datetime

    db, dsn = pg
    conn = db.connect()
    with conn.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {db.job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, "
            "process_at) VALUES (gen_random_uuid(), ':proletarian/default', ':t', '1', 0, '-infinity', "
            "'-infinity')"
        )
    conn.commit()
    conn.close()
    jobs: list[Job] = []

    async def handler(job: Job) -> None:
        jobs.append(job)

    # Without the lenient reading the claim fails on every poll, and the oldest job blocks its queue.
    assert run(aio.process_next_job(_factory(dsn), handler, handler_fn_mode="advanced", **db.table_options))
    assert [job.enqueued_at for job in jobs] == [datetime.min.replace(tzinfo=UTC)]


def test_interrupt_ends_a_listeners_wait_under_way_not_at_its_timeout(pg: tuple[SqlHarness, str]) -> None:
    # stop() interrupts the listener: before this, the wait sat out its listen tick (5 s), once a stop, and
    # the conformance suite's drains over the bridge spent most of their time there.
    db, dsn = pg

    async def main() -> tuple[bool, bool]:
        backend = AsyncPostgresBackend(functools.partial(psycopg.AsyncConnection.connect, dsn))
        listener = await backend.listen(db.table_options["job_table"], "interrupted/queue")
        try:
            waiting = asyncio.create_task(listener.wait(3600))
            await asyncio.sleep(0.2)
            listener.interrupt()
            # An hour's wait that ends here ended because of interrupt(); the bound only keeps a broken
            # interrupt from hanging the run.
            done, _ = await asyncio.wait({waiting}, timeout=60)
            ended = waiting in done
            if not ended:
                waiting.cancel()
            again = await listener.wait(3600)  # after interrupt(), every wait returns at once
            return ended and not waiting.result(), again
        finally:
            await listener.close()

    assert run(main()) == (True, False)
