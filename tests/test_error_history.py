"""Error history (proletarian_ref.error_history, docs/errors.md): each failed attempt's error in a side table.

On PostgreSQL, MySQL and memory (the `db` fixture): the worker writes one row per failure in the transaction
of the retry or the failure archive, a rolled-back transaction leaves none, a worker on tables without the
side table writes nothing of it, `retry` keeps the history, `show` shows it and `purge` deletes it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cli_support import isolate
from cli_support import run as cli
from support import wait_until

from conformance.harness import Harness, SqlHarness
from conformance.side_tables import prepare
from proletarian_ref import aio, side_tables
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.backends.mysql import MySQLBackend
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.cli import ExitCode
from proletarian_ref.error_history import (
    KEEP_ATTEMPTS,
    MAX_MESSAGE,
    MAX_TRACEBACK,
    TRUNCATED,
    ErrorEntry,
    ErrorHistory,
    find_store,
)
from proletarian_ref.errors import FailedJobFnError, TransientDatabaseError
from proletarian_ref.job import enqueue
from proletarian_ref.log import null_logger as no_log
from proletarian_ref.ops import jobs as ops
from proletarian_ref.ops.db import Tables
from proletarian_ref.schema import install
from proletarian_ref.tables import table_name
from proletarian_ref.worker import create_queue_worker, job_settings, process_next_job, run_next_job

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


class _Noting(SqlBackend):
    """Notes each statement it sends and the thread that sends it; fails the first `failing_lookups`
    lookups of a side table as a lost connection would."""

    sent: list[tuple[str, int]]
    failing_lookups = 0

    def _execute(self, conn: Any, statement: str, params: Any, read: Any, *, copy: bool = False) -> Any:
        self.sent.append((statement, threading.get_ident()))
        if _is_lookup(statement) and self.failing_lookups:
            self.failing_lookups -= 1
            raise TransientDatabaseError("the connection was lost during the lookup")
        return super()._execute(conn, statement, params, read, copy=copy)


def _is_lookup(statement: str) -> bool:
    return "to_regclass" in statement or "information_schema.TABLES" in statement


def _noting(db: SqlHarness, failing_lookups: int = 0) -> Any:
    base = PostgresBackend if db.dialect == "postgresql" else MySQLBackend
    backend = type(f"Noting{base.__name__}", (_Noting, base), {})(db.data_source)
    backend.sent = []
    backend.failing_lookups = failing_lookups
    return backend


def _bare_tables(db: SqlHarness) -> dict[str, Any]:
    """A job table and archive of their own, with no side table beside them (dropped if a run left one)."""
    names: dict[str, Any] = {
        "job_table": db.job_table + "_bare",
        "archived_job_table": db.archived_job_table + "_bare",
    }
    conn = db.connect()
    try:
        install(conn, **names)
    finally:
        conn.close()
    db.execute(f"DROP TABLE IF EXISTS {side_tables.side_table(names['job_table'], 'errors')}")
    db.execute(f"DELETE FROM {names['job_table']}")
    db.execute(f"DELETE FROM {names['archived_job_table']}")
    return names


@SQL_DBS
def test_a_worker_without_the_side_table_looks_once_at_its_first_failure_on_its_own_thread(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    """No statement on the caller's thread at start(), none for a job that succeeds, and one catalog read
    in the first failed job's transaction for the worker's life; nothing else beyond Proletarian's."""
    db = _sql(request, fixture)
    tables = _bare_tables(db)
    conn = db.connect()
    try:
        for n, payload in enumerate(["ok", "fail", "fail", "ok", "fail"]):
            at = NOW + timedelta(seconds=n)
            enqueue(conn, "t/e", payload, clock=functools.partial(lambda at: at, at), **tables)
        conn.commit()
    finally:
        conn.close()

    def handle(job_type: str, payload: Any) -> None:
        if payload == "fail":
            raise Boom(payload)

    backend = _noting(db)
    worker = create_queue_worker(
        None,
        handle,
        backend=backend,
        clock=lambda: NOW + timedelta(minutes=1),
        polling_interval_ms=20,
        **tables,
    )
    caller = threading.get_ident()
    try:
        worker.start()
        assert wait_until(lambda: len(db.select(f"SELECT 1 FROM {tables['archived_job_table']}")) == 5)
    finally:
        worker.stop()
        backend.close()
    assert [thread for _, thread in backend.sent if thread == caller] == [], (
        "a statement on the caller's thread"
    )
    statements = [text for text, _ in backend.sent]
    assert len([text for text in statements if _is_lookup(text)]) == 1
    first_failure = next(i for i, text in enumerate(statements) if _is_lookup(text))
    # The lookup comes after the first failed job's claim, and no job before it asked: the success first.
    assert sum("INSERT INTO" in text for text in statements[:first_failure]) == 1
    side_table = str(side_tables.side_table(tables["job_table"], "errors"))
    assert not [text for text in statements if side_table in text and not _is_lookup(text)]


@SQL_DBS
def test_a_failed_lookup_fails_that_jobs_writes_and_the_next_failure_looks_again(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    """The lookup runs in the job's transaction: when it raises (a lost connection), the job's writes fail
    as they would on any of their statements, the job stays queued as it was, and nothing is kept: the
    next failure looks again and writes its row."""
    db = _sql(request, fixture)
    prepare(db)
    job_id = _enqueue(db)
    backend = _noting(db, failing_lookups=1)
    settings = job_settings(
        backend, retry_strategy_fn=lambda job, exc: None, clock=lambda: NOW, **db.table_options
    )
    try:
        with pytest.raises(TransientDatabaseError):
            run_next_job(backend, settings, _fail, no_log, {}, threading.Event())
        assert [job.attempts for job in db.jobs()] == [0] and db.archived_jobs() == []
        assert _history(db, job_id) == []
        assert run_next_job(backend, settings, _fail, no_log, {}, threading.Event()) is True
        assert [e.attempt for e in _history(db, job_id)] == [1]
        _enqueue(db)
        assert run_next_job(backend, settings, _fail, no_log, {}, threading.Event()) is True
    finally:
        backend.close()
    assert len([text for text, _ in backend.sent if _is_lookup(text)]) == 2, "kept after the first answer"


def test_threads_whose_first_failures_come_together_keep_one_answer() -> None:
    history = ErrorHistory()
    first, second = object(), object()
    assert history._keep(first) is first
    assert history._keep(second) is first


def test_the_docs_quote_the_bounds_the_code_keeps() -> None:
    text = re.sub(r"\s+", " ", (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text())
    assert f"`str(exception)`, at most {MAX_MESSAGE} characters (`error_history.MAX_MESSAGE`)" in text
    assert f"at most {MAX_TRACEBACK} characters (`MAX_TRACEBACK`)" in text
    assert f"A job keeps its newest {KEEP_ATTEMPTS} rows (`KEEP_ATTEMPTS`)" in text
    assert f"ends in `{TRUNCATED.strip()}`" in text
