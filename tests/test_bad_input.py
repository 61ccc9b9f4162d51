"""Bad input at enqueue, odd rows in the table and broken options: refused clearly or run, never lost."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any, cast

import pytest
from support import RecordingLog, enqueue_committed, wait_until

from conformance.harness import Harness, SqlHarness
from proletarian_ref import (
    ConfigurationError,
    FailedJobFnError,
    InvalidKeywordError,
    InvalidRetryStrategyError,
    Job,
    PayloadDecodeError,
    SerializationError,
    create_queue_worker,
    enqueue,
)
from proletarian_ref import log as ev
from proletarian_ref.job_ids import default_job_id_strategy
from proletarian_ref.serializers import create_serializer

# -- enqueue: refused before any SQL, the caller's transaction intact -----------------------------------


class BrokenSerializer:
    """A custom serializer that returns `result` (or raises it)."""

    def __init__(self, result: object) -> None:
        self.result = result

    def encode(self, data: Any) -> Any:
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result

    def decode(self, text: str) -> Any:
        return text


def self_containing() -> list[Any]:
    payload: list[Any] = []
    payload.append(payload)
    return payload


NOW = datetime.now(UTC)

# (what is wrong, enqueue keyword arguments, the error, words the message must contain)
BAD_ENQUEUES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("an object with no Transit form", {"payload": object()}, SerializationError, "no Transit form"),
    ("a lone surrogate", {"payload": {"k": "\ud800"}}, SerializationError, "lone surrogate"),
    ("a payload that contains itself", {"payload": self_containing()}, SerializationError, "contains itself"),
    ("a naive datetime in the payload", {"payload": datetime(2026, 1, 1)}, SerializationError, "naive"),
    (
        "a serializer returning bytes",
        {"serializer": BrokenSerializer(b"[]")},
        SerializationError,
        "must return str",
    ),
    (
        "a serializer returning invalid Unicode",
        {"serializer": BrokenSerializer('"\udc80"')},
        SerializationError,
        "not valid Unicode",
    ),
    (
        "a serializer that raises",
        {"serializer": BrokenSerializer(RuntimeError("codec down"))},
        SerializationError,
        "codec down",
    ),
    ("a job type with a space", {"job_type": "send email"}, InvalidKeywordError, "job_type"),
    ("an empty job type", {"job_type": ""}, InvalidKeywordError, "job_type"),
    ("an auto-resolved job type", {"job_type": "::x"}, InvalidKeywordError, "job_type"),
    ("a job type that is not text", {"job_type": 42}, InvalidKeywordError, "job_type"),
    ("a queue with a quote", {"queue": 'q"x'}, InvalidKeywordError, "queue"),
    ("a queue that is None", {"queue": None}, InvalidKeywordError, "queue"),
    ("a naive process_at", {"process_at": datetime(2030, 1, 1)}, ConfigurationError, "naive"),
    ("a date as process_at", {"process_at": date(2030, 1, 1)}, ConfigurationError, "process_at"),
    ("milliseconds as process_in", {"process_in": 5000}, ConfigurationError, "timedelta"),
    ("the largest process_in", {"process_in": timedelta.max}, ConfigurationError, "past year 9999"),
    (
        "a process_at past year 9999 in UTC",
        {"process_at": datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))},
        ConfigurationError,
        "past year 9999",
    ),
    ("a table name with SQL in it", {"job_table": "job; DROP TABLE job"}, ConfigurationError, "table name"),
    ("a clock giving local time", {"clock": lambda: datetime(2026, 1, 1)}, ConfigurationError, "clock"),
]


def good_then(db: Harness, bad: Callable[[Any], object], error: type[Exception], words: str) -> None:
    """In one transaction: a good job, the bad call (which must raise), a good job; then commit.

    Only the two good jobs may be in the table afterwards. On PostgreSQL a statement the server had
    refused would have aborted the transaction, so the second good job proves nothing was sent.
    """
    conn = db.connect()
    try:
        enqueue(conn, "fault/good", "before", job_table=db.job_table)
        with pytest.raises(error, match=words):
            bad(conn)
        enqueue(conn, "fault/good", "after", job_table=db.job_table)
        conn.commit()
    finally:
        conn.close()
    serializer = create_serializer()
    assert sorted(serializer.decode(job.payload) for job in db.jobs()) == ["after", "before"]


@pytest.mark.parametrize(
    ("case", "options", "error", "words"), BAD_ENQUEUES, ids=[c[0] for c in BAD_ENQUEUES]
)
def test_bad_enqueue_input_is_refused_by_name_and_inserts_nothing(
    db: Harness, case: str, options: dict[str, Any], error: type[Exception], words: str
) -> None:
    arguments = {"job_type": "fault/bad", "payload": "p", "job_table": db.job_table, **options}

    def bad(conn: Any) -> object:
        return enqueue(conn, **arguments)

    good_then(db, bad, error, words)


def test_a_negative_process_in_or_a_past_process_at_means_now_as_in_proletarian(db: Harness) -> None:
    enqueue_committed(db, "fault/past", 1, process_in=timedelta(days=-3))
    enqueue_committed(db, "fault/past", 2, process_at=datetime(2001, 1, 1, tzinfo=UTC))
    enqueue_committed(
        db, "fault/past", 3, process_at=datetime.min.replace(tzinfo=timezone(timedelta(hours=5)))
    )
    assert [job.process_at == job.enqueued_at for job in db.jobs()] == [True, True, True]


@pytest.mark.parametrize(
    "options",
    [
        {"process_at": datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC)},
        {"process_at": datetime(2038, 1, 19, 3, 14, 7, 500_000, tzinfo=UTC)},  # rounds up to :08
        {"process_in": timedelta(days=365 * 20)},
    ],
    ids=["one second too late", "half a second too late", "twenty years"],
)
def test_mysql_refuses_a_process_at_past_2038_before_the_insert(
    mysql_db: SqlHarness, options: dict[str, Any]
) -> None:
    """MySQL's TIMESTAMP ends at 2038-01-19 03:14:07 UTC. In strict mode the server would refuse the
    INSERT; without it, it would store 0000-00-00 and the job would run at once. The check comes
    first, in either mode.
    """

    def bad(conn: Any) -> object:
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION sql_mode = ''")  # the server would zero the time, not refuse it
        return enqueue(conn, "fault/late", "p", job_table=mysql_db.job_table, **options)

    good_then(mysql_db, bad, ConfigurationError, "2038-01-19 03:14:07")


def test_mysql_takes_the_last_second_timestamp_can_hold(mysql_db: SqlHarness) -> None:
    last = datetime(2038, 1, 19, 3, 14, 7, tzinfo=UTC)
    enqueue_committed(mysql_db, "fault/late", "p", process_at=last)
    assert [job.process_at for job in mysql_db.jobs()] == [last]


def test_postgresql_takes_any_time_python_can_hold(pg_db: SqlHarness) -> None:
    last = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    enqueue_committed(pg_db, "fault/late", "p", process_at=last)
    assert [job.process_at for job in pg_db.jobs()] == [last]


# -- rows another program wrote --------------------------------------------------------------------------


def insert_row(
    db: SqlHarness,
    *,
    queue: str = ":proletarian/default",
    job_type: str = ":fault/raw",
    payload: str = '["~#\'","raw"]',
    attempts: int = 0,
    enqueued_at: str = "2020-01-01 00:00:00",
    process_at: str = "2020-01-01 00:00:00",
) -> Any:
    """Insert a row by SQL as another program would; returns the stored job id."""
    job_id = uuid.uuid4()
    stored = job_id.bytes if db.dialect == "mysql" else job_id
    sql = (
        f"INSERT INTO {db.job_table} (job_id, queue, job_type, payload, attempts, enqueued_at, process_at) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s)"
    )
    if db.dialect == "mysql":
        # A session without strict mode, as old tools have: it stores 0000-00-00 for an invalid time.
        conn = db.connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute("SET time_zone = '+00:00', sql_mode = ''")
                cursor.execute(sql, (stored, queue, job_type, payload, attempts, enqueued_at, process_at))
            conn.commit()
        finally:
            conn.close()
    else:
        db.execute(sql, (stored, queue, job_type, payload, attempts, enqueued_at, process_at))
    return stored


def archived_count(db: Harness) -> int:
    # Counted in SQL: the harness's readers would choke on the timestamps some of these rows hold.
    if isinstance(db, SqlHarness):
        return int(db.select(f"SELECT count(*) FROM {db.archived_job_table}")[0][0])
    return len(db.archived_jobs())


def drain(db: Harness, handler: Callable[..., object], expected: int, **options: Any) -> RecordingLog:
    """Run a worker until `expected` rows are archived; fails if it stops or takes too long."""
    log = RecordingLog()
    worker = create_queue_worker(
        db.data_source, handler, polling_interval_ms=10, log=log, **{**db.table_options, **options}
    )
    with worker:
        assert wait_until(lambda: archived_count(db) >= expected, timeout=30), log.named(ev.JOB_WORKER_ERROR)
        assert worker.running
    return log


@pytest.mark.sql_only
def test_a_payload_that_does_not_decode_is_archived_as_failure_byte_for_byte(db: Harness) -> None:
    """The handler is not called; the job fails with PayloadDecodeError through the retry strategy,
    failed_job_fn sees the raw text, the archive keeps it byte for byte, and other jobs run.
    """
    assert isinstance(db, SqlHarness)
    raw = '{"not transit": "é\u00a0☃\U0001f600", \\u0000'
    bad_id = insert_row(db, payload=raw)
    enqueue_committed(db, "fault/fine", "fine")
    handled: list[Any] = []
    failed: list[tuple[Job, BaseException]] = []
    log = drain(
        db,
        lambda job_type, payload: handled.append(payload),
        2,
        retry_strategy_fn=lambda job, exc: {"retries": 1, "delays": [0]},
        failed_job_fn=lambda job, exc: failed.append((job, exc)),
    )
    assert handled == ["fine"]
    (bad,) = [row for row in db.archived_jobs() if row.job_id == bad_id]
    assert (bad.status, bad.attempts, bad.payload) == (":failure", 2, raw)
    assert [(job.payload, type(exc)) for job, exc in failed] == [(raw, PayloadDecodeError)]
    assert len(log.named(ev.RETRYING)) == 1


@pytest.mark.sql_only
def test_a_job_type_no_handler_knows_fails_like_any_handler_error(db: Harness) -> None:
    assert isinstance(db, SqlHarness)
    handlers: dict[str, Callable[[Any], None]] = {"fault/known": lambda payload: None}

    def dispatch(job_type: str, payload: Any) -> None:
        handlers[job_type](payload)  # KeyError for a type nobody registered

    insert_row(db, job_type=":fault/unknown")
    enqueue_committed(db, "fault/known", "known")
    log = drain(db, dispatch, 2)
    statuses = {row.job_type: row.status for row in db.archived_jobs()}
    assert statuses == {":fault/unknown": ":failure", ":fault/known": ":success"}
    (failure,) = log.named(ev.HANDLE_JOB_EXCEPTION)
    assert isinstance(failure[ev.EXCEPTION], KeyError) and failure[ev.JOB_TYPE] == "fault/unknown"


@pytest.mark.sql_only
def test_text_without_the_leading_colon_is_taken_as_it_is(db: Harness) -> None:
    """A job type without the colon reaches the handler as written and is archived unchanged. A queue
    without it is another queue: a worker for "fault-plain" polls ":fault-plain", so the row waits,
    untouched and in nobody's way, until someone fixes it (or enqueues with backend-level text).
    """
    assert isinstance(db, SqlHarness)
    insert_row(db, job_type="plain-type")
    stray = insert_row(db, queue="fault-plain")
    seen: list[str] = []
    drain(db, lambda job_type, payload: seen.append(job_type), 1)
    stray_worker = create_queue_worker(
        db.data_source,
        lambda *_: seen.append("stray"),
        queue="fault-plain",
        polling_interval_ms=10,
        **db.table_options,
    )
    with stray_worker:
        time.sleep(0.3)
    assert seen == ["plain-type"]
    assert [row.job_type for row in db.archived_jobs()] == ["plain-type"]
    assert [(job.job_id, job.queue, job.attempts) for job in db.jobs()] == [(stray, "fault-plain", 0)]


@pytest.mark.sql_only
def test_timestamps_python_cannot_hold_are_read_as_the_nearest_and_the_job_runs(db: Harness) -> None:
    """PostgreSQL can store -infinity and BC dates; MySQL without strict mode stores 0000-00-00. Such a
    due job used to fail every claim, and being the oldest it would have blocked the whole queue. It
    now runs with datetime.min in the job map; the archive keeps the stored values.
    """
    assert isinstance(db, SqlHarness)
    if db.dialect == "postgresql":
        odd = [("-infinity", "-infinity"), ("0044-03-15 00:00:00+00 BC", "2020-01-01 00:00:00+00")]
        floor = "-infinity"
    else:
        odd = [("0000-00-00 00:00:00", "0000-00-00 00:00:00"), ("2040-01-01 00:00:00", "2020-01-01 00:00:00")]
        floor = "0000-00-00 00:00:00"
    for enqueued_at, process_at in odd:
        insert_row(db, enqueued_at=enqueued_at, process_at=process_at)
    enqueue_committed(db, "fault/fine", "fine")
    jobs: list[Job] = []
    drain(db, jobs.append, 3, handler_fn_mode="advanced")
    earliest = datetime.min.replace(tzinfo=UTC)
    assert sorted(job.enqueued_at for job in jobs)[:2] == [earliest, earliest]
    assert db.select(f"SELECT status FROM {db.archived_job_table}") == [(":success",)] * 3
    text = "CAST(enqueued_at AS CHAR)" if db.dialect == "mysql" else "enqueued_at::text"
    stored = {row[0] for row in db.select(f"SELECT {text} FROM {db.archived_job_table}")}
    assert any(value.startswith(floor) for value in stored)


@pytest.mark.sql_only
def test_a_negative_attempts_count_runs_and_is_archived_one_higher(db: Harness) -> None:
    assert isinstance(db, SqlHarness)
    insert_row(db, attempts=-5)
    drain(db, lambda *_: None, 1)
    assert [row.attempts for row in db.archived_jobs()] == [-4]


def assert_worker_stops_naming(db: Harness, key: object) -> None:
    """A worker over `db` stops by default on the row `key`, and its job-worker-error names that job."""
    log = RecordingLog()
    stopped = threading.Event()
    worker = create_queue_worker(
        db.data_source,
        lambda *_: None,
        polling_interval_ms=10,
        log=log,
        on_shutdown=stopped.set,
        **db.table_options,
    )
    worker.start()
    assert stopped.wait(20)
    (error,) = log.named(ev.JOB_WORKER_ERROR)
    assert error[ev.JOB_ID] == default_job_id_strategy(db.dialect).decode_id(key)


@pytest.mark.sql_only
def test_an_attempts_count_at_the_integer_limit_cannot_be_archived_and_stops_the_worker(db: Harness) -> None:
    """Known limit: archiving writes attempts + 1, which overflows INTEGER. The database refuses, the
    claim rolls back, the row stays as it was and job-worker-error names the job; by default the
    worker stops, as for any error it cannot classify. Fix the row (UPDATE ... SET attempts = 0).
    """
    assert isinstance(db, SqlHarness)
    key = insert_row(db, attempts=2**31 - 1)
    assert_worker_stops_naming(db, key)
    assert [(job.job_id, job.attempts) for job in db.jobs()] == [(key, 2**31 - 1)]
    assert db.archived_jobs() == []


def test_mysql_matches_queues_by_its_collation(mysql_db: SqlHarness) -> None:
    """The seed schema's TEXT columns use the database's collation (utf8mb4_general_ci by default):
    a worker for "fault/case" also claims rows whose queue another program wrote as ":FAULT/CASE" or
    with trailing spaces. PostgreSQL compares exactly. Use one spelling, or a binary collation.
    """
    insert_row(mysql_db, queue=":FAULT/CASE")
    insert_row(mysql_db, queue=":fault/case  ")
    queues: list[str] = []
    drain(mysql_db, lambda job: queues.append(job.queue), 2, queue="fault/case", handler_fn_mode="advanced")
    assert sorted(queues) == ["FAULT/CASE", "fault/case  "]


@pytest.mark.sql_only
def test_a_job_already_in_the_archive_stays_queued_and_is_reported(db: Harness) -> None:
    """Archiving a job id the archive already holds (a constant id, a row restored by hand) violates its
    primary key: job-worker-error names the job, the claim rolls back, the row stays; the worker stops
    by default. The data needs fixing, and nothing is lost meanwhile.
    """
    assert isinstance(db, SqlHarness)
    key = insert_row(db)
    db.execute(
        f"INSERT INTO {db.archived_job_table} (job_id, queue, job_type, payload, attempts, status, "
        "enqueued_at, process_at, finished_at) VALUES (%s, ':q', ':t', 'p', 1, ':success', "
        "'2020-01-01 00:00:00', '2020-01-01 00:00:00', '2020-01-01 00:00:00')",
        (key,),
    )
    assert_worker_stops_naming(db, key)
    assert [(job.job_id, job.attempts) for job in db.jobs()] == [(key, 0)]
    assert len(db.archived_jobs()) == 1


# -- broken options: never a silent endless loop -----------------------------------------------------------


class FailingUserCode(Exception):
    """What a user's failed_job_fn raises."""


