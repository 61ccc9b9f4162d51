"""The operations API on PostgreSQL and MySQL: list, show, retry, cancel, reschedule, purge."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cli_support import Target, copy_to_job_table, fail_next, parametrize_dialects, target

from proletarian_ref import enqueue, process_next_job
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.ops import db
from proletarian_ref.ops import health as ops_health
from proletarian_ref.ops import stats as ops_stats
from proletarian_ref.ops.db import Tables, statements
from proletarian_ref.ops.health import check_health
from proletarian_ref.ops.jobs import (
    STATUS_CANCELLED,
    JobFilter,
    PurgeFilter,
    cancel_jobs,
    iter_jobs,
    list_jobs,
    purge_archive,
    purge_count,
    reschedule_jobs,
    retry_jobs,
    show_job,
)
from proletarian_ref.ops.stats import queue_stats

pytest_generate_tests = parametrize_dialects


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "opsapi")


def _tables(database: Target) -> Tables:
    return Tables.of(database.job_table, database.archived_job_table)


def _enqueue(database: Target, job_type: str, payload: Any, **options: Any) -> Any:
    conn = database.harness.connect()
    try:
        job_id = enqueue(conn, job_type, payload, job_table=database.job_table, **options)
        conn.commit()
    finally:
        conn.close()
    return job_id


@pytest.fixture
def conn(database: Target) -> Iterator[Any]:
    connection = database.harness.connect()
    yield connection
    connection.close()


def _locked(database: Target, job_id: Any) -> Any:
    """A connection holding the job's row lock, as a worker running it does."""
    holder = database.harness.connect()
    stored = job_id.bytes if database.dialect == "mysql" else job_id
    cursor = holder.cursor()
    cursor.execute(f"SELECT job_id FROM {database.job_table} WHERE job_id = %s FOR UPDATE", (stored,))
    assert cursor.fetchall()
    return holder


def test_listing_pages_by_keyset_visits_every_job_once_in_run_order(database: Target, conn: Any) -> None:
    ids = [_enqueue(database, "a/t", {"n": n}, process_in=timedelta(seconds=n * 10)) for n in range(7)]
    _enqueue(database, "a/other", {}, queue="other/q")
    seen: list[Any] = []
    after = None
    pages = 0
    while True:
        page = list_jobs(
            conn, JobFilter(queue="proletarian/default"), after=after, limit=3, tables=_tables(database)
        )
        seen += [job.job_id for job in page.jobs]
        pages += 1
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert (seen, pages) == (ids, 3)
    by_type = list(iter_jobs(conn, JobFilter(job_type="a/other"), tables=_tables(database)))
    assert [job.queue for job in by_type] == [":other/q"]
    scheduled = list(iter_jobs(conn, JobFilter(status="scheduled"), tables=_tables(database)))
    assert [job.job_id for job in scheduled] == ids[1:]


def test_show_decodes_the_payload_as_a_default_handler_sees_it(database: Target, conn: Any) -> None:
    job_id = _enqueue(database, "a/t", {"email": "a@b", "tags": ["x", 1]})
    shown = show_job(conn, str(job_id), tables=_tables(database))
    assert shown is not None and shown.status is None
    assert shown.payload() == {"email": "a@b", "tags": ["x", 1]}
    assert show_job(conn, "00000000-0000-4000-8000-000000000000", tables=_tables(database)) is None


def test_a_retried_row_is_the_enqueued_row_with_attempts_zero_and_a_new_process_at(
    database: Target, conn: Any
) -> None:
    job_id = _enqueue(database, "my.app/mail", {"to": "a@b", "n": [1, 2.5, None]}, queue="mail/q")
    [enqueued] = database.jobs()
    fail_next(database, "mail/q")
    [archived] = database.archived_jobs()
    assert (archived.status, archived.attempts) == (":failure", 1)
    later = datetime.now(UTC) + timedelta(hours=1)
    results = retry_jobs(conn, [job_id], process_at=later, tables=_tables(database))
    assert [r.outcome for r in results] == ["retried"]
    [retried] = database.jobs()
    assert retried._replace(process_at=enqueued.process_at) == enqueued
    assert retried.attempts == 0
    assert retried.process_at >= later.replace(microsecond=0)
    assert database.archived_jobs() == []


