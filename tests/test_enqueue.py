"""enqueue: the row it writes, the id it returns, and the caller's transaction (spec 1.2, 2.1, 5)."""

from __future__ import annotations

import gc
import pickle
import threading
import uuid
import weakref
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from support import T0, FakeClock, enqueue_committed

from conformance.harness import Harness, SqlHarness
from proletarian_ref import (
    ConfigurationError,
    InvalidKeywordError,
    SerializationError,
    constant_id_strategy,
    db_generated_strategy,
    enqueue,
    mysql_uuid_strategy,
    process_next_job,
)
from proletarian_ref.job import default_serializer, to_process_at


def test_enqueue_writes_proletarians_row_format(db: Harness) -> None:
    clock = FakeClock()
    job_id = enqueue_committed(db, "my.ns/send-email", {"email": "a@b.c", "n": 1}, clock=clock)
    [row] = db.jobs()
    assert row.queue == ":proletarian/default"
    assert row.job_type == ":my.ns/send-email"
    assert row.payload == '["^ ","~:email","a@b.c","~:n",1]'
    assert row.attempts == 0
    assert row.enqueued_at == T0
    assert row.process_at == T0
    assert isinstance(job_id, uuid.UUID)


def test_job_type_and_queue_may_be_given_with_the_colon(db: Harness) -> None:
    enqueue_committed(db, ":send-email", [], queue=":mailers")
    [row] = db.jobs()
    assert (row.queue, row.job_type) == (":mailers", ":send-email")


def test_postgresql_stores_the_uuid_natively(pg_db: SqlHarness) -> None:
    job_id = enqueue_committed(pg_db, "a", None)
    assert pg_db.select(f"SELECT job_id::text FROM {pg_db.job_table}") == [(str(job_id),)]


def test_mysql_stores_the_uuid_as_16_bytes_in_rfc_4122_order(mysql_db: SqlHarness) -> None:
    job_id = enqueue_committed(mysql_db, "a", None)
    [(hex_id,)] = mysql_db.select(f"SELECT HEX(job_id) FROM {mysql_db.job_table}")
    assert hex_id.lower() == job_id.hex


def test_mysql_uuid_strategy_round_trips_proletarians_example() -> None:
    strategy = mysql_uuid_strategy()
    job_id = uuid.UUID("550e8400-e29b-41d4-a716-446655440000")
    encoded = strategy.encode_id(job_id)
    assert encoded == bytes.fromhex("550e8400e29b41d4a716446655440000")
    assert strategy.decode_id(encoded) == job_id
    assert strategy.encode_id(None) is None and strategy.decode_id(None) is None


@pytest.mark.parametrize("stored", [bytes(range(16)), bytearray(b"\xff" * 16), memoryview(bytes(16))])
def test_a_mysql_id_decodes_to_the_uuid_uuid_itself_makes_of_its_bytes(stored: Any) -> None:
    """decode_id builds the UUID without uuid.UUID.__init__; it is the same UUID in every respect."""
    made = mysql_uuid_strategy().decode_id(stored)
    expected = uuid.UUID(bytes=bytes(stored))
    assert type(made) is uuid.UUID
    assert (made, hash(made), str(made), made.is_safe) == (
        expected,
        hash(expected),
        str(expected),
        expected.is_safe,
    )
    assert pickle.loads(pickle.dumps(made)) == expected


def test_a_mysql_id_of_the_wrong_length_fails_as_uuid_fails() -> None:
    with pytest.raises(ValueError, match="16-char"):
        mysql_uuid_strategy().decode_id(b"short")


def test_rolling_back_the_callers_transaction_leaves_no_job(db: Harness) -> None:
    conn = db.connect()
    try:
        enqueue(conn, "a", {"x": 1}, job_table=db.job_table)
        conn.rollback()
    finally:
        conn.close()
    assert db.jobs() == []


def test_enqueue_joins_the_callers_transaction_and_never_commits(db: Harness) -> None:
    conn = db.connect()
    try:
        enqueue(conn, "a", 1, job_table=db.job_table)
        enqueue(conn, "b", 2, job_table=db.job_table)
        assert db.jobs() == []  # another connection sees nothing before the caller commits
        conn.commit()
    finally:
        conn.close()
    assert sorted(row.job_type for row in db.jobs()) == [":a", ":b"]


def test_process_at_in_the_future_is_kept(db: Harness) -> None:
    clock = FakeClock()
    enqueue_committed(db, "a", None, clock=clock, process_at=T0 + timedelta(hours=2))
    assert db.jobs()[0].process_at == T0 + timedelta(hours=2)