class Fatal(BaseException):
    """A BaseException that is not an Exception, like a C extension's or SystemExit."""


def fail(job_type: str, payload: Any) -> None:
    raise RuntimeError("handler failed")


def fatal(job_type: str, payload: Any) -> None:
    raise Fatal("beyond Exception")


def raising_failed_job_fn(job: Job, exc: BaseException) -> None:
    raise FailingUserCode("failed_job_fn failed")


# (case, handler, options, the exception job-worker-error carries)
BROKEN_OPTIONS: list[tuple[str, Callable[..., object], dict[str, Any], type[BaseException]]] = [
    (
        "an invalid retry strategy",
        fail,
        {"retry_strategy_fn": lambda job, exc: "nonsense"},
        InvalidRetryStrategyError,
    ),
    (
        "a failed_job_fn that raises (Proletarian #30)",
        fail,
        {"failed_job_fn": raising_failed_job_fn},
        FailedJobFnError,
    ),
    ("a handler raising a BaseException", fatal, {}, Fatal),
]
IDS = [case[0] for case in BROKEN_OPTIONS]


@pytest.mark.parametrize(("case", "handler", "options", "error"), BROKEN_OPTIONS, ids=IDS)
def test_a_broken_option_stops_the_worker_by_default_and_keeps_the_job(
    db: Harness,
    case: str,
    handler: Callable[..., object],
    options: dict[str, Any],
    error: type[BaseException],
) -> None:
    job_id = enqueue_committed(db, "fault/broken", "p")
    log = RecordingLog()
    stopped = threading.Event()
    worker = create_queue_worker(
        db.data_source,
        handler,
        polling_interval_ms=10,
        log=log,
        on_shutdown=stopped.set,
        **{**db.table_options, **options},
    )
    worker.start()
    assert stopped.wait(20), "the default on_polling_error stops the worker"
    (logged,) = log.named(ev.JOB_WORKER_ERROR)
    assert isinstance(logged[ev.THROWABLE], error)
    assert logged[ev.JOB_ID] == job_id
    assert [job.attempts for job in db.jobs()] == [0]
    assert db.archived_jobs() == []
    if error is FailedJobFnError:
        assert isinstance(logged[ev.THROWABLE].__cause__, FailingUserCode)


