"""enqueue_many: enqueue's rows for a batch, all or nothing, in the caller's transaction (issue 14.2)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, cast

import pytest
from support import T0, FakeClock

from conformance.harness import Harness, SqlHarness
from proletarian_ref import (
    Backend,
    ConfigurationError,
    DatabaseError,
    InvalidKeywordError,
    JobRecord,
    JobSpec,
    PayloadTooLargeError,
    SerializationError,
    db_generated_strategy,
    enqueue,
    enqueue_many,
)
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.backends.memory import MemoryBackend, MemoryDatabase
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.job_ids import default_job_id_strategy
from proletarian_ref.serializers import create_serializer

SERIALIZER = create_serializer()

# Payloads whose text tests COPY's and the drivers' escaping: tabs, newlines, backslashes, quotes, a
# character beyond the Basic Multilingual Plane, and Transit's own escapes.
PAYLOADS: list[Any] = [
    {"email": "a@b.c", "n": 1},
    [1, 2.5, None, True, "x"],
    "tab\there\nnewline\\backslash\r'quote'\"double\"",
    {"nested": {"deep": ["é", "日本", "\U0001f600"]}, "~tilde": "^caret"},
    None,
    2**70,
    "\\N",  # COPY's text format reads a bare \N as NULL
    "",
]


class ListedIds:
    """The dialect's own id layout, with ids handed out from a list, so two runs write the same ids."""

    def __init__(self, dialect: str, ids: list[uuid.UUID]) -> None:
        self._layout = default_job_id_strategy(dialect)
        self._ids = iter(ids)

    def generate_id(self) -> uuid.UUID:
        return next(self._ids)

    def encode_id(self, job_id: Any) -> Any:
        return self._layout.encode_id(job_id)

    def decode_id(self, value: Any) -> Any:
        return self._layout.decode_id(value)


def stored_rows(db: Harness) -> list[tuple[Any, ...]]:
    """Every column of every job as the server has it: text for PostgreSQL times, the raw bytes for MySQL."""
    if isinstance(db, SqlHarness):
        if db.dialect == "postgresql":
            columns = "job_id::text, queue, job_type, payload, attempts, enqueued_at::text, process_at::text"
        else:
            columns = "HEX(job_id), queue, job_type, HEX(payload), attempts, enqueued_at, process_at"
        return sorted(db.select(f"SELECT {columns} FROM {db.job_table}"))
    return sorted(tuple(job) for job in db.jobs())


def specs() -> list[JobSpec]:
    later = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    out: list[JobSpec] = []
    for n, payload in enumerate(PAYLOADS):
        choices: list[dict[str, Any]] = [{}, {"process_in": timedelta(seconds=90)}, {"process_at": later}]
        when = choices[n % 3]
        out.append(JobSpec(f"my.ns/job-{n}", payload, queue="mail" if n % 2 else None, **when))
    return out


@pytest.fixture
def caller(db: Harness) -> Iterator[Any]:
    conn = db.connect()
    try:
        yield conn
    finally:
        conn.close()


class OneByOneAndBatched(NamedTuple):
    ids: list[uuid.UUID]
    returned: list[Any]
    one_by_one: list[tuple[Any, ...]]
    batched: list[tuple[Any, ...]]


def one_by_one_and_batched(
    db: Harness, jobs: list[JobSpec], batch: list[Any] | None = None, **options: Any
) -> OneByOneAndBatched:
    """The rows single enqueues write for `jobs`, and those one enqueue_many of `batch` (default: `jobs`)
    writes, with the same ids and clock; `options` go to enqueue_many only."""
    ids = [uuid.uuid4() for _ in jobs]
    conn = db.connect()
    try:
        strategy = ListedIds(db.dialect, ids)
        for spec in jobs:
            enqueue(
                conn,
                spec.job_type,
                spec.payload,
                queue=spec.queue or "proletarian/default",
                process_at=spec.process_at,
                process_in=spec.process_in,
                job_table=db.job_table,
                job_id_strategy=strategy,
                clock=FakeClock(),
            )
        conn.commit()
        one_by_one = stored_rows(db)
        db.clear()
        returned = enqueue_many(
            conn,
            jobs if batch is None else batch,
            job_table=db.job_table,
            job_id_strategy=ListedIds(db.dialect, ids),
            clock=FakeClock(),
            **options,
        )
        conn.commit()
    finally:
        conn.close()
    return OneByOneAndBatched(ids, returned, one_by_one, stored_rows(db))


