"""current_job(): a handler's writes and follow-up jobs commit in the job's own transaction (issue 25 §3)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from support import enqueue_committed

import proletarian_ref
from conformance.harness import SqlHarness
from proletarian_ref import JobTransactionError, current_job, process_next_job
from proletarian_ref.backend import STATUS_FAILURE, STATUS_SUCCESS

pytestmark = pytest.mark.sql_only


def run_one(db: SqlHarness, handler: Any, **options: Any) -> bool | None:
    return process_next_job(db.data_source, handler, **{**db.table_options, **options})


def test_a_handlers_write_and_follow_up_job_commit_with_the_archive_row(db: SqlHarness) -> None:
    enqueue_committed(db, "app/first", {"n": 1})
    seen: dict[str, Any] = {}

    def handler(job_type: str, payload: Any) -> None:
        tx = current_job()
        db.caller_write(tx.connection(), 7)
        seen["follow_up"] = tx.enqueue("app/second", {"n": 2})
        seen["job"] = tx.job.job_type
        # Uncommitted until the worker's commit: another session sees neither the write nor the job.
        seen["markers_inside"] = db.caller_markers()

    assert run_one(db, handler) is True
    assert seen["job"] == "app/first"
    assert seen["markers_inside"] == []
    assert db.caller_markers() == [7]
    [archived] = db.archived_jobs()
    assert archived.status == STATUS_SUCCESS
    [follow_up] = db.jobs()
    assert follow_up.job_type == ":app/second"
    assert str(db.job_id_strategy().decode_id(follow_up.job_id)) == str(seen["follow_up"])


def test_a_failing_handlers_writes_roll_back_while_its_failure_archive_commits(db: SqlHarness) -> None:
    enqueue_committed(db, "app/first", None)
    failed: list[Any] = []

    def handler(job_type: str, payload: Any) -> None:
        tx = current_job()
        db.caller_write(tx.connection(), 1)
        tx.enqueue("app/second", None)
        raise RuntimeError("boom")

    def failed_job_fn(job: Any, exc: BaseException) -> None:
        # failed_job_fn runs in the job's transaction after the handler's savepoint was rolled back.
        failed.append((job.job_type, str(exc), current_job_outside()))

    assert run_one(db, handler, failed_job_fn=failed_job_fn) is True
    assert db.caller_markers() == []
    assert db.jobs() == []
    [archived] = db.archived_jobs()
    assert archived.status == STATUS_FAILURE
    assert failed == [("app/first", "boom", "outside")]


def current_job_outside() -> str:
    try:
        current_job()
    except JobTransactionError:
        return "outside"
    return "inside"


def test_a_retried_handlers_writes_roll_back_and_the_retry_commits(db: SqlHarness) -> None:
    enqueue_committed(db, "app/first", None)

    def handler(job_type: str, payload: Any) -> None:
        db.caller_write(current_job().connection(), 1)
        raise RuntimeError("again")

    assert run_one(db, handler, retry_strategy_fn=lambda job, exc: {"retries": 1, "delays": [60_000]})
    assert db.caller_markers() == []
    [job] = db.jobs()
    assert job.attempts == 1
    assert db.archived_jobs() == []


@pytest.mark.parametrize("call", ["commit", "rollback", "close", "autocommit", "begin"])
def test_a_handler_that_tries_to_end_the_transaction_fails_the_job_with_nothing_written(
    db: SqlHarness, call: str
) -> None:
    enqueue_committed(db, "app/first", None)
    errors: list[BaseException] = []

    def handler(job_type: str, payload: Any) -> None:
        conn = current_job().connection()
        db.caller_write(conn, 1)
        getattr(conn, call)()

    def failed_job_fn(job: Any, exc: BaseException) -> None:
        errors.append(exc)

    assert run_one(db, handler, failed_job_fn=failed_job_fn) is True
    assert db.caller_markers() == []
    [archived] = db.archived_jobs()
    assert archived.status == STATUS_FAILURE
    assert isinstance(errors[0], JobTransactionError)
    assert call in str(errors[0])


def test_setting_autocommit_on_the_jobs_connection_is_refused(db: SqlHarness) -> None:
    enqueue_committed(db, "app/first", None)
    errors: list[BaseException] = []

    def handler(job_type: str, payload: Any) -> None:
        current_job().connection().autocommit = True

    run_one(db, handler, failed_job_fn=lambda job, exc: errors.append(exc))
    assert isinstance(errors[0], JobTransactionError)


@pytest.mark.parametrize("then_write", [False, True], ids=["commit", "commit-then-write"])
def test_a_commit_behind_the_guard_is_found_and_nothing_more_is_written(
    db: SqlHarness, then_write: bool
) -> None:
    """A COMMIT sent as SQL ends the worker's transaction: the worker finds it (the driver's transaction
    status, or the savepoint gone when the handler went on in a new transaction) and writes nothing more."""
    enqueue_committed(db, "app/first", None)

    def handler(job_type: str, payload: Any) -> None:
        conn = current_job().connection()
        db.caller_write(conn, 1)
        cursor = conn.cursor()
        cursor.execute("COMMIT")
        cursor.close()
        if then_write:
            db.caller_write(conn, 2)

    with pytest.raises(JobTransactionError, match="ended the job's transaction"):
        run_one(db, handler)
    assert db.caller_markers() == [1]  # what the handler committed itself stays: it said so
    assert db.archived_jobs() == []
    [job] = db.jobs()
    assert job.attempts == 0


def test_the_connection_refuses_use_after_the_handler_returned(db: SqlHarness) -> None:
    enqueue_committed(db, "app/first", None)
    kept: list[Any] = []

    def handler(job_type: str, payload: Any) -> None:
        kept.append(current_job().connection())

    run_one(db, handler)
    with pytest.raises(JobTransactionError, match="after its handler returned"):
        kept[0].cursor()


def test_current_job_outside_a_handler_says_so() -> None:
    with pytest.raises(JobTransactionError, match="only available inside a job's handler"):
        proletarian_ref.current_job()


def test_a_handler_that_never_asks_costs_no_savepoint(db: SqlHarness) -> None:
    """Without connection() or enqueue() the job runs Proletarian's statements only (no SAVEPOINT)."""
    enqueue_committed(db, "app/first", None)
    statements: list[str] = []
    backend = db.backend()
    original = backend._execute  # type: ignore[attr-defined]

    def execute(conn: Any, statement: str, *args: Any) -> Any:
        statements.append(statement)
        return original(conn, statement, *args)

    backend._execute = execute  # type: ignore[attr-defined]
    try:
        assert process_next_job(None, lambda t, p: None, backend=backend, **db.table_options)
    finally:
        backend.close()
    assert statements, "the spy saw no statement"
    assert not any("SAVEPOINT" in s.upper() for s in statements)