@pytest.mark.parametrize(("case", "handler", "options", "error"), BROKEN_OPTIONS, ids=IDS)
def test_a_broken_option_with_polling_errors_ignored_backs_off_and_logs_every_time(
    db: Harness,
    case: str,
    handler: Callable[..., object],
    options: dict[str, Any],
    error: type[BaseException],
) -> None:
    """Proletarian #30: with on_polling_error returning False, Proletarian runs such a job again every
    polling interval, forever. Here each failed run is still logged (job-worker-error, with the job's
    id) and on_polling_error still sees it, but the thread waits twice as long after each one, up to
    30 s: 10, 20, 40, 80 ... ms, so a second holds at most 7 runs, not 100.
    """
    job_id = enqueue_committed(db, "fault/broken", "p")
    seen: list[BaseException] = []

    def keep_going(exc: BaseException) -> bool:
        seen.append(exc)
        return False

    log = RecordingLog()
    worker = create_queue_worker(
        db.data_source,
        handler,
        polling_interval_ms=10,
        log=log,
        on_polling_error=keep_going,
        **{**db.table_options, **options},
    )
    with worker:
        assert wait_until(lambda: len(seen) >= 3, timeout=20)
        time.sleep(1.0)
        assert worker.running
    errors = log.named(ev.JOB_WORKER_ERROR)
    assert len(errors) == len(seen) <= 9, f"{len(errors)} runs: the job must not spin"
    assert all(isinstance(data[ev.THROWABLE], error) and data[ev.JOB_ID] == job_id for data in errors)
    assert [job.attempts for job in db.jobs()] == [0]


def test_on_polling_error_that_raises_stops_the_worker(db: Harness) -> None:
    enqueue_committed(db, "fault/broken", "p")
    log = RecordingLog()
    stopped = threading.Event()

    def broken(exc: BaseException) -> bool:
        raise RuntimeError("on_polling_error failed")

    worker = create_queue_worker(
        db.data_source,
        fatal,
        polling_interval_ms=10,
        log=log,
        on_polling_error=broken,
        on_shutdown=stopped.set,
        **db.table_options,
    )
    worker.start()
    assert stopped.wait(20)
    assert [type(data[ev.THROWABLE]) for data in log.named(ev.JOB_WORKER_ERROR)] == [Fatal, RuntimeError]


def test_options_that_are_not_callable_are_refused_at_creation(db: Harness) -> None:
    for name in ("retry_strategy_fn", "failed_job_fn", "on_polling_error", "on_shutdown", "log", "clock"):
        with pytest.raises(ConfigurationError, match=name):
            create_queue_worker(db.data_source, fail, **{name: cast(Any, "not callable")}, **db.table_options)
