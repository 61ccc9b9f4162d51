"""Unique jobs' options and bad input (proletarian_ref.unique); the clauses: conformance/side_tables.py."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.harness import Harness
from conformance.side_tables import prepare
from proletarian_ref import JobSpec, enqueue, enqueue_many, side_tables
from proletarian_ref._sync.unique_claims import store_for
from proletarian_ref.backends import backend_for_connection
from proletarian_ref.backends.memory import MemoryDatabase
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.job_ids import db_generated_strategy
from proletarian_ref.tables import table_name
from proletarian_ref.unique import UniqueKey, UniqueKeyHeldError, decide, ordered_claims


def _enqueue(harness: Harness, conn: Any, payload: Any, key: Any) -> Any:
    return enqueue(conn, "t/u", payload, unique_key=key, **harness.table_options)


def test_a_held_key_with_conflict_raise_names_the_holder_and_leaves_the_transaction_usable(
    db: Harness,
) -> None:
    prepare(db)
    conn = db.connect()
    try:
        first = _enqueue(db, conn, 1, "k")
        conn.commit()
        with pytest.raises(UniqueKeyHeldError) as raised:
            _enqueue(db, conn, 2, UniqueKey("k", conflict="raise"))
        assert raised.value.job_id == first and raised.value.key == "k"
        # Nothing failed in the database: the caller's transaction goes on and commits its other work.
        other = _enqueue(db, conn, 3, "other")
        conn.commit()
    finally:
        conn.close()
    assert {r.job_id for r in db.jobs()} == {db.job_id_strategy().encode_id(i) for i in (first, other)}


def test_enqueue_many_answers_a_held_key_with_its_holder_and_a_key_twice_with_the_first_job(
    db: Harness,
) -> None:
    prepare(db)
    conn = db.connect()
    try:
        held = _enqueue(db, conn, 0, "a")
        conn.commit()
        ids = enqueue_many(
            conn,
            [
                JobSpec("t/u", 1, unique_key="a"),
                JobSpec("t/u", 2, unique_key="b"),
                JobSpec("t/u", 3, unique_key="b"),
                ("t/u", 4),
                JobSpec("t/u", 5),
            ],
            **db.table_options,
        )
        conn.commit()
    finally:
        conn.close()
    assert ids[0] == held and ids[1] == ids[2] and len(set(ids)) == 4
    assert len(db.jobs()) == 4


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "1 to 255 characters"),
        ("x" * 256, "1 to 255 characters"),
        (42, "must be a str or a UniqueKey"),
        (UniqueKey("k", conflict="ignore"), "conflict must be"),  # type: ignore[arg-type]
        (UniqueKey("k", until="never"), "until must be"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_unique_key_is_refused_before_any_sql(key: Any, message: str) -> None:
    memory = MemoryDatabase()
    conn = memory.connect()
    with pytest.raises(ConfigurationError, match=message):
        enqueue(conn, "t/u", 1, unique_key=key)
    with pytest.raises(ConfigurationError, match=f"jobs\\[1\\]: .*{message}"):
        enqueue_many(conn, [("t/u", 0), JobSpec("t/u", 1, unique_key=key)])
    assert memory.jobs() == []


def test_unique_keys_need_ids_made_before_the_insert() -> None:
    conn = MemoryDatabase().connect()
    with pytest.raises(ConfigurationError, match="database-generated id strategy"):
        enqueue(conn, "t/u", 1, unique_key="k", job_id_strategy=db_generated_strategy())


@pytest.mark.sql_only
def test_a_missing_side_table_is_a_clear_error_naming_the_install_command(db: Harness) -> None:
    conn = db.connect()
    try:
        backend = backend_for_connection(conn)
        missing = table_name(f"{db.job_table}_nosuch")
        with pytest.raises(ConfigurationError, match="schema install --with unique"):
            store_for(backend, conn, missing)
    finally:
        conn.rollback()
        conn.close()


def test_prune_deletes_only_the_rows_of_free_keys(db: Harness) -> None:
    prepare(db)
    conn = db.connect()
    try:
        _enqueue(db, conn, 1, "kept")
        gone = _enqueue(db, conn, 2, "freed")
        conn.commit()
        _delete(db, gone)  # as an archive would, by a worker that knows nothing of the side table
        store = store_for(backend_for_connection(conn), conn, table_name(db.job_table))
        assert store.prune(conn) == 1  # type: ignore[attr-defined]
        conn.commit()
        assert _enqueue(db, conn, 3, "kept") != _enqueue(db, conn, 4, "freed")
    finally:
        conn.rollback()
        conn.close()


def _delete(db: Harness, job_id: Any) -> None:
    backend = db.backend()
    with backend.transaction() as conn:
        backend.delete_job(conn, table_name(db.job_table), db.job_id_strategy().encode_id(job_id))


def test_the_pure_decisions() -> None:
    assert decide("new", "new", None) == "claimed"
    assert decide("new", "old", True) == "held"
    assert decide("new", "old", False) == "take_over"
    keys = [UniqueKey("b"), None, UniqueKey("a"), UniqueKey("b")]
    assert ordered_claims(keys) == [(2, keys[2]), (0, keys[0]), (3, keys[3])]
    assert str(side_tables.side_table("s.jobs", "unique")) == "s.jobs_unique_key"
