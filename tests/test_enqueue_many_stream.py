"""enqueue_many on PostgreSQL streams its COPY as the jobs are made, and a bad job found part-way writes
nothing and leaves the caller's connection as it was (issue 14.2)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any, cast

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from conformance.harness import SqlHarness
from proletarian_ref import (
    Backend,
    ConfigurationError,
    DatabaseError,
    InvalidKeywordError,
    JobRecord,
    JobSpec,
    ProletarianError,
    SerializationError,
    enqueue_many,
)
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.backends.memory import MemoryBackend, MemoryDatabase
from proletarian_ref.backends.postgres import _COPY_ROWS_PER_WRITE, PostgresBackend
from proletarian_ref.serializers import create_serializer

SERIALIZER = create_serializer()
BATCH = 1_000  # several COPY chunks: the COPY starts before the last job is made
BAD_JOBS = {
    "payload": (("a", object()), SerializationError, "cannot encode payload"),
    "job_type": (("not a keyword", 1), InvalidKeywordError, "invalid job_type"),
    "process_at": (JobSpec("a", 1, process_at=datetime(2030, 1, 1)), ConfigurationError, "naive"),
}
CALLER_STATES = ["in a transaction", "no transaction", "autocommit"]


@pytest.fixture
def caller(pg_db: SqlHarness) -> Iterator[psycopg.Connection[Any]]:
    conn = pg_db.connect()
    try:
        yield conn
    finally:
        conn.close()


def batch_with(bad: Any, at: int) -> list[Any]:
    jobs: list[Any] = [("a", n) for n in range(BATCH)]
    jobs[at] = bad
    return jobs


def assert_no_savepoint_left(conn: psycopg.Connection[Any]) -> None:
    """The library's savepoint is not in the caller's transaction (probed inside one of the test's own)."""
    conn.execute("SAVEPOINT probe")
    with pytest.raises(psycopg.errors.InvalidSavepointSpecification):
        conn.execute("RELEASE SAVEPOINT proletarian_enqueue_many")
    conn.execute("ROLLBACK TO SAVEPOINT probe")


@pytest.mark.parametrize("state", CALLER_STATES)
@pytest.mark.parametrize("at", [0, BATCH // 2, BATCH - 1])
def test_a_bad_job_at_any_point_of_a_streamed_batch_writes_none_and_leaves_the_connection_as_it_was(
    pg_db: SqlHarness, caller: psycopg.Connection[Any], state: str, at: int
) -> None:
    if state == "autocommit":
        caller.autocommit = True
    if state == "in a transaction":
        pg_db.caller_write(caller, 7)
    before = caller.info.transaction_status
    with pytest.raises(SerializationError, match=rf"^jobs\[{at}\]: .*cannot encode payload") as raised:
        enqueue_many(caller, batch_with(("a", object()), at), job_table=pg_db.job_table)
    assert raised.value.index == at
    assert caller.info.transaction_status == before  # usable, and a transaction only if it had one
    if state == "in a transaction":
        assert_no_savepoint_left(caller)
        caller.execute("SELECT 1")
    # The connection goes on: a good batch after the bad one, then the caller's commit.
    enqueue_many(caller, [("after", n) for n in range(BATCH)], job_table=pg_db.job_table)
    if state != "autocommit":
        caller.commit()
    assert {job.job_type for job in pg_db.jobs()} == {":after"}
    assert len(pg_db.jobs()) == BATCH
    assert pg_db.caller_markers() == ([7] if state == "in a transaction" else [])


def test_a_bad_job_mid_stream_inside_a_psycopg_transaction_block_leaves_the_block_going_on(
    pg_db: SqlHarness, caller: psycopg.Connection[Any]
) -> None:
    with caller.transaction():
        pg_db.caller_write(caller, 1)
        with caller.transaction():  # psycopg's own savepoint, around the library's
            with pytest.raises(SerializationError, match=r"^jobs\[700\]: "):
                enqueue_many(caller, batch_with(("a", object()), 700), job_table=pg_db.job_table)
            pg_db.caller_write(caller, 2)
        enqueue_many(caller, [("after", 1)], job_table=pg_db.job_table)
    assert pg_db.caller_markers() == [1, 2]
    assert [job.job_type for job in pg_db.jobs()] == [":after"]


@pytest.mark.parametrize("bad", sorted(BAD_JOBS))
def test_every_kind_of_bad_job_found_mid_stream_names_its_index(
    pg_db: SqlHarness, caller: psycopg.Connection[Any], bad: str
) -> None:
    job, error, message = BAD_JOBS[bad]
    pg_db.caller_write(caller, 1)
    at = _COPY_ROWS_PER_WRITE * 2 + 3
    with pytest.raises(error, match=rf"^jobs\[{at}\]: .*{message}") as raised:
        enqueue_many(caller, batch_with(job, at), job_table=pg_db.job_table)
    assert raised.value.index == at
    assert_no_savepoint_left(caller)
    caller.commit()
    assert pg_db.jobs() == []
    assert pg_db.caller_markers() == [1]


class StatusRecordingSerializer:
    """The default serializer, noting the connection's transaction status at each encode."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.statuses: list[TransactionStatus] = []

    def encode(self, value: Any) -> str:
        self.statuses.append(self.conn.info.transaction_status)
        return SERIALIZER.encode(value)

    def decode(self, text: str) -> Any:
        return SERIALIZER.decode(text)


def test_the_copy_starts_before_the_last_job_of_a_long_batch_is_encoded(
    pg_db: SqlHarness, caller: psycopg.Connection[Any]
) -> None:
    serializer = StatusRecordingSerializer(caller)
    enqueue_many(caller, [("a", n) for n in range(BATCH)], job_table=pg_db.job_table, serializer=serializer)
    caller.commit()
    # ACTIVE: the connection is inside the COPY. The first chunk is made before it starts.
    assert set(serializer.statuses[:_COPY_ROWS_PER_WRITE]) == {TransactionStatus.IDLE}
    assert set(serializer.statuses[_COPY_ROWS_PER_WRITE + 1 :]) == {TransactionStatus.ACTIVE}
    assert len(pg_db.jobs()) == BATCH


class CountingBackend(PostgresBackend):
    def __init__(self) -> None:
        super().__init__()
        self.statements: list[str] = []

    def _execute(self, conn: Any, statement: str, params: Any, read: Any, *, copy: bool = False) -> Any:
        self.statements.append(statement.split(maxsplit=1)[0])
        return super()._execute(conn, statement, params, read, copy=copy)


@pytest.mark.parametrize("state", CALLER_STATES)
def test_a_batch_of_one_chunk_is_made_whole_first_and_takes_no_savepoint(
    pg_db: SqlHarness, caller: psycopg.Connection[Any], state: str
) -> None:
    caller.autocommit = state == "autocommit"
    if state == "in a transaction":
        pg_db.caller_write(caller, 1)
    backend = CountingBackend()
    jobs: list[Any] = [("a", n) for n in range(_COPY_ROWS_PER_WRITE)]
    with pytest.raises(SerializationError, match=rf"^jobs\[{_COPY_ROWS_PER_WRITE - 1}\]: "):
        enqueue_many(caller, [*jobs[:-1], ("a", object())], job_table=pg_db.job_table, backend=backend)
    assert backend.statements == []  # found before any SQL
    enqueue_many(caller, jobs, job_table=pg_db.job_table, backend=backend)
    assert backend.statements == ["COPY"]


def test_a_streamed_batch_in_a_transaction_takes_one_savepoint_and_releases_it(
    pg_db: SqlHarness, caller: psycopg.Connection[Any]
) -> None:
    pg_db.caller_write(caller, 1)
    backend = CountingBackend()
    enqueue_many(caller, [("a", n) for n in range(BATCH)], job_table=pg_db.job_table, backend=backend)
    assert backend.statements == ["SAVEPOINT", "COPY", "RELEASE"]
    assert_no_savepoint_left(caller)
    caller.commit()
    assert len(pg_db.jobs()) == BATCH and pg_db.caller_markers() == [1]


def test_a_database_error_in_a_streamed_batch_leaves_the_callers_transaction_usable(
    pg_db: SqlHarness, caller: psycopg.Connection[Any]
) -> None:
    pg_db.caller_write(caller, 1)
    ids = [uuid.uuid4() for _ in range(BATCH - 1)]
    strategy = ListedIds([*ids, ids[0]])  # the last job repeats the first one's id
    with pytest.raises(DatabaseError, match="duplicate key"):
        enqueue_many(
            caller, [("a", n) for n in range(BATCH)], job_table=pg_db.job_table, job_id_strategy=strategy
        )
    assert_no_savepoint_left(caller)
    caller.commit()
    assert pg_db.jobs() == [] and pg_db.caller_markers() == [1]


class ListedIds:
    """PostgreSQL's ids, handed out from a list."""

    def __init__(self, ids: list[uuid.UUID]) -> None:
        self._ids = iter(ids)

    def generate_id(self) -> uuid.UUID:
        return next(self._ids)

    def encode_id(self, job_id: Any) -> Any:
        return job_id

    def decode_id(self, value: Any) -> Any:
        return value


class OwnInserts(PostgresBackend):
    """A subclass with its own way of writing a batch (here SqlBackend's multi-row INSERTs)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def _insert_rows(self, conn: Any, prefix: str, job_table: Any, rows: Any, *, generated: bool) -> Any:
        self.batches += 1
        return SqlBackend._insert_rows(self, conn, prefix, job_table, rows, generated=generated)


def test_a_subclass_that_writes_batches_its_own_way_gets_the_whole_batch(
    pg_db: SqlHarness, caller: psycopg.Connection[Any]
) -> None:
    backend = OwnInserts()
    ids = enqueue_many(caller, [("a", n) for n in range(BATCH)], job_table=pg_db.job_table, backend=backend)
    caller.commit()
    assert backend.batches == 1
    by_id = {job.job_id: SERIALIZER.decode(job.payload) for job in pg_db.jobs()}
    assert [by_id[job_id] for job_id in ids] == list(range(BATCH))


class StreamingMemory(MemoryBackend):
    """A StreamEnqueue backend over the memory store that reads `stop_after` jobs of each batch at most."""

    def __init__(self, db: MemoryDatabase, stop_after: int) -> None:
        super().__init__(db)
        self.stop_after = stop_after

    def enqueue_stream(self, conn: Any, job_table: Any, jobs: Iterator[JobRecord]) -> list[Any]:
        records = [job for _, job in zip(range(self.stop_after), jobs, strict=False)]
        return self.enqueue_many(conn, job_table, records)


def test_a_backend_whose_enqueue_stream_stops_early_is_an_error_not_lost_jobs() -> None:
    db = MemoryDatabase()
    backend = StreamingMemory(db, stop_after=2)
    with pytest.raises(ProletarianError, match=r"returned after 2 of 3 jobs"):
        enqueue_many(db.connect(), [("a", n) for n in range(3)], backend=cast(Backend, backend))


def test_a_generator_of_jobs_is_read_whole_before_the_backend_writes() -> None:
    db = MemoryDatabase()
    read: list[int] = []

    def jobs() -> Iterator[tuple[str, int]]:
        for n in range(3):
            read.append(n)
            yield ("a", n)

    class Checking(StreamingMemory):
        def enqueue_stream(self, conn: Any, job_table: Any, jobs: Iterator[JobRecord]) -> list[Any]:
            assert read == [0, 1, 2]  # e.g. a server-side cursor on the same connection is done with
            return super().enqueue_stream(conn, job_table, jobs)

    conn = db.connect()
    ids = enqueue_many(conn, jobs(), backend=cast(Backend, Checking(db, stop_after=3)))
    conn.commit()
    assert len(ids) == 3 and len(db.jobs()) == 3
