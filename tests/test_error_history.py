"""Error history (proletarian_ref.error_history, docs/errors.md): each failed attempt's error in a side table.

On PostgreSQL, MySQL and memory (the `db` fixture): the worker writes one row per failure in the transaction
of the retry or the failure archive, a rolled-back transaction leaves none, a worker on tables without the
side table writes nothing of it, `retry` keeps the history, `show` shows it and `purge` deletes it.
"""

from __future__ import annotations

import asyncio
import functools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cli_support import isolate
from cli_support import run as cli

from conformance.harness import Harness, SqlHarness
from conformance.side_tables import prepare
from proletarian_ref import aio
from proletarian_ref.cli import ExitCode
from proletarian_ref.error_history import KEEP_ATTEMPTS, MAX_MESSAGE, TRUNCATED, ErrorEntry, find_store
from proletarian_ref.errors import FailedJobFnError
from proletarian_ref.job import enqueue
from proletarian_ref.ops import jobs as ops
from proletarian_ref.ops.db import Tables
from proletarian_ref.tables import table_name
from proletarian_ref.worker import process_next_job

NOW = datetime(2026, 1, 1, 10, 0, 0, tzinfo=UTC)
RETRY_AT_ONCE = {"retries": 2, "delays": [0]}


class Boom(Exception):
    """The handler's failure."""


def _fail(job_type: str, payload: Any) -> None:
    raise Boom(f"failed on {payload}")


def _enqueue(harness: Harness) -> Any:
    conn = harness.connect()
    try:
        job_id = enqueue(conn, "t/e", 7, clock=lambda: NOW, **harness.table_options)
        conn.commit()
    finally:
        conn.close()
    return job_id


def _history(harness: Harness, job_id: Any) -> list[ErrorEntry]:
    backend = harness.backend()
    stored = harness.job_id_strategy().encode_id(job_id)
    with backend.transaction() as conn:
        store = find_store(backend, conn, table_name(harness.job_table))
        assert store is not None
        return list(store.history(conn, stored))  # type: ignore[attr-defined]


def _run(harness: Harness, **options: Any) -> Any:
    settings = {
        "retry_strategy_fn": lambda job, exc: RETRY_AT_ONCE,
        "clock": lambda: NOW + timedelta(minutes=1),
        **harness.table_options,
        **options,
    }
    return process_next_job(harness.backend(), _fail, **settings)


def test_each_failed_attempt_is_kept_with_the_retry_and_the_failure_archive(db: Harness) -> None:
    prepare(db)
    job_id = _enqueue(db)
    for _ in range(3):
        assert _run(db) is not None
    assert db.jobs() == [] and len(db.archived_jobs()) == 1
    history = _history(db, job_id)
    assert [e.attempt for e in history] == [1, 2, 3]
    first = history[0]
    assert first.error_type == f"{__name__}.Boom" and first.message == "failed on 7"
    assert "_fail" in first.traceback and first.traceback.rstrip().endswith("Boom: failed on 7")
    assert first.failed_at == NOW + timedelta(minutes=1)
    assert first.host and first.queue_worker_id == "" and first.thread == ""


def test_a_rolled_back_failure_leaves_no_history(db: Harness) -> None:
    prepare(db)
    job_id = _enqueue(db)

    def failed_job_fn(job: Any, exc: BaseException) -> None:
        raise RuntimeError("the failure archive rolls back")

    with pytest.raises(FailedJobFnError):
        process_next_job(db.backend(), _fail, failed_job_fn=failed_job_fn, **db.table_options)
    assert [r.attempts for r in db.jobs()] == [0]
    assert _history(db, job_id) == []


def test_a_batch_keeps_the_history_of_its_failed_job_and_not_of_the_one_rolled_back(db: Harness) -> None:
    prepare(db)
    first, second = _enqueue(db), _enqueue(db)
    calls = []

    def failed_job_fn(job: Any, exc: BaseException) -> None:
        calls.append(job.job_id)
        if len(calls) == 2:
            raise RuntimeError("the second job's failure writes roll back to its savepoint")

    with pytest.raises(FailedJobFnError):
        process_next_job(db.backend(), _fail, failed_job_fn=failed_job_fn, batch_size=2, **db.table_options)
    assert [e.attempt for e in _history(db, calls[0])] == [1]
    assert _history(db, calls[1]) == []
    assert {calls[0], calls[1]} == {first, second}


def test_history_is_bounded_in_rows_and_text(db: Harness) -> None:
    prepare(db)
    job_id = _enqueue(db)

    def fail_long(job_type: str, payload: Any) -> None:
        raise Boom("x" * (MAX_MESSAGE * 2))

    for _ in range(KEEP_ATTEMPTS + 3):
        process_next_job(
            db.backend(), fail_long, retry_strategy_fn=lambda job, exc: {"retries": 100}, **db.table_options
        )
    history = _history(db, job_id)
    assert [e.attempt for e in history] == list(range(4, KEEP_ATTEMPTS + 4))
    assert len(history[0].message) == MAX_MESSAGE and history[0].message.endswith(TRUNCATED)


