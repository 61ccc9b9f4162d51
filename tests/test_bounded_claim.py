"""MySQL's bounded claim (queries.sql, claim_bounded): the plans that send it, the index it forces, a
job table without that index or losing it, and the threaded and asyncio backends alike."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiomysql
import pymysql
import pytest
from aio_support import run
from pymysql.constants import CLIENT

import proletarian_ref as pr
from conformance.harness import SqlHarness
from proletarian_ref import sql
from proletarian_ref.backends.dsn import connection_factory, mysql_connect_kwargs
from proletarian_ref.backends.mysql import MySQLBackend
from proletarian_ref.backends.mysql_async import AsyncMySQLBackend, aiomysql_connect_kwargs
from proletarian_ref.errors import TransientDatabaseError
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.tables import TableName, table_name

pytestmark = pytest.mark.mysql

QUEUE = "bounded"
QUEUE_TEXT = to_keyword_text(QUEUE, what="queue")  # as the row stores it
# The claims' clock, past both jobs' process_at (enqueue_two).
LATER = timedelta(minutes=2)
CLAIMS = ("get_next_job", "get_next_jobs")


@contextlib.contextmanager
def own_tables(mysql_db: SqlHarness, suffix: str) -> Iterator[tuple[TableName, TableName]]:
    """A job table and an archive of this test's own, made LIKE the harness's (the seed's DDL, its index
    included), dropped after; their names keep the harness's prefix, so a killed run's are swept."""
    job, archived = (table_name(f"{t}_{suffix}") for t in (mysql_db.job_table, mysql_db.archived_job_table))
    statements = [
        f"DROP TABLE IF EXISTS {job}, {archived}",
        f"CREATE TABLE {job} LIKE {mysql_db.job_table}",
        f"CREATE TABLE {archived} LIKE {mysql_db.archived_job_table}",
    ]
    for statement in statements:
        mysql_db.execute(statement)
    try:
        yield job, archived
    finally:
        mysql_db.execute(f"DROP TABLE IF EXISTS {job}, {archived}")


def enqueue_two(mysql_db: SqlHarness, job: TableName) -> list[Any]:
    conn = mysql_db.connect()
    try:
        # A second and a minute ahead: whole seconds apart, as TIMESTAMP keeps them, so one is the oldest.
        due = [datetime.now(UTC) + timedelta(seconds=s) for s in (1, 61)]
        ids = [
            pr.enqueue(conn, "t", n, queue=QUEUE, process_at=at, job_table=str(job))
            for n, at in enumerate(due)
        ]
        conn.commit()
    finally:
        conn.close()
    return [job_id.bytes for job_id in ids]  # as the backend reads BINARY(16) back


def claimed(backend: MySQLBackend, job: TableName, batch: bool) -> list[Any]:
    """The ids one claim takes (both jobs in a batch, the oldest alone otherwise), rolled back."""
    now = datetime.now(UTC) + LATER
    with contextlib.ExitStack() as stack:
        conn = stack.enter_context(backend.transaction())
        if batch:
            records = backend.get_next_jobs(conn, job, QUEUE_TEXT, now, 10)
        else:
            one = backend.get_next_job(conn, job, QUEUE_TEXT, now)
            records = [] if one is None else [one]
        conn.rollback()
    return [r.job_id for r in records]


def multi_statements(dsn: str, **options: Any) -> Any:
    """A connection factory the compact and chained plans take."""
    return connection_factory(dsn, client_flag=CLIENT.MULTI_STATEMENTS, **options)


def bounded_text(job: TableName, name: str, index: str = "queue") -> str:
    """claim_bounded for `name`: one job's LIMIT 1, or the batch's bound limit."""
    limit = "1" if name == "get_next_job" else "%(limit)s"
    return sql.queries("mysql")["claim_bounded"].format(job_table=job, claim_index=f"`{index}`", limit=limit)


@pytest.mark.parametrize(
    ("options", "bounded"),
    [
        ({}, ("get_next_jobs",)),
        ({"compact": True}, CLAIMS),
        ({"compact": True, "chain": True}, CLAIMS),
        ({"chain": True}, CLAIMS),
        ({"compact": True, "chain": True, "bounded_claim": False}, ()),
    ],
    ids=["exact", "compact", "compact-chain", "chain", "bounded_claim-off"],
)
def test_every_plan_but_proletarians_exact_one_bounds_its_claims_on_the_seeds_index(
    mysql_db: SqlHarness, mysql_dsn: str, options: dict[str, bool], bounded: tuple[str, ...]
) -> None:
    with own_tables(mysql_db, "plans") as (job, _):
        ids = enqueue_two(mysql_db, job)
        backend = MySQLBackend(multi_statements(mysql_dsn), **options)
        try:
            assert claimed(backend, job, batch=False) == ids[:1]
            assert claimed(backend, job, batch=True) == ids
            for name in CLAIMS:
                # Proletarian's exact plan keeps its get_next_job statement word for word (spec: db.clj).
                expected = bounded_text(job, name) if name in bounded else sql.render("mysql", name, job)
                assert backend._known_claim(name, job) == expected, (options, name)
        finally:
            backend.close()


def test_a_job_table_without_the_index_is_claimed_from_with_proletarians_statement(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    with own_tables(mysql_db, "noindex") as (job, _):
        mysql_db.execute(f"ALTER TABLE {job} DROP INDEX `queue`")
        ids = enqueue_two(mysql_db, job)
        backend = MySQLBackend(multi_statements(mysql_dsn), compact=True)
        try:
            assert claimed(backend, job, batch=False) == ids[:1]
            assert claimed(backend, job, batch=True) == ids
            for name in CLAIMS:
                assert backend._known_claim(name, job) == sql.render("mysql", name, job)
        finally:
            backend.close()


def test_a_named_index_on_queue_and_process_at_is_the_one_forced(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    with own_tables(mysql_db, "named") as (job, _):
        mysql_db.execute(
            f"ALTER TABLE {job} DROP INDEX `queue`, ADD INDEX by_due (queue(100), process_at, job_id)"
        )
        ids = enqueue_two(mysql_db, job)
        backend = MySQLBackend(multi_statements(mysql_dsn), compact=True)
        try:
            assert claimed(backend, job, batch=True) == ids
            assert backend._known_claim("get_next_jobs", job) == bounded_text(job, "get_next_jobs", "by_due")
        finally:
            backend.close()


def test_a_dropped_index_fails_one_claim_as_transient_and_the_next_claims_without_it(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    with own_tables(mysql_db, "dropped") as (job, _):
        ids = enqueue_two(mysql_db, job)
        backend = MySQLBackend(multi_statements(mysql_dsn), compact=True)
        try:
            assert claimed(backend, job, batch=False) == ids[:1]
            mysql_db.execute(f"ALTER TABLE {job} DROP INDEX `queue`")
            with pytest.raises(TransientDatabaseError, match="bounded claim's index is gone"):
                claimed(backend, job, batch=False)
            assert claimed(backend, job, batch=False) == ids[:1]
            assert backend._known_claim("get_next_job", job) == sql.render("mysql", "get_next_job", job)
        finally:
            backend.close()
        conn = mysql_db.connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"SELECT COUNT(*) FROM {job}")
                assert cursor.fetchone() == (2,)  # no claim took or changed a job
        finally:
            conn.close()


def test_the_asyncio_backend_bounds_the_same_claims_on_the_same_index(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    async def scenario(options: dict[str, bool], job: TableName) -> tuple[list[Any], list[Any], list[str]]:
        async def connect() -> Any:
            return await aiomysql.connect(**aiomysql_connect_kwargs(mysql_dsn))

        backend = AsyncMySQLBackend(connect, **options)
        now = datetime.now(UTC) + LATER
        try:
            async with backend.transaction() as conn:
                one = await backend.get_next_job(conn, job, QUEUE_TEXT, now)
                await conn.rollback()
            async with backend.transaction() as conn:
                batch = await backend.get_next_jobs(conn, job, QUEUE_TEXT, now, 10)
                await conn.rollback()
        finally:
            await backend.close()
        known = [backend.codec._known_claim(name, job) or "" for name in CLAIMS]
        return [] if one is None else [one.job_id], [r.job_id for r in batch], known

    with own_tables(mysql_db, "aio") as (job, _):
        ids = enqueue_two(mysql_db, job)
        assert run(scenario({"compact": True}, job)) == (
            ids[:1],
            ids,
            [bounded_text(job, name) for name in CLAIMS],
        )
        assert run(scenario({"compact": True, "bounded_claim": False}, job)) == (
            ids[:1],
            ids,
            [sql.render("mysql", name, job) for name in CLAIMS],
        )


def test_the_bounded_claims_read_their_bound_without_a_lock(mysql_db: SqlHarness, mysql_dsn: str) -> None:
    """The oldest due job held by another transaction: the bound's plain read passes it, the locking scan
    skips it, and the claim takes the next one without waiting."""
    with own_tables(mysql_db, "held") as (job, _):
        ids = enqueue_two(mysql_db, job)
        holder = pymysql.connect(**mysql_connect_kwargs(mysql_dsn))
        # A claim that waited for the held row would fail within a second rather than pass late.
        wait = "SET SESSION innodb_lock_wait_timeout = 1"
        backend = MySQLBackend(multi_statements(mysql_dsn, init_command=wait), compact=True)
        try:
            with holder.cursor() as cursor:
                cursor.execute("START TRANSACTION")
                cursor.execute(f"SELECT job_id FROM {job} WHERE job_id = %s FOR UPDATE", (ids[0],))
            assert claimed(backend, job, batch=False) == ids[1:]
            assert claimed(backend, job, batch=True) == ids[1:]
        finally:
            holder.rollback()
            holder.close()
            backend.close()