def test_enqueue_many_writes_exactly_the_rows_single_enqueues_write(db: Harness) -> None:
    written = one_by_one_and_batched(db, specs())
    assert written.returned == written.ids
    assert len(written.one_by_one) == len(PAYLOADS)
    assert written.batched == written.one_by_one


def test_enqueue_many_returns_the_ids_in_the_order_of_the_jobs(db: Harness, caller: Any) -> None:
    ids = enqueue_many(caller, [("a", n) for n in range(50)], job_table=db.job_table)
    caller.commit()
    strategy = default_job_id_strategy(db.dialect)
    by_id = {strategy.decode_id(job.job_id): SERIALIZER.decode(job.payload) for job in db.jobs()}
    assert [by_id[job_id] for job_id in ids] == list(range(50))


def test_a_plain_tuple_and_a_job_spec_are_the_same_job(db: Harness, caller: Any) -> None:
    enqueue_many(caller, [("a", 1), JobSpec("a", 1)], queue="q", job_table=db.job_table, clock=FakeClock())
    caller.commit()
    first, second = db.jobs()
    assert first._replace(job_id=None) == second._replace(job_id=None)
    assert (first.queue, first.enqueued_at, first.process_at) == (":q", T0, T0)


def test_an_empty_batch_writes_nothing_and_returns_no_ids(db: Harness, caller: Any) -> None:
    assert enqueue_many(caller, [], job_table=db.job_table) == []
    caller.commit()
    assert db.jobs() == []


BAD_JOBS = {
    "job_type": (("not a keyword", 1), InvalidKeywordError, "invalid job_type"),
    "queue": (JobSpec("a", 1, queue="bad queue"), InvalidKeywordError, "invalid queue"),
    "payload": (("a", object()), SerializationError, "cannot encode payload"),
    "process_at": (JobSpec("a", 1, process_at=datetime(2030, 1, 1)), ConfigurationError, "naive"),
    "item": (["a", 1], ConfigurationError, "JobSpec or a .job_type, payload. tuple"),
}


@pytest.mark.parametrize("bad", sorted(BAD_JOBS))
def test_a_bad_job_writes_no_job_of_the_batch_and_names_its_index(db: Harness, caller: Any, bad: str) -> None:
    job, error, message = BAD_JOBS[bad]
    jobs: list[Any] = [("a", n) for n in range(5)]
    jobs.insert(3, job)
    enqueue(caller, "before", 0, job_table=db.job_table)
    with pytest.raises(error, match=rf"^jobs\[3\]: .*{message}") as raised:
        enqueue_many(caller, jobs, job_table=db.job_table)
    assert raised.value.index == 3
    caller.commit()  # the caller's transaction is intact: its own earlier job is still there
    assert [job.job_type for job in db.jobs()] == [":before"]


def test_mysql_refuses_a_payload_too_large_at_its_index_before_any_insert(mysql_db: SqlHarness) -> None:
    conn = mysql_db.connect()
    try:
        jobs = [("a", "x" * 10), ("a", "x" * 10), ("a", "x" * 70_000), ("a", 1)]
        with pytest.raises(PayloadTooLargeError, match=r"^jobs\[2\]: payload is 70010 bytes") as raised:
            enqueue_many(
                conn, jobs, job_table=mysql_db.job_table, archived_job_table=mysql_db.archived_job_table
            )
        assert raised.value.index == 2
        conn.commit()
    finally:
        conn.close()
    assert mysql_db.jobs() == []


def test_mysql_refuses_a_time_its_timestamp_cannot_hold_at_its_index(mysql_db: SqlHarness) -> None:
    conn = mysql_db.connect()
    try:
        jobs = [JobSpec("a", 1), JobSpec("a", 2, process_at=datetime(2040, 1, 1, tzinfo=UTC))]
        with pytest.raises(ConfigurationError, match=r"^jobs\[1\]: process_at 2040") as raised:
            enqueue_many(conn, jobs, job_table=mysql_db.job_table)
        assert raised.value.index == 1
        conn.commit()
    finally:
        conn.close()
    assert mysql_db.jobs() == []