def test_process_in_is_added_to_now(db: Harness) -> None:
    enqueue_committed(db, "a", None, clock=FakeClock(), process_in=timedelta(minutes=5))
    assert db.jobs()[0].process_at == T0 + timedelta(minutes=5)


def test_process_at_in_another_time_zone_is_the_same_instant(db: Harness) -> None:
    plus_two = timezone(timedelta(hours=2))
    enqueue_committed(db, "a", None, clock=FakeClock(), process_at=datetime(2026, 1, 1, 5, tzinfo=plus_two))
    assert db.jobs()[0].process_at == datetime(2026, 1, 1, 3, tzinfo=UTC)


# Proletarian's ->process-at cases (job_test.clj).
@pytest.mark.parametrize(
    ("process_at", "process_in", "expected"),
    [
        (None, None, T0),
        (T0 + timedelta(seconds=10), None, T0 + timedelta(seconds=10)),
        (T0 - timedelta(seconds=10), None, T0),
        (None, timedelta(seconds=10), T0 + timedelta(seconds=10)),
        (None, timedelta(seconds=-10), T0),
        (T0 + timedelta(seconds=10), timedelta(seconds=99), T0 + timedelta(seconds=10)),
    ],
)
def test_process_at_follows_proletarians_clamping_rules(
    process_at: datetime | None, process_in: timedelta | None, expected: datetime
) -> None:
    assert to_process_at(T0, process_at, process_in) == expected


def test_a_naive_process_at_is_refused_before_any_sql(db: Harness) -> None:
    with pytest.raises(ConfigurationError, match="naive"):
        enqueue_committed(db, "a", None, process_at=datetime(2030, 1, 1))
    assert db.jobs() == []


@pytest.mark.parametrize("job_type", ["has space", "::auto", "", "a/", "x\ny", 'quo"te'])
def test_job_types_clojure_would_not_read_back_are_refused(db: Harness, job_type: str) -> None:
    with pytest.raises(InvalidKeywordError, match="job_type"):
        enqueue_committed(db, job_type, None)
    assert db.jobs() == []


def test_an_invalid_queue_is_refused_naming_the_queue(db: Harness) -> None:
    with pytest.raises(InvalidKeywordError, match="queue"):
        enqueue_committed(db, "a", None, queue="two words")


def test_a_payload_the_serializer_cannot_encode_is_refused(db: Harness) -> None:
    with pytest.raises(SerializationError):
        enqueue_committed(db, "a", {"x": object()})
    assert db.jobs() == []


def test_the_constant_strategy_stores_and_returns_its_id(pg_db: SqlHarness) -> None:
    fixed = uuid.UUID("550e8400-e29b-41d4-a716-446655440000")
    assert enqueue_committed(pg_db, "a", None, job_id_strategy=constant_id_strategy(fixed)) == fixed
    assert pg_db.jobs()[0].job_id == fixed


def _db_generated_tables(db: SqlHarness) -> tuple[str, str]:
    job_table = db.job_table + "_gen"
    archived = db.archived_job_table + "_gen"
    id_type = "UUID DEFAULT gen_random_uuid()" if db.dialect == "postgresql" else "BIGINT AUTO_INCREMENT"
    archived_id = "UUID" if db.dialect == "postgresql" else "BIGINT"
    time_type = "TIMESTAMPTZ" if db.dialect == "postgresql" else "TIMESTAMP"
    db.execute(f"DROP TABLE IF EXISTS {job_table}")
    db.execute(f"DROP TABLE IF EXISTS {archived}")
    columns = (
        "queue TEXT NOT NULL, job_type TEXT NOT NULL, payload TEXT NOT NULL, attempts INTEGER NOT NULL, "
        f"enqueued_at {time_type} NOT NULL, process_at {time_type} NOT NULL"
    )
    db.execute(f"CREATE TABLE {job_table} (job_id {id_type} PRIMARY KEY, {columns})")
    db.execute(
        f"CREATE TABLE {archived} (job_id {archived_id} PRIMARY KEY, {columns}, status TEXT NOT NULL, "
        f"finished_at {time_type} NOT NULL)"
    )
    return job_table, archived