def test_two_retries_of_one_job_at_once_leave_exactly_one_job(database: Target) -> None:
    ids = [_enqueue(database, "a/t", {"n": n}) for n in range(4)]
    for _ in ids:
        fail_next(database)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def retry_all() -> None:
        connection = database.harness.connect()
        try:
            barrier.wait()
            outcomes.extend(r.outcome for r in retry_jobs(connection, ids, tables=_tables(database)))
        finally:
            connection.close()

    threads = [threading.Thread(target=retry_all) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["queued"] * 4 + ["retried"] * 4
    assert sorted(
        str(job.job_id) for job in list_jobs(database.harness.connect(), tables=_tables(database)).jobs
    ) == sorted(str(i) for i in ids)
    assert database.archived_jobs() == []


def test_a_retry_waiting_on_another_finds_the_job_gone(database: Target, conn: Any) -> None:
    job_id = _enqueue(database, "a/t", {})
    fail_next(database)
    holder = database.harness.connect()
    stored = job_id.bytes if database.dialect == "mysql" else job_id
    cursor = holder.cursor()
    cursor.execute(
        f"SELECT job_id FROM {database.archived_job_table} WHERE job_id = %s FOR UPDATE", (stored,)
    )
    result: list[str] = []
    waiting = threading.Thread(
        target=lambda: result.extend(r.outcome for r in retry_jobs(conn, [job_id], tables=_tables(database)))
    )
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive(), "the second retry must wait for the first one's lock"
    cursor.execute(f"DELETE FROM {database.archived_job_table} WHERE job_id = %s", (stored,))
    holder.commit()
    holder.close()
    waiting.join(30)
    assert result == ["not-found"]
    assert database.jobs() == []


def test_cancel_archives_a_queued_job_with_a_keyword_status_and_skips_a_running_one(
    database: Target, conn: Any
) -> None:
    idle, running = _enqueue(database, "a/t", {"n": 1}), _enqueue(database, "a/t", {"n": 2})
    holder = _locked(database, running)
    try:
        results = cancel_jobs(
            conn, [idle, running, "00000000-0000-4000-8000-000000000001"], tables=_tables(database)
        )
    finally:
        holder.rollback()
        holder.close()
    assert [r.outcome for r in results] == ["cancelled", "running", "not-found"]
    [archived] = database.archived_jobs()
    assert archived.status == STATUS_CANCELLED == to_keyword_text(archived.status, what="status")
    assert archived.attempts == 0
    assert [job.payload for job in database.jobs()] == ['["^ ","~:n",2]']


def test_reschedule_moves_queued_jobs_and_reports_running_ones(database: Target, conn: Any) -> None:
    free, running = _enqueue(database, "a/t", {}), _enqueue(database, "a/t", {})
    before = {job.job_id: job for job in database.jobs()}
    later = datetime.now(UTC) + timedelta(days=1)
    holder = _locked(database, running)
    try:
        results = reschedule_jobs(conn, [free, running], later, tables=_tables(database))
    finally:
        holder.rollback()
        holder.close()
    assert [r.outcome for r in results] == ["rescheduled", "running"]
    after = {job.job_id: job for job in database.jobs()}
    for job_id, job in after.items():
        assert job._replace(process_at=before[job_id].process_at) == before[job_id]
    moved = [job for job in after.values() if job.process_at != before[job.job_id].process_at]
    assert len(moved) == 1 and moved[0].process_at >= later.replace(microsecond=0)


def test_purge_deletes_only_old_archived_rows_in_batches(database: Target, conn: Any) -> None:
    for n in range(5):
        _enqueue(database, "a/t", {"n": n})
        fail_next(database)
    old = "NOW() - INTERVAL 2 DAY" if database.dialect == "mysql" else "NOW() - INTERVAL '2 days'"
    database.harness.execute(
        f"UPDATE {database.archived_job_table} SET finished_at = {old} WHERE payload <> %s",
        ('["^ ","~:n",4]',),
    )
    purge = PurgeFilter(older_than=timedelta(days=1))
    assert purge_count(conn, purge, tables=_tables(database)) == 4
    progress: list[int] = []
    deleted = purge_archive(conn, purge, tables=_tables(database), batch_size=3, on_batch=progress.append)
    assert (deleted, progress) == (4, [3, 4])
    assert [job.payload for job in database.archived_jobs()] == ['["^ ","~:n",4]']


def test_bad_ids_and_filters_are_refused_before_anything_changes(database: Target, conn: Any) -> None:
    job_id = _enqueue(database, "a/t", {})
    with pytest.raises(ValueError, match="not a job id"):
        cancel_jobs(conn, [job_id, "nope"], tables=_tables(database))
    assert len(database.jobs()) == 1
    with pytest.raises(ValueError, match="invalid queue"):
        JobFilter(queue="has space")
    with pytest.raises(ValueError, match="min_attempts"):
        JobFilter(min_attempts=-1)


@pytest.mark.parametrize("filename", ["ops.sql", "stats.sql"])
def test_both_dialects_name_the_same_statements(filename: str) -> None:
    assert statements("postgresql", filename).keys() == statements("mysql", filename).keys()


def _session_state(conn: Any, dialect: str) -> Any:
    cursor = conn.cursor()
    if dialect == "mysql":
        cursor.execute("SHOW SESSION VARIABLES")
    else:
        cursor.execute("SELECT name, setting FROM pg_settings ORDER BY name")
    rows = sorted((str(name), str(value)) for name, value in cursor.fetchall())
    cursor.close()
    return [row for row in rows if row[0] not in {"timestamp", "in_transaction", "last_insert_id"}]


def test_reads_leave_the_callers_session_and_open_transaction_and_writes_refuse_to_commit_it(
    database: Target, conn: Any
) -> None:
    """The brief: the library never changes state it does not own. A read keeps the caller's pending
    write and session (MySQL in a zone of its own); a write that commits refuses a caller's transaction.
    """
    job_id = _enqueue(database, "a/t", {})
    cursor = conn.cursor()
    if database.dialect == "mysql":
        cursor.execute("SET time_zone = '+05:30'")
    else:
        cursor.execute("SET TimeZone = 'Asia/Kolkata'")
    conn.commit()
    before = _session_state(conn, database.dialect)
    # The caller's own write, not committed yet.
    enqueue(conn, "caller/pending", {}, job_table=database.job_table)
    page = list_jobs(conn, JobFilter(queue="proletarian/default"), tables=_tables(database))
    assert {job.job_type for job in page.jobs} >= {":a/t", ":caller/pending"}
    assert show_job(conn, job_id, tables=_tables(database)) is not None
    with pytest.raises(ConfigurationError, match="has one open"):
        reschedule_jobs(conn, [job_id], datetime.now(UTC), tables=_tables(database))
    assert _session_state(conn, database.dialect) == before
    conn.commit()  # the caller's write survived every read
    assert sorted(job.job_type for job in database.jobs()) == [":a/t", ":caller/pending"]


def test_the_archived_status_lists_and_purges_every_archived_job(database: Target, conn: Any) -> None:
    """docs/cli.md: `archived` is every status, never the literal keyword :archived."""
    failed = _enqueue(database, "a/t", {"n": 1})
    fail_next(database)
    cancelled = _enqueue(database, "a/t", {"n": 2})
    cancel_jobs(conn, [cancelled], tables=_tables(database))
    listed = list_jobs(conn, JobFilter(status="archived"), tables=_tables(database))
    assert sorted(str(job.job_id) for job in listed.jobs) == sorted([str(failed), str(cancelled)])
    purge = PurgeFilter(older_than=timedelta(0), status="archived")
    assert purge_count(conn, purge, tables=_tables(database)) == 2
    assert purge_archive(conn, purge, tables=_tables(database)) == 2
    assert database.archived_jobs() == []


def test_a_job_a_worker_holds_is_running_not_due_in_list_show_stats_and_health(
    database: Target, conn: Any
) -> None:
    """A worker's claim holds the row: list, show and stats say running, and the lag counts only the due
    jobs no worker holds, so a busy worker is not a lagging queue."""
    held, waiting = _enqueue(database, "a/t", {"n": 1}), _enqueue(database, "a/t", {"n": 2}, queue="q/two")
    old = "NOW() - INTERVAL 2 HOUR" if database.dialect == "mysql" else "NOW() - INTERVAL '2 hours'"
    database.harness.execute(f"UPDATE {database.job_table} SET process_at = {old}")
    holder = _locked(database, held)
    try:
        states = {
            str(j.job_id): j.state(datetime.now(UTC)) for j in list_jobs(conn, tables=_tables(database)).jobs
        }
        shown = show_job(conn, held, tables=_tables(database))
        stats = {
            q.queue: q
            for q in queue_stats(
                conn,
                job_table=database.job_table,
                archived_job_table=database.archived_job_table,
                archived=False,
            ).queues
        }
        report = check_health(
            conn, tables=_tables(database), max_lag=timedelta(minutes=1), queue="proletarian/default"
        )
    finally:
        holder.rollback()
        holder.close()
    assert states == {str(held): "running", str(waiting): "due"}
    assert shown is not None and shown.state(datetime.now(UTC)) == "running"
    default, other = stats["proletarian/default"], stats["q/two"]
    assert (default.due, default.running, default.oldest_due_age) == (0, 1, None)
    assert (other.due, other.running) == (1, 0)
    assert other.oldest_due_age is not None and other.oldest_due_age > timedelta(hours=1)
    assert report.healthy, report.to_json()
    lagging = check_health(conn, tables=_tables(database), max_lag=timedelta(minutes=1))
    assert lagging.failed("lag") and "q/two" in next(c.detail for c in lagging.checks if c.name == "lag")


def test_a_health_probe_never_reads_the_archive(
    database: Target, conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's cost must not grow with the archive: not one of its statements names it."""
    _enqueue(database, "a/t", {})
    fail_next(database)
    seen: list[str] = []
    real = db.execute

    def recording(conn: Any, dialect: str, statement: str, params: dict[str, Any]) -> Any:
        seen.append(statement)
        return real(conn, dialect, statement, params)

    for module in (db, ops_stats, ops_health):
        monkeypatch.setattr(module, "execute", recording, raising=False)
    monkeypatch.setattr(db, "query", lambda c, d, s, p: recording(c, d, s, p)[0])
    for module in (ops_stats, ops_health):
        monkeypatch.setattr(module, "query", db.query)
    report = check_health(conn, tables=_tables(database))
    assert report.healthy, report.to_json()
    assert len(seen) >= 4  # the schema's two tables, the job table's counts and its held rows, the claims
    assert not [s for s in seen if database.archived_job_table in s]


def _failures(database: Target, count: int) -> list[Any]:
    """`count` archived :failure jobs, each failed before the next is enqueued (MySQL keeps whole seconds)."""
    ids = []
    for n in range(count):
        ids.append(_enqueue(database, "a/t", {"n": n}))
        fail_next(database)
    return ids


def test_each_retried_job_has_its_own_outcome_and_a_conflict_spoils_no_other(
    database: Target, conn: Any
) -> None:
    """One id that is also queued (the INSERT's unique key refuses it) is reported as a conflict with the
    database's reason; the jobs before and after it are retried all the same."""
    first, clash, last = _failures(database, 3)
    copy_to_job_table(database, str(clash))
    seen: list[str] = []
    results = retry_jobs(
        conn, [first, clash, last], tables=_tables(database), on_result=lambda r: seen.append(r.outcome)
    )
    assert [r.outcome for r in results] == seen == ["retried", "conflict", "retried"]
    assert "1062" in results[1].detail or "23505" in results[1].detail
    assert [str(db.decode_job_id(job.job_id)) for job in database.archived_jobs()] == [str(clash)]
    assert len(database.jobs()) == 3


def test_two_retries_of_the_same_jobs_in_opposite_orders_never_deadlock(database: Target) -> None:
    ids = _failures(database, 12) if database.dialect == "postgresql" else _failures(database, 4)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def retry_all(order: list[Any]) -> None:
        connection = database.harness.connect()
        try:
            barrier.wait()
            outcomes.extend(r.outcome for r in retry_jobs(connection, order, tables=_tables(database)))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=retry_all, args=(order,)) for order in (ids, ids[::-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(outcomes) == ["queued"] * len(ids) + ["retried"] * len(ids)
    assert (len(database.jobs()), database.archived_jobs()) == (len(ids), [])


def test_retry_says_what_a_job_it_leaves_alone_is_and_takes_back_a_cancelled_one(
    database: Target, conn: Any
) -> None:
    succeeded = _enqueue(database, "a/t", {"n": 0})
    assert process_next_job(
        database.harness.data_source,
        lambda job_type, payload: None,
        job_table=database.job_table,
        archived_job_table=database.archived_job_table,
        log=lambda event, data: None,
    )
    queued, cancelled = _enqueue(database, "a/t", {"n": 1}), _enqueue(database, "a/t", {"n": 2})
    cancel_jobs(conn, [cancelled], tables=_tables(database))
    missing = "00000000-0000-4000-8000-000000000000"
    results = retry_jobs(conn, [succeeded, queued, cancelled, missing], tables=_tables(database))
    assert [(r.outcome, r.detail) for r in results] == [
        ("not-retryable", "archived with status :success: only :failure and :cancelled are retried"),
        ("queued", "still queued, not archived"),
        ("retried", "was :cancelled"),
        ("not-found", f"in neither {database.job_table} nor {database.archived_job_table}"),
    ]
    assert sorted(str(db.decode_job_id(job.job_id)) for job in database.jobs()) == sorted(
        [str(queued), str(cancelled)]
    )


class _PausingConnection:
    """A connection whose first commit first runs `before_commit`: a look inside a purge's open batch."""

    def __init__(self, conn: Any, before_commit: Callable[[], None]) -> None:
        self._conn = conn
        self._before_commit: Callable[[], None] | None = before_commit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def commit(self) -> None:
        hook, self._before_commit = self._before_commit, None
        if hook is not None:
            hook()
        self._conn.commit()


def test_a_worker_archives_a_job_while_a_purge_batch_is_open(database: Target, conn: Any) -> None:
    """A purge never blocks a worker: while a batch's transaction is open (its rows deleted, not yet
    committed), a worker claims a job and runs Proletarian's archive INSERT, which must not wait. The
    worker's session gives up on a lock after 1 s, so waiting would be an error here, not a delay."""
    for n in range(3):
        _enqueue(database, "a/t", {"n": n})
        fail_next(database)
    old = "NOW() - INTERVAL 2 DAY" if database.dialect == "mysql" else "NOW() - INTERVAL '2 days'"
    database.harness.execute(f"UPDATE {database.archived_job_table} SET finished_at = {old}")
    job_id = _enqueue(database, "a/t", {"n": "new"})
    archived: list[Any] = []

    def worker_archives() -> None:
        worker = database.harness.connect()
        try:
            cursor = worker.cursor()
            timeout = (
                "SET SESSION innodb_lock_wait_timeout = 1"
                if database.dialect == "mysql"
                else "SET lock_timeout = '1s'"
            )
            cursor.execute(timeout)
            stored = job_id.bytes if database.dialect == "mysql" else job_id
            cursor.execute(
                f"SELECT job_id FROM {database.job_table} WHERE job_id = %s FOR UPDATE SKIP LOCKED", (stored,)
            )
            assert cursor.fetchall()
            archive = db.render(database.dialect, "queries.sql", "archive_job", _tables(database))
            params = {
                "job_id": stored,
                "status": ":success",
                "finished_at": db.db_time(database.dialect, datetime.now(UTC)),
            }
            cursor.execute(archive, params)
            archived.append(cursor.rowcount)
            worker.rollback()
        finally:
            worker.close()

    pausing = _PausingConnection(conn, worker_archives)
    purge = PurgeFilter(older_than=timedelta(days=1))
    deleted = purge_archive(
        pausing, purge, tables=_tables(database), dialect=database.dialect, batch_size=100
    )
    assert (deleted, archived) == (3, [1])


def test_a_cancel_the_archive_refuses_is_that_jobs_conflict_alone(database: Target, conn: Any) -> None:
    """A queued job whose id the archive holds already (no operation writes that; a hand-made row can):
    its archive INSERT is refused, it stays queued, and the job after it is cancelled all the same."""
    clash = _enqueue(database, "a/t", {"n": 1})
    fail_next(database)
    copy_to_job_table(database, str(clash))
    other = _enqueue(database, "a/t", {"n": 2})
    results = cancel_jobs(conn, [clash, other], tables=_tables(database))
    assert [r.outcome for r in results] == ["conflict", "cancelled"]
    assert [str(db.decode_job_id(job.job_id)) for job in database.jobs()] == [str(clash)]


def test_queue_stats_of_named_queues_reads_those_alone(database: Target, conn: Any) -> None:
    _enqueue(database, "a/t", {}, queue="q/one")
    _enqueue(database, "a/t", {}, queue="q/two")
    stats = queue_stats(
        conn,
        job_table=database.job_table,
        archived_job_table=database.archived_job_table,
        archived=False,
        queues=["q/two", ":q/three"],
    )
    assert [(q.queue, q.due) for q in stats.queues] == [("q/two", 1)]