def test_a_database_error_in_the_insert_writes_no_job_of_the_batch(db: Harness, caller: Any) -> None:
    duplicate = uuid.uuid4()
    strategy = ListedIds(db.dialect, [duplicate, uuid.uuid4(), duplicate])
    with pytest.raises(DatabaseError):
        enqueue_many(caller, [("a", 1), ("a", 2), ("a", 3)], job_table=db.job_table, job_id_strategy=strategy)
    caller.rollback()  # PostgreSQL aborts the transaction; MySQL undoes the statement
    assert db.jobs() == []


def test_enqueue_many_joins_the_callers_transaction_and_never_commits(db: Harness, caller: Any) -> None:
    enqueue_many(caller, [("a", 1), ("b", 2)], job_table=db.job_table)
    assert db.jobs() == []  # another connection sees nothing before the caller commits
    caller.rollback()
    assert db.jobs() == []
    enqueue_many(caller, [("a", 1), ("b", 2)], job_table=db.job_table)
    caller.commit()
    assert sorted(job.job_type for job in db.jobs()) == [":a", ":b"]


@pytest.mark.parametrize("count", [20_000])
def test_a_batch_beyond_one_statements_limits_is_split_within_the_callers_transaction(
    db: Harness, caller: Any, count: int
) -> None:
    # 20,000 jobs of 7 values are 140,000 bind parameters, beyond PostgreSQL's 65,535 (COPY binds none)
    # and, on MySQL, twenty INSERTs of 1,000 rows.
    ids = enqueue_many(caller, [("a", n) for n in range(count)], job_table=db.job_table)
    assert db.jobs() == []
    caller.commit()
    strategy = default_job_id_strategy(db.dialect)
    by_id = {strategy.decode_id(job.job_id): SERIALIZER.decode(job.payload) for job in db.jobs()}
    assert [by_id[job_id] for job_id in ids] == list(range(count))


def _inserts(conn: Any) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Com_insert'")
        return int(cursor.fetchone()[1])


def test_mysql_splits_a_batch_by_size_so_each_insert_fits_the_packet(mysql_db: SqlHarness) -> None:
    conn = mysql_db.connect()
    try:
        # 60,000-character payloads: about 8 rows per 1 MiB statement, whatever max_allowed_packet is.
        jobs = [("a", f"{n:05}" + "x" * 60_000) for n in range(40)]
        before = _inserts(conn)
        ids = enqueue_many(conn, jobs, job_table=mysql_db.job_table)
        statements = _inserts(conn) - before
        conn.commit()
    finally:
        conn.close()
    assert 5 <= statements <= 8
    strategy = default_job_id_strategy("mysql")
    by_id = {strategy.decode_id(job.job_id): SERIALIZER.decode(job.payload)[:5] for job in mysql_db.jobs()}
    assert [by_id[job_id] for job_id in ids] == [f"{n:05}" for n in range(40)]


def test_a_failed_later_insert_of_a_mysql_batch_takes_the_earlier_ones_back_too(mysql_db: SqlHarness) -> None:
    conn = mysql_db.connect()
    try:
        enqueue(conn, "before", 0, job_table=mysql_db.job_table)
        ids = [uuid.uuid4() for _ in range(39)]
        # Several INSERTs of about 8 big rows; the last job repeats the first one's id.
        jobs = [("a", "x" * 60_000) for _ in range(40)]
        before = _inserts(conn)
        with pytest.raises(DatabaseError, match="Duplicate entry"):
            enqueue_many(
                conn, jobs, job_table=mysql_db.job_table, job_id_strategy=ListedIds("mysql", [*ids, ids[0]])
            )
        assert _inserts(conn) - before >= 5  # earlier statements did insert, before the savepoint undid them
        conn.commit()  # the caller's transaction goes on, with its own job and none of the batch
    finally:
        conn.close()
    assert [job.job_type for job in mysql_db.jobs()] == [":before"]


