"""The default logger's levels and payload, and how enqueue and workers find their backend."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from conformance.harness import SqlHarness
from proletarian_ref import ConfigurationError, create_queue_worker, enqueue, process_next_job
from proletarian_ref import log as ev
from proletarian_ref.backends import backend_for_connection, backend_for_data_source, dialect_of_connection
from proletarian_ref.backends.dsn import dialect_of_dsn, mysql_connect_kwargs, redact
from proletarian_ref.backends.memory import MemoryBackend


@pytest.mark.parametrize(
    ("event", "level"),
    [
        (ev.POLLING_FOR_JOBS, logging.DEBUG),
        (ev.HANDLING_JOB, logging.INFO),
        (ev.JOB_FINISHED, logging.INFO),
        (ev.RETRYING, logging.INFO),
        (ev.NOT_RETRYING, logging.ERROR),
        (ev.HANDLE_JOB_EXCEPTION, logging.ERROR),
        (ev.JOB_WORKER_ERROR, logging.ERROR),
        (ev.QUEUE_WORKER_SHUTDOWN_ERROR, logging.ERROR),
        (ev.HANDLE_JOB_EXCEPTION_WITH_INTERRUPT, logging.ERROR),
        (ev.SHUTTING_DOWN, logging.INFO),
    ],
)
def test_default_logger_uses_the_levels_proletarians_readme_suggests(
    event: str, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="proletarian_ref")
    ev.stdlib_logger(event, {ev.JOB_TYPE: "a"})
    [record] = caplog.records
    assert record.levelno == level
    assert record.getMessage().startswith(event)
    assert record.proletarian == {ev.JOB_TYPE: "a"}  # type: ignore[attr-defined]


def test_default_logger_keeps_the_exception_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="proletarian_ref")
    try:
        raise ValueError("boom")
    except ValueError as exc:
        ev.stdlib_logger(ev.HANDLE_JOB_EXCEPTION, {ev.EXCEPTION: exc})
    assert caplog.records[0].exc_info is not None


@pytest.mark.parametrize("listening", [True, False], ids=["info", "warning"])
def test_the_worker_logs_a_jobs_events_to_the_default_logger_only_when_it_listens_at_info(
    caplog: pytest.LogCaptureFixture, listening: bool
) -> None:
    backend = MemoryBackend()
    with backend.transaction() as conn:
        enqueue(conn, "log/job", {"n": 1}, backend=backend)
    caplog.set_level(logging.INFO if listening else logging.WARNING, logger="proletarian_ref")
    assert process_next_job(backend, lambda job_type, payload: None) is True
    events = [getattr(record, "proletarian_event", None) for record in caplog.records]
    assert events == ([ev.HANDLING_JOB, ev.JOB_FINISHED] if listening else [])


def test_the_dialect_comes_from_the_drivers_connection(pg_db: SqlHarness, mysql_db: SqlHarness) -> None:
    for db, dialect in ((pg_db, "postgresql"), (mysql_db, "mysql")):
        conn = db.connect()
        try:
            assert dialect_of_connection(conn) == dialect
            assert backend_for_connection(conn).dialect == dialect
        finally:
            conn.close()


def test_a_connection_of_an_unknown_driver_is_refused_with_advice() -> None:
    with pytest.raises(ConfigurationError, match="pass backend="):
        enqueue(object(), "a", None)


def test_a_connection_may_name_its_own_backend() -> None:
    backend = MemoryBackend()
    conn = backend.db.connect()
    assert isinstance(backend_for_connection(conn), MemoryBackend)
    enqueue(conn, "a", None)
    conn.commit()
    assert len(backend.db.jobs()) == 1


def test_a_data_source_that_is_neither_pool_nor_callable_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="data_source"):
        create_queue_worker(42, lambda t, p: None)


def test_a_factory_of_unknown_connections_is_refused_and_its_connection_closed() -> None:
    closed: list[bool] = []

    class Alien:
        def close(self) -> None:
            closed.append(True)

    with pytest.raises(ConfigurationError, match="cannot tell the database"):
        backend_for_data_source(Alien)
    assert closed == [True]


def test_a_psycopg_pool_is_a_data_source(pg_db: SqlHarness) -> None:
    from psycopg_pool import ConnectionPool

    with ConnectionPool(conninfo=_libpq(pg_db), min_size=1, max_size=2, open=True) as pool:
        assert backend_for_data_source(pool).dialect == "postgresql"


def _libpq(db: SqlHarness) -> str:
    conn: Any = db.connect()
    try:
        dsn: str = conn.info.dsn
        return dsn
    finally:
        conn.close()


def test_dsns_name_their_database_and_hide_their_password() -> None:
    assert dialect_of_dsn("postgresql://u@h/db") == "postgresql"
    assert dialect_of_dsn("mysql://u@h/db") == "mysql"
    assert redact("mysql://user:secret@h:3306/db") == "mysql://user:***@h:3306/db"
    with pytest.raises(ConfigurationError, match="postgresql:// or mysql://"):
        dialect_of_dsn("sqlite:///x.db")


def test_mysql_dsns_become_pymysql_arguments() -> None:
    assert mysql_connect_kwargs("mysql://app:p%40ss@db.local:3307/jobs?connect_timeout=5") == {
        "host": "db.local",
        "port": 3307,
        "user": "app",
        "password": "p@ss",
        "database": "jobs",
        "charset": "utf8mb4",
        "connect_timeout": 5,
    }
    with pytest.raises(ConfigurationError, match="unsupported MySQL DSN option"):
        mysql_connect_kwargs("mysql://h/db?sslmode=require")