SQL_DBS = pytest.mark.parametrize("fixture", ["pg_db", "mysql_db"])


def _sql(request: pytest.FixtureRequest, fixture: str) -> SqlHarness:
    harness = request.getfixturevalue(fixture)
    assert isinstance(harness, SqlHarness)
    return harness


@SQL_DBS
def test_a_job_table_without_the_side_table_has_no_store(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    db = _sql(request, fixture)  # the in-memory twin is always there, as its unique and periodic twins are
    backend = db.backend()
    with backend.transaction() as conn:
        assert find_store(backend, conn, table_name(db.job_table + "_never_installed")) is None


@SQL_DBS
def test_retry_keeps_the_history_show_shows_it_and_purge_deletes_it(
    request: pytest.FixtureRequest,
    fixture: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    db = _sql(request, fixture)  # the operations run on SQL connections
    isolate(monkeypatch, tmp_path)
    dsn = request.getfixturevalue("pg_dsn" if fixture == "pg_db" else "mysql_dsn")
    prepare(db)
    job_id = _enqueue(db)
    _run(db, retry_strategy_fn=lambda job, exc: None)
    tables = Tables.of(db.job_table, db.archived_job_table)
    conn = db.connect()
    try:
        [result] = ops.retry_jobs(conn, [job_id], tables=tables, clock=lambda: NOW)
        assert result.outcome == "retried"
        assert _run(db, retry_strategy_fn=lambda job, exc: None)
        view = ops.show_job(conn, job_id, tables=tables)
        assert view is not None and view.errors is not None
        assert [e.attempt for e in view.errors] == [1, 1]
        shown = view.to_json(NOW)["errors"]
        assert shown[1]["message"] == "failed on 7" and shown[1]["error_type"] == f"{__name__}.Boom"
        argv = ["show", str(job_id), "--dsn", dsn, "--job-table", db.job_table]
        argv += ["--archived-job-table", db.archived_job_table]
        as_json = cli(capsys, *argv, "--json")
        assert as_json.code == ExitCode.OK, as_json.err
        assert json.loads(as_json.out)["errors"] == shown
        text = cli(capsys, *argv)
        assert text.code == ExitCode.OK, text.err
        assert text.out.count(f"): {__name__}.Boom: failed on 7\n") == 2 and "attempt 1 failed at" in text.out
        purged = ops.purge_archive(conn, ops.PurgeFilter(older_than=timedelta(0)), tables=tables)
        assert purged >= 1
    finally:
        conn.close()
    assert _history(db, job_id) == []


def test_the_async_worker_writes_the_history_the_threaded_one_writes(pg_db: SqlHarness, pg_dsn: str) -> None:
    prepare(pg_db)
    job_id = _enqueue(pg_db)

    async def fail(job_type: str, payload: Any) -> None:
        _fail(job_type, payload)

    async def twice() -> None:
        for _ in range(2):
            await aio.process_next_job(
                functools.partial(psycopg.AsyncConnection.connect, pg_dsn),
                fail,
                retry_strategy_fn=lambda job, exc: {"retries": 1},
                clock=lambda: NOW + timedelta(minutes=1),
                **pg_db.table_options,
            )

    asyncio.run(twice())
    assert pg_db.jobs() == [] and [r.status for r in pg_db.archived_jobs()] == [":failure"]
    history = _history(pg_db, job_id)
    assert [(e.attempt, e.message, e.failed_at) for e in history] == [
        (1, "failed on 7", NOW + timedelta(minutes=1)),
        (2, "failed on 7", NOW + timedelta(minutes=1)),
    ]
    assert "in fail" in history[0].traceback


def test_a_failed_lookup_at_start_is_logged_and_the_worker_runs_without_the_history() -> None:
    from contextlib import _GeneratorContextManager

    from proletarian_ref import log as ev
    from proletarian_ref.backends.memory import MemoryBackend, MemoryConnection
    from proletarian_ref.errors import TransientDatabaseError

    class DownAtFirst(MemoryBackend):
        calls = 0

        def transaction(self) -> _GeneratorContextManager[MemoryConnection, None, None]:
            DownAtFirst.calls += 1
            if DownAtFirst.calls == 1:
                raise TransientDatabaseError("the database is not reachable yet")
            return super().transaction()

    backend = DownAtFirst()
    conn = backend.db.connect()
    job_id = enqueue(conn, "t/e", 7, backend=backend)
    conn.commit()
    events: list[str] = []
    process_next_job(None, _fail, backend=backend, log=lambda event, data: events.append(event))
    assert events[0] == ev.ERROR_HISTORY_UNKNOWN and ev.NOT_RETRYING in events
    assert [row.job_id for row in backend.db.archived_jobs()] == [job_id]
    with backend.transaction() as conn:
        store = find_store(backend, conn, table_name("proletarian.job"))
        assert store is not None and store.history(conn, job_id) == []  # type: ignore[attr-defined]
