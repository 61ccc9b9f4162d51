"""A payload too big for the payload column is refused before the INSERT, never truncated (issue 11.3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conformance.harness import SqlHarness
from proletarian_ref import PayloadTooLargeError, SerializationError, enqueue
from proletarian_ref.backends.mysql import MySQLBackend

TEXT_BYTES = 65535
# Exactly 65,535 bytes of UTF-8 in four-, two- and one-byte characters: 16,383 x 4 + 2 + 1.
AT_THE_LIMIT = "\U0001f600" * 16383 + "é" + "a"


class Raw:
    """A serializer that stores the text as it is, so a test controls the payload's exact bytes."""

    def encode(self, payload: Any) -> str:
        return str(payload)

    def decode(self, text: str) -> Any:
        return text


def run(conn: Any, statement: str) -> None:
    with conn.cursor() as cursor:
        cursor.execute(statement)


@pytest.fixture
def tables(mysql_db: SqlHarness) -> Iterator[tuple[str, str]]:
    """A job and an archive table of their own, like the harness's, for tests that alter columns."""
    job, archive = f"{mysql_db.job_table}_limit", f"{mysql_db.archived_job_table}_limit"
    conn = mysql_db.connect()
    try:
        for copy, original in ((job, mysql_db.job_table), (archive, mysql_db.archived_job_table)):
            run(conn, f"DROP TABLE IF EXISTS {copy}")
            run(conn, f"CREATE TABLE {copy} LIKE {original}")
        yield job, archive
    finally:
        run(conn, f"DROP TABLE IF EXISTS {job}, {archive}")
        conn.close()


def count(db: SqlHarness, table: str) -> int:
    [(rows,)] = db.select(f"SELECT COUNT(*) FROM {table}")
    return int(rows)


@pytest.mark.parametrize("sql_mode", ["STRICT_TRANS_TABLES", ""])
def test_mysql_payload_of_exactly_the_text_limit_is_stored_and_one_byte_more_is_refused_before_the_insert(
    mysql_db: SqlHarness, sql_mode: str
) -> None:
    assert len(AT_THE_LIMIT.encode()) == TEXT_BYTES
    options: dict[str, Any] = {
        "job_table": mysql_db.job_table,
        "archived_job_table": mysql_db.archived_job_table,
        "serializer": Raw(),
    }
    conn = mysql_db.connect()
    try:
        run(conn, f"SET SESSION sql_mode = '{sql_mode}'")
        enqueue(conn, "fits", AT_THE_LIMIT, **options)
        with pytest.raises(PayloadTooLargeError) as refused:
            enqueue(conn, "too-big", AT_THE_LIMIT + "a", **options)
        message = str(refused.value)
        assert "65536 bytes in utf8mb4" in message
        assert f"65535 bytes {mysql_db.job_table}.payload (TEXT, utf8mb4)" in message
        assert "nothing was written" in message
        enqueue(conn, "after", "small", **options)  # the caller's transaction goes on
        conn.commit()
    finally:
        conn.close()
    stored = {row.job_type: row.payload for row in mysql_db.jobs()}
    assert stored == {":fits": AT_THE_LIMIT, ":after": "small"}


def test_mysql_payload_limit_is_read_from_the_column_so_a_mediumtext_table_takes_100_kb(
    mysql_db: SqlHarness, tables: tuple[str, str]
) -> None:
    job, archive = tables
    big = "x" * 100_000
    backend = MySQLBackend()  # one backend throughout: what it remembers of the columns must not go stale
    conn = mysql_db.connect()
    try:
        enqueue(
            conn, "small", "s", job_table=job, archived_job_table=archive, serializer=Raw(), backend=backend
        )
        with pytest.raises(PayloadTooLargeError):
            enqueue(
                conn, "big", big, job_table=job, archived_job_table=archive, serializer=Raw(), backend=backend
            )
        conn.commit()
        run(conn, f"ALTER TABLE {job} MODIFY payload MEDIUMTEXT NOT NULL")
        run(conn, f"ALTER TABLE {archive} MODIFY payload MEDIUMTEXT NOT NULL")
        enqueue(
            conn, "big", big, job_table=job, archived_job_table=archive, serializer=Raw(), backend=backend
        )
        conn.commit()
    finally:
        conn.close()
    assert mysql_db.select(f"SELECT LENGTH(payload) FROM {job} WHERE job_type = ':big'") == [(100_000,)]


def test_mysql_payload_limit_is_the_smaller_of_the_job_and_archive_columns(
    mysql_db: SqlHarness, tables: tuple[str, str]
) -> None:
    # The archive copies the text with INSERT ... SELECT: a smaller archive column would truncate it
    # when the job finishes, so the job is refused when it is enqueued.
    job, archive = tables
    conn = mysql_db.connect()
    try:
        run(conn, f"ALTER TABLE {job} MODIFY payload MEDIUMTEXT NOT NULL")
        with pytest.raises(PayloadTooLargeError, match=f"65535 bytes {archive}.payload"):
            enqueue(conn, "big", "x" * 70_000, job_table=job, archived_job_table=archive, serializer=Raw())
        conn.commit()
    finally:
        conn.close()
    assert count(mysql_db, job) == 0


def test_mysql_payload_size_is_counted_in_the_columns_character_set(
    mysql_db: SqlHarness, tables: tuple[str, str]
) -> None:
    job, archive = tables
    # A backend of its own: one that read these columns before the ALTERs would not read them again
    # for a payload they seemed to take (docs/mysql.md, "Payload size").
    options: dict[str, Any] = {"job_table": job, "archived_job_table": archive, "serializer": Raw()}
    options["backend"] = MySQLBackend()
    conn = mysql_db.connect()
    try:
        for table in tables:
            run(conn, f"ALTER TABLE {table} MODIFY payload TEXT CHARACTER SET utf8mb3 NOT NULL")
        # utf8mb3 has no four-byte characters: the server would refuse it or store '?'.
        with pytest.raises(SerializationError, match="cannot store"):
            enqueue(conn, "emoji", "\U0001f600", **options)
        for table in tables:
            run(conn, f"ALTER TABLE {table} MODIFY payload TEXT CHARACTER SET latin1 NOT NULL")
        # One byte each in latin1, two in UTF-8: 65,535 of them fit a latin1 TEXT.
        enqueue(conn, "latin1", "é" * TEXT_BYTES, **options)
        with pytest.raises(PayloadTooLargeError, match="65536 bytes in latin1"):
            enqueue(
                conn,
                "over",
                "é" * (TEXT_BYTES + 1),
                job_table=job,
                archived_job_table=archive,
                serializer=Raw(),
            )
        conn.commit()
    finally:
        conn.close()
    assert mysql_db.select(f"SELECT job_type, CHAR_LENGTH(payload) FROM {job}") == [(":latin1", TEXT_BYTES)]


def test_postgresql_takes_a_payload_past_mysqls_text_limit(pg_db: SqlHarness) -> None:
    # TEXT holds up to 1 GB on PostgreSQL (docs/mysql.md, "Payload size"); nothing is checked there.
    conn = pg_db.connect()
    try:
        enqueue(conn, "big", "é" * 100_000, job_table=pg_db.job_table, serializer=Raw())
        conn.commit()
    finally:
        conn.close()
    [row] = pg_db.jobs()
    assert row.payload == "é" * 100_000