def sqlalchemy_engine(db: SqlHarness, request: pytest.FixtureRequest) -> Any:
    from sqlalchemy import create_engine

    dsn: str = request.getfixturevalue("pg_dsn" if db.dialect == "postgresql" else "mysql_dsn")
    scheme = "postgresql+psycopg" if db.dialect == "postgresql" else "mysql+pymysql"
    return create_engine(scheme + dsn[dsn.index("://") :])


def test_a_sqlalchemy_session_on_the_job_commits_with_the_archive_row(
    db: SqlHarness, request: pytest.FixtureRequest
) -> None:
    from sqlalchemy import text

    from proletarian_ref.integrations.sqlalchemy import data_source, job_session

    engine = sqlalchemy_engine(db, request)
    enqueue_committed(db, "app/first", None)
    enqueue_committed(db, "app/fails", None)
    insert = text(f"INSERT INTO {db.caller_table} (marker) VALUES (:m)")

    def handler(job_type: str, payload: Any) -> None:
        with job_session(engine) as session:
            session.execute(insert, {"m": 1 if job_type == "app/first" else 2})
            if job_type == "app/fails":
                raise RuntimeError("rolled back")
            # Not due yet, so the next poll takes app/fails (MySQL orders within a second by id).
            current_job().enqueue("app/follow-up", None, process_in=timedelta(hours=1))

    try:
        assert process_next_job(data_source(engine), handler, **db.table_options)
        assert process_next_job(data_source(engine), handler, **db.table_options)
    finally:
        engine.dispose()
    assert db.caller_markers() == [1]
    assert sorted(row.status for row in db.archived_jobs()) == [STATUS_FAILURE, STATUS_SUCCESS]
    assert [job.job_type for job in db.jobs()] == [":app/follow-up"]


def test_a_sqlalchemy_connection_commit_on_the_job_is_refused(
    db: SqlHarness, request: pytest.FixtureRequest
) -> None:
    from proletarian_ref.integrations.sqlalchemy import job_session

    engine = sqlalchemy_engine(db, request)
    enqueue_committed(db, "app/first", None)
    errors: list[BaseException] = []

    def handler(job_type: str, payload: Any) -> None:
        with job_session(engine) as session:
            db.caller_write(session.connection().connection.dbapi_connection, 1)
            session.connection().commit()

    try:
        run_one(db, handler, failed_job_fn=lambda job, exc: errors.append(exc))
    finally:
        engine.dispose()
    assert db.caller_markers() == []
    assert isinstance(errors[0], JobTransactionError)


def test_a_memory_error_rolls_the_whole_job_back_and_the_connection_serves_the_next_job(
    db: SqlHarness,
) -> None:
    """MemoryError leaves as it came (docs/worker.md): the handler's writes go with the transaction, and
    the job's savepoint is ended at once, not when collected inside the next job's transaction."""
    enqueue_committed(db, "app/first", None)
    backend = db.backend()

    def exhausted(job_type: str, payload: Any) -> None:
        db.caller_write(current_job().connection(), 1)
        raise MemoryError

    def writes(job_type: str, payload: Any) -> None:
        db.caller_write(current_job().connection(), 2)

    try:
        with pytest.raises(MemoryError):
            process_next_job(None, exhausted, backend=backend, **db.table_options)
        assert db.caller_markers() == []
        assert [job.attempts for job in db.jobs()] == [0]
        import gc

        gc.collect()
        assert process_next_job(None, writes, backend=backend, **db.table_options)
    finally:
        backend.close()
    assert db.caller_markers() == [2]
    assert [row.status for row in db.archived_jobs()] == [STATUS_SUCCESS]
