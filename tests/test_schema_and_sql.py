"""The SQL files: named statements per dialect, the seed's DDL, custom table names and installing."""

from __future__ import annotations

import re

import pytest
from support import data_path

from conformance.harness import SqlHarness
from proletarian_ref import sql
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.schema import install, schema_statements
from proletarian_ref.tables import TableName, table_name


def test_both_dialects_define_the_same_statements_and_their_own_batch_inserts() -> None:
    shared = {"enqueue", "enqueue_db_generated", "get_next_job", "archive_job", "delete_job", "retry_at"}
    # enqueue_many: the multi-row INSERT any SqlBackend can run and the savepoint around a batch (MySQL:
    # of several INSERTs; PostgreSQL: a COPY that starts before its last job is made); on PostgreSQL
    # also COPY and INSERT ... RETURNING for generated ids.
    shared |= {"enqueue_many", "enqueue_many_row"}
    shared |= {"enqueue_many_savepoint", "enqueue_many_rollback", "enqueue_many_release"}
    # The worker's batch mode (BatchClaim): the claim of up to K jobs, the archive and delete of a batch's
    # finished jobs, and the savepoint around a failed job's writes.
    shared |= {
        "get_next_jobs",
        "archive_jobs",
        "delete_jobs",
        "job_savepoint",
        "job_savepoint_rollback",
        "job_savepoint_release",
    }
    batch = {
        # PostgreSQL also announces enqueued jobs to listening workers (NOTIFY, LISTEN).
        "postgresql": {
            "enqueue_copy",
            "enqueue_many_db_generated",
            "enqueue_many_db_generated_row",
            "notify_enqueued",
            "listen",
            # The compact plan's archive and delete in one statement, for one job and for a batch (MySQL
            # sends archive_job and delete_job, or archive_jobs and delete_jobs, together instead).
            "archive_and_delete_job",
            "archive_and_delete_jobs",
            # The chained pipeline's archive_and_delete_job(s), its row count checked by the server.
            "archive_and_delete_job_checked",
            "archive_and_delete_jobs_checked",
            # The opt-in asynchronous commit of the worker's job transaction (synchronous_commit_off=True).
            "synchronous_commit_off",
            # Chained claims (chain=True): COMMIT AND CHAIN (COMMIT and the next BEGIN before PostgreSQL 12).
            "chain_commit",
            "chain_commit_plain",
            "chain_begin",
        },
        # Chained claims (chain=True): the COMMIT in the chain's one query (the session stays out of
        # autocommit, so no BEGIN), and the server's check of each kept-back write's row count.
        # The bounded claims of every plan but the exact one (MySQLBackend's bounded_claim): get_next_job's
        # and get_next_jobs' scans started at the oldest due job, past the entries InnoDB has not purged.
        "mysql": {"chain_commit", "chain_check_count", "claim_bounded"},
    }
    for dialect in sql.DIALECTS:
        assert set(sql.queries(dialect)) == shared | batch[dialect]


def test_a_multi_row_insert_repeats_its_row_of_placeholders() -> None:
    statement = sql.render_rows("mysql", "enqueue_many", table_name("app.job"), 2)
    assert " ".join(statement.split()) == (
        "INSERT INTO app.job (job_id, queue, job_type, payload, attempts, enqueued_at, process_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s), (%s, %s, %s, %s, %s, %s, %s)"
    )


def test_a_batch_archive_lists_one_placeholder_per_job_after_status_and_finished_at() -> None:
    for dialect in sql.DIALECTS:
        statement = sql.render_ids(dialect, "archive_jobs", table_name("app.job"), table_name("app.done"), 3)
        assert " ".join(statement.split()).endswith(
            "%s, enqueued_at, process_at, %s FROM app.job WHERE job_id IN (%s, %s, %s)"
        )
        assert statement.startswith("INSERT INTO app.done ")
    with pytest.raises(ValueError, match="at least one id"):
        sql.render_ids("postgresql", "delete_jobs", table_name("app.job"), None, 0)


def test_proletarians_five_statements_are_the_same_text_in_both_dialects() -> None:
    for name in ("enqueue", "get_next_job", "archive_job", "delete_job", "retry_at"):
        assert sql.queries("postgresql")[name] == sql.queries("mysql")[name]


def test_the_claim_is_proletarians_select_for_update_skip_locked() -> None:
    claim = " ".join(sql.render("postgresql", "get_next_job", table_name("proletarian.job")).split())
    assert claim == (
        "SELECT job_id, queue, job_type, payload, attempts, enqueued_at, process_at FROM proletarian.job "
        "WHERE queue = %(queue)s AND process_at <= %(now)s ORDER BY process_at ASC LIMIT 1 "
        "FOR UPDATE SKIP LOCKED"
    )


# The constant texts of the statement whose row count the server checks: the words of its error, and the
# integer it casts when the count is right. No value of a job is among them.
CHECKED_COUNT_TEXTS = {
    "archive_and_delete_job_checked": ("'1'", "'archive_and_delete_job changed '", "' rows'"),
    "archive_and_delete_jobs_checked": (
        *("'1'", "'archive_and_delete_jobs changed '", "' rows of '", "' jobs'"),
    ),
}