@pytest.mark.sql_only
def test_the_db_generated_strategy_returns_the_databases_id(db: SqlHarness) -> None:
    job_table, archived = _db_generated_tables(db)
    strategy = db_generated_strategy()
    conn = db.connect()
    try:
        first = enqueue(conn, "a", 1, job_table=job_table, job_id_strategy=strategy)
        second = enqueue(conn, "a", 2, job_table=job_table, job_id_strategy=strategy)
        conn.commit()
    finally:
        conn.close()
    assert first is not None and second is not None and first != second
    seen: list[Any] = []
    options: dict[str, Any] = {
        "job_table": job_table,
        "archived_job_table": archived,
        "job_id_strategy": strategy,
    }
    while process_next_job(db.data_source, lambda t, p: seen.append(p), **options):
        pass
    assert sorted(seen) == [1, 2]
    assert {row[0] for row in db.select(f"SELECT job_id FROM {archived}")} == {first, second}


def test_a_legacy_timestamp_column_holds_utc_wall_clock_whatever_the_session_zone(pg_db: SqlHarness) -> None:
    table = pg_db.job_table + "_legacy"
    pg_db.execute(f"DROP TABLE IF EXISTS {table}")
    pg_db.execute(
        f"CREATE TABLE {table} (job_id UUID PRIMARY KEY, queue TEXT NOT NULL, job_type TEXT NOT NULL, "
        "payload TEXT NOT NULL, attempts INTEGER NOT NULL, enqueued_at TIMESTAMP NOT NULL, "
        "process_at TIMESTAMP NOT NULL)"
    )
    conn = pg_db.connect()
    try:
        conn.execute("SET TIME ZONE 'America/New_York'")
        enqueue(conn, "a", None, job_table=table, clock=FakeClock())
        conn.commit()
    finally:
        conn.close()
    assert pg_db.select(f"SELECT enqueued_at, process_at FROM {table}") == [
        (T0.replace(tzinfo=None), T0.replace(tzinfo=None))
    ]


@pytest.mark.sql_only
def test_enqueue_keeps_no_reference_to_the_callers_connection(db: SqlHarness) -> None:
    conn = db.connect()
    enqueue(conn, "a", 1, job_table=db.job_table)
    conn.commit()
    conn.close()
    gone = weakref.ref(conn)
    del conn
    gc.collect()
    assert gone() is None


@pytest.mark.sql_only
def test_threads_enqueuing_on_their_own_connections_write_every_job(db: SqlHarness) -> None:
    def enqueue_some(first: int) -> None:
        conn = db.connect()
        try:
            for n in range(first, first + 50):
                enqueue(conn, "a", n, job_table=db.job_table)
            conn.commit()
        finally:
            conn.close()

    threads = [threading.Thread(target=enqueue_some, args=(first,)) for first in (0, 50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    serializer = default_serializer()
    assert sorted(serializer.decode(job.payload) for job in db.jobs()) == list(range(100))


def test_postgresql_enqueue_uses_a_cursor_class_the_caller_chose(pg_db: SqlHarness) -> None:
    made: list[object] = []

    class Recording(psycopg.ClientCursor[Any]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    conn = pg_db.connect()
    try:
        conn.cursor_factory = Recording
        job_id = enqueue(conn, "a", {"k": 1}, job_table=pg_db.job_table)
        conn.commit()
    finally:
        conn.close()
    assert made
    [job] = pg_db.jobs()
    assert (job.job_id, job.job_type, job.payload) == (job_id, ":a", '["^ ","~:k",1]')


def test_postgresql_enqueue_leaves_the_callers_adapters_as_they_were(pg_db: SqlHarness) -> None:
    conn = pg_db.connect()
    try:
        adapters = conn.adapters
        callback = getattr(adapters, "_register_loader_callback", None)
        enqueue(conn, "a", 1, job_table=pg_db.job_table)
        conn.commit()
        assert conn.adapters is adapters
        assert getattr(adapters, "_register_loader_callback", None) is callback
    finally:
        conn.close()


def test_the_psycopg_the_cursor_was_written_for_takes_enqueues_one_statement_cursor() -> None:
    # The cursor (proletarian_ref.backends.postgres._OneStatementCursor) sets psycopg's cursor fields
    # itself, as psycopg 3.3 has them: there it must be taken. A psycopg whose fields differ gets
    # conn.cursor() instead (correct and slower; the other tests here run whichever path is taken), so a
    # new psycopg release shows in the enqueue benchmark, not as a failure here.
    from proletarian_ref.backends import postgres

    fields = frozenset(getattr(psycopg.Cursor.__mro__[1], "__slots__", ()))
    assert (fields == postgres._CURSOR_SLOTS) == postgres._LEAN_CURSOR
    if psycopg.__version__.startswith("3.3."):
        assert postgres._LEAN_CURSOR, f"psycopg {psycopg.__version__} has other cursor fields"
