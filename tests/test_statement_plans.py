"""The statement plans beside Proletarian's (pipeline=True, compact=True): same rows, same transaction."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pymysql.constants import CLIENT
from support import enqueue_committed

from conformance.harness import SqlHarness
from proletarian_ref import ConfigurationError, enqueue, process_next_job
from proletarian_ref.backends._dbapi import SqlBackend
from proletarian_ref.backends.dsn import connection_factory
from proletarian_ref.backends.mysql import MySQLBackend
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.errors import DatabaseError
from proletarian_ref.tables import TableName

# Past every job the tests enqueue, with microseconds, within MySQL's TIMESTAMP range.
LATER = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
# Each plan's backend options, by database; the first of each is Proletarian's five statements.
PLANS = [
    ("postgresql", {}),
    ("postgresql", {"pipeline": True}),
    ("postgresql", {"compact": True}),
    ("postgresql", {"pipeline": True, "compact": True}),
    ("mysql", {}),
    ("mysql", {"compact": True}),
]
OTHER_PLANS = [plan for plan in PLANS if plan[1]]


def _plan_id(plan: tuple[str, dict[str, bool]]) -> str:
    dialect, options = plan
    return "-".join([dialect, *sorted(options)]) if options else f"{dialect}-plain"


def _noop(job_type: str, payload: Any) -> None:
    return None


def _fails(job_type: str, payload: Any) -> None:
    raise RuntimeError("fails, and is archived as a failure (no retries)")


def _harness(request: pytest.FixtureRequest, dialect: str) -> SqlHarness:
    harness: SqlHarness = request.getfixturevalue("pg_db" if dialect == "postgresql" else "mysql_db")
    return harness


def _backend(
    request: pytest.FixtureRequest,
    dialect: str,
    options: dict[str, bool],
    cls: type[SqlBackend] | None = None,
) -> SqlBackend:
    """A backend of `cls` (else the dialect's own) with `options`, on the harness's database."""
    harness = _harness(request, dialect)
    if dialect == "postgresql":
        return (cls or PostgresBackend)(harness.data_source, **options)
    data_source = harness.data_source
    if options.get("compact"):
        # The compact plan's connections need the flag; the harness's own are opened without it.
        dsn = request.getfixturevalue("mysql_dsn")
        data_source = connection_factory(dsn, client_flag=CLIENT.MULTI_STATEMENTS)
    return (cls or MySQLBackend)(data_source, **options)


def _run(
    harness: SqlHarness, backend: SqlBackend, handler: Any = _noop, *, batch_size: int = 1
) -> bool | None:
    try:
        return process_next_job(
            harness.data_source,
            handler,
            backend=backend,
            clock=lambda: LATER,
            batch_size=batch_size,
            **harness.table_options,
        )
    finally:
        backend.close()


def _archived_rows(harness: SqlHarness) -> list[tuple[Any, ...]]:
    return harness.select(
        "SELECT job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at "
        f"FROM {harness.archived_job_table}"
    )


def _queued(harness: SqlHarness) -> list[tuple[Any, int]]:
    """The queued jobs' ids, as enqueue returned them, and attempts."""
    decode = harness.job_id_strategy().decode_id
    return [(decode(job.job_id), job.attempts) for job in harness.jobs()]


_JOB_COLUMNS = "job_id, queue, job_type, payload, attempts, enqueued_at, process_at"


@pytest.mark.parametrize("handler", [_noop, _fails], ids=["success", "failure"])
@pytest.mark.parametrize("plan", OTHER_PLANS, ids=_plan_id)
def test_every_plan_archives_a_job_into_the_very_row_of_the_plain_plan(
    request: pytest.FixtureRequest, plan: tuple[str, dict[str, bool]], handler: Any
) -> None:
    dialect, options = plan
    db = _harness(request, dialect)
    enqueue_committed(db, "plans/job", {"text": "é'\"\\ %s \n ✓", "n": 1})
    # Attempts other than 0, so that the archive's attempts + 1 is seen to come from the stored row.
    db.execute(f"UPDATE {db.job_table} SET attempts = 2")
    (job_row,) = db.select(f"SELECT {_JOB_COLUMNS} FROM {db.job_table}")
    archived: dict[str, list[tuple[Any, ...]]] = {}
    for name, plan_options in (("plain", {}), ("other", options)):
        db.clear()
        db.execute(f"INSERT INTO {db.job_table} ({_JOB_COLUMNS}) VALUES ({', '.join(['%s'] * 7)})", job_row)
        assert _run(db, _backend(request, dialect, plan_options), handler) is True
        assert db.jobs() == []
        archived[name] = _archived_rows(db)
    assert len(archived["plain"]) == 1
    (row,) = archived["plain"]
    assert row[4] == 3 and row[5] == (":success" if handler is _noop else ":failure")
    # The driver's values of every column, the payload's text and the microseconds included.
    assert archived["other"] == archived["plain"]


class _PgMovesNothingIntoTheArchive(PostgresBackend):
    """The compact statement deletes the job but archives no row: its count is 0, which must be refused."""

    def _render(self, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
        text = super()._render(name, job_table, archived_job_table)
        if name == "archive_and_delete_job":
            assert text.endswith("FROM moved")
            text += " WHERE false"
        return text


class _ArchivesNothing(SqlBackend):
    """The archive INSERT matches no row: its count is 0, which the backend must refuse before COMMIT."""

    def _render(self, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
        text = super()._render(name, job_table, archived_job_table)
        if name == "archive_job":
            assert "WHERE" in text
            text = text.replace("WHERE", "WHERE false AND", 1)
        return text


class _DeletesNothing(SqlBackend):
    """The DELETE matches no row: its count is 0, which the backend must refuse before COMMIT."""

    def _render(self, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
        text = super()._render(name, job_table, archived_job_table)
        if name == "delete_job":
            text = text.replace("WHERE", "WHERE false AND", 1)
        return text


def _mutant(dialect: str, mixin: type[SqlBackend]) -> type[SqlBackend]:
    base = PostgresBackend if dialect == "postgresql" else MySQLBackend
    return type(f"{mixin.__name__}{base.__name__}", (mixin, base), {})


def _mutants(plan: tuple[str, dict[str, bool]]) -> list[tuple[type[SqlBackend], str]]:
    """The mutant backends whose one-row write changes no row on `plan`, and the error each must raise."""
    dialect, options = plan
    if dialect == "postgresql" and options.get("compact"):
        return [(_PgMovesNothingIntoTheArchive, "archive_and_delete_job changed 0 rows")]
    # Proletarian's two statements, apart or sent together (MySQL's compact plan), each count checked.
    return [
        (_mutant(dialect, _ArchivesNothing), "archive_job changed 0 rows"),
        (_mutant(dialect, _DeletesNothing), "delete_job changed 0 rows"),
    ]


@pytest.mark.parametrize("plan", PLANS, ids=_plan_id)
def test_a_write_that_changes_no_row_rolls_back_before_commit_and_keeps_the_job(
    request: pytest.FixtureRequest, plan: tuple[str, dict[str, bool]]
) -> None:
    dialect, options = plan
    db = _harness(request, dialect)
    for cls, message in _mutants(plan):
        db.clear()
        job_id = enqueue_committed(db, "plans/job", {"n": 2})
        with pytest.raises(DatabaseError, match=message):
            _run(db, _backend(request, dialect, options, cls))
        # The other write ran in the same transaction; without the check before COMMIT the job would be
        # lost (deleted, not archived) or archived and still queued.
        assert _queued(db) == [(job_id, 0)], message
        assert db.archived_jobs() == [], message


class _Counting(SqlBackend):
    """Counts the statements sent on their own (each a round trip when the connection does not pipeline)."""

    statements: list[str]

    def _execute(self, conn: Any, statement: str, params: Any, read: Any, *, copy: bool = False) -> Any:
        # MySQL's bounded claim reads its index once per backend (mysql_claim.lookup): not a job's statement.
        if "information_schema.STATISTICS" not in statement:
            self.statements.append(statement)
        return super()._execute(conn, statement, params, read, copy=copy)


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_the_compact_plan_sends_a_finished_jobs_archive_and_delete_as_one_statement(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    db = _harness(request, dialect)
    sent: dict[bool, list[str]] = {}
    for compact in (False, True):
        enqueue_committed(db, "plans/job", {"n": 3})
        backend = _backend(request, dialect, {"compact": compact}, _mutant(dialect, _Counting))
        sent[compact] = backend.statements = []  # type: ignore[attr-defined]
        assert _run(db, backend) is True
    assert len(sent[False]) == 3  # the claim, the archive INSERT, the DELETE (BEGIN and COMMIT apart)
    claim, write = sent[True]
    if dialect == "mysql":
        # On MySQL the compact plan claims with the bounded claim, the exact plan with Proletarian's.
        assert "FORCE INDEX" in claim and "FORCE INDEX" not in sent[False][0]
    else:
        assert claim == sent[False][0]
    assert "INSERT INTO" in write and "DELETE FROM" in write
    if dialect == "mysql":
        # Proletarian's two statements, as they are, in one query.
        assert write == f"{sent[False][1]};\n{sent[False][2]}"
    assert len(db.archived_jobs()) == 2


def test_mysql_refuses_the_compact_plan_on_a_connection_without_multi_statements_before_claiming(
    mysql_db: SqlHarness, mysql_dsn: str
) -> None:
    job_id = enqueue_committed(mysql_db, "plans/job", {"n": 4})
    ran: list[str] = []
    # Connections of its own, without the flag (the harness's have it under PROLETARIAN_TEST_COMPACT=1).
    backend = MySQLBackend(connection_factory(mysql_dsn), compact=True)
    with pytest.raises(ConfigurationError, match=r"CLIENT\.MULTI_STATEMENTS"):
        _run(mysql_db, backend, lambda job_type, payload: ran.append(job_type))
    assert ran == []
    assert _queued(mysql_db) == [(job_id, 0)]
    assert mysql_db.archived_jobs() == []


@pytest.mark.parametrize("option", ["pipeline", "compact"])
def test_a_plan_option_must_be_a_bool(option: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{option} must be True or False"):
        PostgresBackend(lambda: None, **{option: 1})  # type: ignore[arg-type]
    if option == "compact":
        with pytest.raises(ConfigurationError, match="compact must be True or False"):
            MySQLBackend(lambda: None, compact=1)  # type: ignore[arg-type]


# -- batch mode (create_queue_worker's batch_size > 1) on each plan ------------------------------------------

BATCH = 8


def _fails_one(job_type: str, payload: Any) -> None:
    if payload["n"] == 1:
        raise RuntimeError("job 1 fails, and is archived as a failure on its own (no retries)")


def _enqueue_batch(db: SqlHarness, count: int) -> list[Any]:
    """`count` jobs with payloads that need escaping and attempts other than 0; their stored rows."""
    for n in range(count):
        enqueue_committed(db, "plans/batch", {"text": f"é'\"\\ %s \n ✓ {n}", "n": n})
    db.execute(f"UPDATE {db.job_table} SET attempts = 2")
    return db.select(f"SELECT {_JOB_COLUMNS} FROM {db.job_table}")


def _restore(db: SqlHarness, rows: list[Any]) -> None:
    db.clear()
    for row in rows:
        db.execute(f"INSERT INTO {db.job_table} ({_JOB_COLUMNS}) VALUES ({', '.join(['%s'] * 7)})", row)


@pytest.mark.parametrize("plan", OTHER_PLANS, ids=_plan_id)
def test_every_plan_archives_a_batch_into_the_very_rows_of_the_plain_plan(
    request: pytest.FixtureRequest, plan: tuple[str, dict[str, bool]]
) -> None:
    dialect, options = plan
    db = _harness(request, dialect)
    job_rows = _enqueue_batch(db, 4)
    archived: dict[str, list[tuple[Any, ...]]] = {}
    for name, plan_options in (("plain", {}), ("other", options)):
        _restore(db, job_rows)
        assert _run(db, _backend(request, dialect, plan_options), _fails_one, batch_size=BATCH) is True
        assert db.jobs() == []
        archived[name] = sorted(_archived_rows(db))
    assert [(row[4], row[5]) for row in archived["plain"]].count((3, ":success")) == 3
    assert [(row[4], row[5]) for row in archived["plain"]].count((3, ":failure")) == 1
    # Every column as the driver reads it, the payloads' text and finished_at's microseconds included.
    assert archived["other"] == archived["plain"]


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_the_compact_plan_sends_a_batchs_archive_and_delete_as_one_statement(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    db = _harness(request, dialect)
    sent: dict[bool, list[str]] = {}
    for compact in (False, True):
        for n in range(3):
            enqueue_committed(db, "plans/batch", {"n": n})
        backend = _backend(request, dialect, {"compact": compact}, _mutant(dialect, _Counting))
        sent[compact] = backend.statements = []  # type: ignore[attr-defined]
        assert _run(db, backend, batch_size=BATCH) is True
        assert db.jobs() == []
    assert len(sent[False]) == 3  # the claim, archive_jobs, delete_jobs (BEGIN and COMMIT apart)
    claim, write = sent[True]
    assert claim == sent[False][0]
    assert "INSERT INTO" in write and "DELETE FROM" in write and "IN (%s, %s, %s)" in write
    if dialect == "mysql":
        # The two batch statements, as they are, in one query.
        assert write == f"{sent[False][1]};\n{sent[False][2]}"
    assert len(db.archived_jobs()) == 6


class _BatchWriteBreaks(SqlBackend):
    """The compact batch write goes wrong in the way `breakage` names, after the claim and the handlers."""

    breakage: str

    def _execute(self, conn: Any, statement: str, params: Any, read: Any, *, copy: bool = False) -> Any:
        if "IN (" in statement and "DELETE FROM" in statement and "INSERT INTO" in statement:
            statement = _broken(statement, self.breakage)
        return super()._execute(conn, statement, params, read, copy=copy)


def _broken(statement: str, breakage: str) -> str:
    if statement.startswith("WITH moved"):  # PostgreSQL: one statement
        assert statement.endswith("FROM moved")
        # The DELETE inside runs either way; the archive INSERT then takes no row, or fails part-way.
        return statement + (" WHERE false" if breakage == "count" else " WHERE 1 / (attempts - attempts) = 1")
    # MySQL: the archive INSERT runs and is counted first, then the DELETE matches no row or fails.
    archive, delete = statement.split(";\n")
    assert delete.startswith("DELETE FROM")
    if breakage == "count":
        return f"{archive};\n{delete.replace('WHERE', 'WHERE false AND', 1)}"
    return f"{archive};\n{delete.replace('WHERE', 'WHERE no_such_column = 1 AND', 1)}"


COMPACT_PLANS = [plan for plan in PLANS if plan[1].get("compact")]


@pytest.mark.parametrize("breakage", ["count", "error"])
@pytest.mark.parametrize("plan", COMPACT_PLANS, ids=_plan_id)
def test_a_compact_batch_write_that_fails_leaves_every_job_of_the_batch_queued_and_none_archived(
    request: pytest.FixtureRequest, plan: tuple[str, dict[str, bool]], breakage: str
) -> None:
    dialect, options = plan
    db = _harness(request, dialect)
    job_ids = sorted(enqueue_committed(db, "plans/batch", {"n": n}) for n in range(3))
    backend = _backend(request, dialect, options, _mutant(dialect, _BatchWriteBreaks))
    backend.breakage = breakage  # type: ignore[attr-defined]
    ran: list[int] = []
    # A wrong count raises the backend's own error; a failed statement the driver's, translated.
    with pytest.raises(DatabaseError, match="changed 0 rows of 3 jobs" if breakage == "count" else None):
        _run(db, backend, lambda job_type, payload: ran.append(payload["n"]), batch_size=BATCH)
    assert sorted(ran) == [0, 1, 2]  # every handler ran (MySQL's seconds may tie their order)
    # The half of the write that ran (the DELETE on PostgreSQL, the archive INSERT on MySQL) rolled back
    # with the rest of the transaction: the whole batch runs again, attempts unchanged.
    assert sorted(_queued(db)) == [(job_id, 0) for job_id in job_ids]
    assert db.archived_jobs() == []


# -- the pipelined plan's exchanges --------------------------------------------------------------------------


@pytest.mark.parametrize("compact", [False, True], ids=["exact", "compact"])
def test_a_pipelined_job_takes_three_exchanges_its_begin_going_with_the_claim(
    pg_db: SqlHarness, compact: bool
) -> None:
    from benchmarks.costs import RoundTrips

    for n in range(4):
        enqueue_committed(pg_db, "plans/job", {"n": n})
    backend = PostgresBackend(pg_db.data_source, pipeline=True, compact=compact)
    options = {**pg_db.table_options, "backend": backend, "clock": lambda: LATER}
    trips = RoundTrips()
    try:
        assert process_next_job(pg_db.data_source, _noop, **options) is True  # connects, enters the pipeline
        with trips.installed():
            for _ in range(3):
                assert process_next_job(pg_db.data_source, _noop, **options) is True
            counted = trips.count
    finally:
        backend.close()
    # BEGIN and the claim, then the archive with the delete (one statement or two, counts checked), then
    # COMMIT: psycopg's own BEGIN would have been an exchange of its own.
    assert counted == 3 * 3
    assert len(pg_db.archived_jobs()) == 4
    assert pg_db.jobs() == []


def test_a_pipelined_transaction_whose_first_read_is_not_a_claim_still_commits(pg_db: SqlHarness) -> None:
    backend = PostgresBackend(pg_db.data_source, pipeline=True)
    try:
        with backend.transaction() as conn:
            # Read with psycopg's flush request: the BEGIN queued before it has had no Sync's answer, so
            # psycopg takes the transaction for idle.
            assert conn.execute("SELECT 1").fetchone() == (1,)
            job_id = enqueue(conn, "plans/job", {"n": 1}, job_table=pg_db.job_table)
            assert conn.execute("SELECT 2").fetchone() == (2,)  # the last statement read, flushed too
            pid = conn.info.backend_pid
        (state,) = pg_db.select("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,))
    finally:
        backend.close()
    assert state == ("idle",)  # not 'idle in transaction'
    assert _queued(pg_db) == [(job_id, 0)]  # committed: seen from another connection


def test_a_pipelined_connection_with_an_isolation_level_begins_its_transactions_at_that_level(
    pg_db: SqlHarness, pg_dsn: str
) -> None:
    import psycopg

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(pg_dsn)
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        return conn

    backend = PostgresBackend(connect, pipeline=True)
    try:
        for _ in range(2):  # the second on the connection left in pipeline mode
            with backend.transaction() as conn:
                assert conn.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
    finally:
        backend.close()