class PgWithoutCopy(PostgresBackend):
    """PostgreSQL as a SqlBackend without COPY sees it (a third party's, e.g. on psycopg2)."""

    _insert_rows = SqlBackend._insert_rows


def test_a_postgresql_sql_backend_without_copy_inserts_the_batch_with_multi_row_inserts(
    pg_db: SqlHarness,
) -> None:
    conn = pg_db.connect()
    try:
        # 2,500 jobs: three INSERTs of at most 1,000 rows (7,000 bind parameters each).
        ids = enqueue_many(
            conn, [("a", n) for n in range(2_500)], job_table=pg_db.job_table, backend=PgWithoutCopy()
        )
        conn.commit()
    finally:
        conn.close()
    by_id = {job.job_id: SERIALIZER.decode(job.payload) for job in pg_db.jobs()}
    assert [by_id[job_id] for job_id in ids] == list(range(2_500))


def test_postgresql_db_generated_ids_come_back_in_the_order_of_the_jobs(pg_db: SqlHarness) -> None:
    table = pg_db.job_table + "_serial"
    pg_db.execute(f"DROP TABLE IF EXISTS {table}")
    pg_db.execute(
        f"CREATE TABLE {table} (job_id BIGSERIAL PRIMARY KEY, queue TEXT NOT NULL, job_type TEXT NOT NULL, "
        "payload TEXT NOT NULL, attempts INTEGER NOT NULL, enqueued_at TIMESTAMPTZ NOT NULL, "
        "process_at TIMESTAMPTZ NOT NULL)"
    )
    conn = pg_db.connect()
    try:
        # 2,500 jobs: three INSERT ... RETURNING statements of at most 1,000 rows.
        ids = enqueue_many(
            conn, [("a", n) for n in range(2_500)], job_table=table, job_id_strategy=db_generated_strategy()
        )
        conn.commit()
    finally:
        conn.close()
    stored = {
        job_id: SERIALIZER.decode(payload)
        for job_id, payload in pg_db.select(f"SELECT job_id, payload FROM {table}")
    }
    assert [stored[job_id] for job_id in ids] == list(range(2_500))
    pg_db.execute(f"DROP TABLE {table}")


def test_mysql_refuses_db_generated_ids_for_a_batch(mysql_db: SqlHarness) -> None:
    conn = mysql_db.connect()
    try:
        with pytest.raises(ConfigurationError, match="database-generated id strategy on MySQL"):
            enqueue_many(
                conn, [("a", 1)], job_table=mysql_db.job_table, job_id_strategy=db_generated_strategy()
            )
    finally:
        conn.close()


class OneAtATimeBackend:
    """A backend written before enqueue_many: of the protocol, enqueue_many uses its dialect and enqueue."""

    dialect = "memory"

    def __init__(self, db: MemoryDatabase) -> None:
        self._inner = MemoryBackend(db)

    def enqueue(self, conn: Any, job_table: Any, job: JobRecord) -> Any:
        return self._inner.enqueue(conn, job_table, job)


def test_a_backend_without_enqueue_many_gets_one_enqueue_per_job() -> None:
    db = MemoryDatabase()
    backend = OneAtATimeBackend(db)
    assert not hasattr(backend, "enqueue_many")
    conn = db.connect()
    ids = enqueue_many(conn, [("a", 1), ("b", 2)], backend=cast(Backend, backend), clock=FakeClock())
    conn.commit()
    jobs = {job.job_id: job for job in db.jobs()}
    assert [SERIALIZER.decode(jobs[job_id].payload) for job_id in ids] == [1, 2]
    assert all(isinstance(job, JobRecord) and job.enqueued_at == T0 for job in jobs.values())


def test_the_memory_backend_writes_no_job_of_a_batch_with_a_duplicate_id() -> None:
    db = MemoryDatabase()
    conn = db.connect()
    same = uuid.uuid4()
    strategy = ListedIds("postgresql", [uuid.uuid4(), same, same])
    with pytest.raises(DatabaseError, match="duplicate key"):
        enqueue_many(conn, [("a", 1), ("a", 2), ("a", 3)], job_id_strategy=strategy)
    conn.commit()
    assert db.jobs() == []
