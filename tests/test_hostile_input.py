"""Hostile names and values: table names are refused before any SQL runs, everything else is bound."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fix_db import table_suffix
from support import RecordingLog, wait_until

from conformance.harness import Harness, SqlHarness
from proletarian_ref import (
    ConfigurationError,
    InvalidKeywordError,
    create_queue_worker,
    enqueue,
    process_next_job,
)
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.schema import schema_statements

CANARY = f"proletarian.fault_canary_{table_suffix()}"

TABLE_NAME_ATTACKS = [
    "proletarian.job; DROP TABLE x",
    "job; DROP TABLE x; --",
    "proletarian.job --",
    "proletarian.job WHERE 1=1",
    "job /* comment */",
    'proletarian."job"',
    '"proletarian"."job"',
    "`proletarian`.`job`",
    "job' OR '1'='1",
    "proletarian.job)",
    "a.b.c",
    "proletarian.",
    ".job",
    "",
    " ",
    "job\x00",
    "job\n",
    "jöb",
    "1job",
    "x" * 64,
    "{job_table}",
    "%s",
]

VALUE_ATTACKS = [
    f"x'; DROP TABLE {CANARY}; --",
    f'x"; DROP TABLE {CANARY}; --',
    f"x`; DROP TABLE {CANARY}; --",
    f"x\\'; DROP TABLE {CANARY}; --",
    "x' OR '1'='1",
    "x'or'1'='1",
    "x\\",
    "x\\\\'",
    "%s",
    "%(queue)s",
    "%%",
    "%",
    "{job_table}",
    "{}",
    "$1",
    "?",
    ":x",
    "--",
    "/*",
    "*/",
    ";",
    "x\x00y",
    "x\u2028y",
    "é☃\U0001f600",
    "\\x27",
    "' || pg_sleep(5) || '",
    "'; SELECT SLEEP(5); --",
    "x" * 20_000,
]


class Tripwire:
    """Stands in for a connection or data source that must not be touched: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"SQL was about to run: .{name} was used")

    def __call__(self) -> Any:
        raise AssertionError("a connection was about to be opened")


@pytest.mark.parametrize("name", TABLE_NAME_ATTACKS, ids=repr)
def test_a_hostile_table_name_is_refused_before_any_sql(name: str) -> None:
    tripwire: Any = Tripwire()
    with pytest.raises(ConfigurationError, match=r"not a valid table name"):
        enqueue(tripwire, "fault/x", None, job_table=name, backend=PostgresBackend(None))
    for option in ("job_table", "archived_job_table"):
        options: dict[str, Any] = {option: name}
        with pytest.raises(ConfigurationError, match=option):
            create_queue_worker(tripwire, lambda *_: None, **options)
        with pytest.raises(ConfigurationError, match=option):
            process_next_job(tripwire, lambda *_: None, backend=PostgresBackend(None), **options)
        with pytest.raises(ConfigurationError, match=option):
            schema_statements("postgresql", **options)


@pytest.fixture
def canary(db: Harness) -> Iterator[SqlHarness]:
    """`db` with a table of its own next to the job tables, which no statement may touch."""
    assert isinstance(db, SqlHarness)
    db.execute(f"DROP TABLE IF EXISTS {CANARY}")
    db.execute(f"CREATE TABLE {CANARY} (id INTEGER PRIMARY KEY, note TEXT NOT NULL)")
    db.execute(f"INSERT INTO {CANARY} (id, note) VALUES (1, 'intact')")
    yield db
    db.execute(f"DROP TABLE IF EXISTS {CANARY}")


def accepted(text: str, what: str) -> bool:
    try:
        to_keyword_text(text, what=what)
    except InvalidKeywordError:
        return False
    return True


def hostile_session(db: SqlHarness, conn: Any) -> None:
    """On MySQL, the caller's session quotes the way an attacker hopes the driver did not expect."""
    if db.dialect == "mysql":
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES,ANSI_QUOTES')")


@pytest.mark.sql_only
def test_hostile_values_are_stored_and_run_verbatim_and_change_nothing_else(canary: SqlHarness) -> None:
    """Every queue, job type and payload string is a bound parameter: each one the keyword rules
    accept is stored and handed back exactly, each one they refuse raises InvalidKeywordError before
    any SQL, and afterwards the tables hold exactly the intended rows and the canary is untouched.
    """
    db = canary
    conn = db.connect()
    hostile_session(db, conn)
    queues = [value for value in VALUE_ATTACKS if accepted(value, "queue")]
    job_types = [value for value in VALUE_ATTACKS if accepted(value, "job_type")]
    try:
        for value in VALUE_ATTACKS:
            enqueue(conn, "fault/hostile-payload", value, job_table=db.job_table)
            if value in job_types:
                enqueue(conn, value, "job type", job_table=db.job_table)
            else:
                with pytest.raises(InvalidKeywordError, match="job_type"):
                    enqueue(conn, value, "job type", job_table=db.job_table)
            if value in queues:
                enqueue(conn, "fault/hostile-queue", value, queue=value, job_table=db.job_table)
            else:
                with pytest.raises(InvalidKeywordError, match="queue"):
                    enqueue(conn, "fault/hostile-queue", value, queue=value, job_table=db.job_table)
        conn.commit()
    finally:
        conn.close()
    assert queues and job_types, "some hostile text should pass the keyword rules and reach SQL"

    expected = len(VALUE_ATTACKS) + len(job_types) + len(queues)
    stored = db.jobs()
    assert len(stored) == expected
    assert sorted(job.queue for job in stored if job.job_type == ":fault/hostile-queue") == sorted(
        to_keyword_text(value, what="queue") for value in queues
    )

    ran: list[tuple[str, Any]] = []
    worker = create_queue_worker(
        db.data_source,
        lambda job_type, payload: ran.append((job_type, payload)),
        polling_interval_ms=10,
        log=RecordingLog(),
        **db.table_options,
    )
    with worker:
        assert wait_until(lambda: len(ran) == len(VALUE_ATTACKS) + len(job_types), timeout=30)
    for queue in queues:
        assert process_next_job(
            db.data_source,
            lambda job_type, payload: ran.append((job_type, payload)),
            queue=queue,
            **db.table_options,
        )

    assert sorted(payload for job_type, payload in ran if job_type == "fault/hostile-payload") == sorted(
        VALUE_ATTACKS
    )
    assert sorted(job_type for job_type, payload in ran if payload == "job type") == sorted(
        to_keyword_text(value, what="job_type")[1:] for value in job_types
    )
    assert sorted(payload for job_type, payload in ran if job_type == "fault/hostile-queue") == sorted(queues)
    assert db.jobs() == []
    archived = db.archived_jobs()
    assert len(archived) == expected and {row.status for row in archived} == {":success"}
    assert db.select(f"SELECT id, note FROM {CANARY}") == [(1, "intact")]