def test_statements_have_no_values_pasted_in() -> None:
    for dialect in sql.DIALECTS:
        for name, statement in sql.queries(dialect).items():
            text = statement
            for constant in CHECKED_COUNT_TEXTS.get(name, ()):
                assert constant in text
                text = text.replace(constant, "")
            assert "'" not in text, f"{name}: values must be bound parameters"


def _squeezed(text: str) -> str:
    # The seed page lost its line breaks, so compare with every blank removed, comments included.
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_schema_sql_is_the_seeds_ddl(dialect: str) -> None:
    seeds = list(data_path("seeds").glob("*.txt"))
    assert seeds, "no seed page in tests/data/seeds"
    seed = _squeezed(seeds[0].read_text(encoding="utf-8"))
    for statement in schema_statements(dialect):
        assert _squeezed(statement) + ";" in seed, f"not in the seed: {statement}"


def test_default_table_names_render_the_file_unchanged() -> None:
    text = sql.read_sql_file("postgresql", "schema.sql")
    assert [s.strip() for s in text.split(";") if s.strip()] == schema_statements("postgresql")


def test_custom_table_names_replace_every_reference() -> None:
    statements = schema_statements(
        "postgresql", job_table="jobs_app.jobs", archived_job_table="jobs_app.done"
    )
    text = "\n".join(statements)
    assert "CREATE SCHEMA IF NOT EXISTS jobs_app" in text
    assert "CREATE TABLE IF NOT EXISTS jobs_app.jobs" in text
    assert "CREATE TABLE IF NOT EXISTS jobs_app.done" in text
    assert "DROP INDEX IF EXISTS jobs_app.jobs_queue_process_at" in text
    assert "CREATE INDEX jobs_queue_process_at ON jobs_app.jobs (queue, process_at)" in text
    assert "proletarian.job " not in text and "proletarian.archived_job" not in text


def test_unqualified_table_names_create_no_schema() -> None:
    statements = schema_statements("mysql", job_table="jobs", archived_job_table="jobs_done")
    assert not any(s.startswith("CREATE DATABASE") for s in statements)
    assert statements[0].startswith("CREATE TABLE IF NOT EXISTS jobs\n")


def test_the_same_table_for_both_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="differ"):
        schema_statements("postgresql", job_table="a.b", archived_job_table="a.b")


@pytest.mark.parametrize(
    "name",
    [
        "proletarian.job; DROP TABLE x",
        'proletarian."job"',
        "proletarian.job--",
        "a.b.c",
        "1job",
        "job table",
        "",
        "job`",
        "job'",
        "x" * 64,
        "proletarian.",
    ],
)
def test_table_names_that_are_not_plain_identifiers_are_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match="job_table"):
        table_name(name)


def test_valid_table_names_parse_into_schema_and_name() -> None:
    assert table_name("proletarian.job") == TableName("proletarian", "job")
    assert table_name("jobs") == TableName(None, "jobs")
    assert str(table_name("My_Schema.Jobs_2")) == "My_Schema.Jobs_2"


@pytest.mark.sql_only
def test_install_is_safe_to_run_twice_with_custom_names(db: SqlHarness) -> None:
    job_table, archived = db.job_table + "_custom", db.archived_job_table + "_custom"
    for table in (job_table, archived):
        db.execute(f"DROP TABLE IF EXISTS {table}")
    conn = db.connect()
    try:
        install(conn, job_table=job_table, archived_job_table=archived)
        install(conn, job_table=job_table, archived_job_table=archived)
    finally:
        conn.close()
    assert db.select(f"SELECT COUNT(*) FROM {job_table}") == [(0,)]
    assert db.select(f"SELECT COUNT(*) FROM {archived}") == [(0,)]


def test_postgresql_claims_through_the_queue_process_at_index(pg_db: SqlHarness) -> None:
    conn = pg_db.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {pg_db.job_table} SELECT gen_random_uuid(), ':q' || (i % 10), ':t', '[]', 0, "
                "now(), now() + (i || ' seconds')::interval FROM generate_series(1, 2000) AS i"
            )
            cursor.execute(f"ANALYZE {pg_db.job_table}")
            cursor.execute(
                "EXPLAIN " + sql.render("postgresql", "get_next_job", table_name(pg_db.job_table)),
                {"queue": ":q1", "now": "2026-01-01T00:00:00+00:00"},
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        conn.rollback()
    finally:
        conn.close()
    assert "Index Scan" in plan and "queue_process_at" in plan, plan


def test_mysql_timestamps_do_not_update_on_their_own(mysql_db: SqlHarness) -> None:
    # With explicit_defaults_for_timestamp off, MySQL/MariaDB give the first TIMESTAMP column
    # ON UPDATE CURRENT_TIMESTAMP, which would rewrite enqueued_at on every retry.
    [(_, ddl)] = mysql_db.select(f"SHOW CREATE TABLE {mysql_db.job_table}")
    assert "on update" not in ddl.lower()
