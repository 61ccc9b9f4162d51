"""The queue worker on every backend: draining, retries, failure paths, logging and lifecycle (spec 2-4)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any, cast

import pytest
from support import T0, FakeClock, RecordingLog, enqueue_committed, wait_until

import proletarian_ref
from conformance.harness import Harness, MemoryHarness, SqlHarness
from proletarian_ref import (
    ConfigurationError,
    FailedJobFnError,
    InvalidRetryStrategyError,
    Job,
    JobInterrupted,
    PayloadDecodeError,
    RetryStrategy,
    create_queue_worker,
    enqueue,
    process_next_job,
)
from proletarian_ref import log as ev


class Boom(Exception):
    """A handler failure."""


def fail(job_type: str, payload: Any) -> None:
    raise Boom(f"failed {payload!r}")


def run_one(db: Harness, handler: Any, **options: Any) -> bool | None:
    return process_next_job(db.data_source, handler, **{**db.table_options, **options})


def test_four_threads_run_ten_thousand_jobs_exactly_once(db: Harness) -> None:
    total = 10_000
    conn = db.connect()
    try:
        for n in range(total):
            enqueue(conn, "bulk/job", {"n": n}, job_table=db.job_table)
        conn.commit()
    finally:
        conn.close()
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def handler(job_type: str, payload: dict[str, int]) -> None:
        with lock:
            seen[payload["n"]] += 1

    worker = create_queue_worker(
        db.data_source, handler, worker_threads=4, polling_interval_ms=20, **db.table_options
    )
    with worker:
        assert wait_until(lambda: sum(seen.values()) >= total, timeout=240), (
            f"ran {sum(seen.values())} of {total}"
        )
    assert seen == Counter(range(total))
    archived = db.archived_jobs()
    assert len(archived) == total
    assert len({row.job_id for row in archived}) == total
    assert {(row.status, row.attempts) for row in archived} == {(":success", 1)}
    assert db.jobs() == []


def test_the_retry_worked_example_of_spec_3_2(db: Harness) -> None:
    clock = FakeClock()
    failed: list[tuple[Job, BaseException]] = []
    options: dict[str, Any] = {
        "clock": clock,
        "retry_strategy_fn": lambda job, exc: {"retries": 2, "delays": [1000, 5000]},
        "failed_job_fn": lambda job, exc: failed.append((job, exc)),
    }
    enqueue_committed(db, "flaky", "x", clock=clock)

    assert run_one(db, fail, **options) is True  # attempt 1 fails: 2 retries left, next run at +1 s
    [row] = db.jobs()
    assert (row.attempts, row.process_at) == (1, T0 + timedelta(seconds=1))
    assert run_one(db, fail, **options) is None  # not due yet
    clock.advance(seconds=1)

    assert run_one(db, fail, **options) is True  # attempt 2 fails: 1 left, +5 s
    [row] = db.jobs()
    assert (row.attempts, row.process_at) == (2, T0 + timedelta(seconds=6))
    clock.advance(seconds=4)
    assert run_one(db, fail, **options) is None
    clock.advance(seconds=1)

    assert run_one(db, fail, **options) is True  # attempt 3 fails: final
    assert db.jobs() == []
    [archived] = db.archived_jobs()
    assert (archived.status, archived.attempts) == (":failure", 3)
    assert archived.enqueued_at == T0
    assert archived.process_at == T0 + timedelta(seconds=6)
    assert archived.finished_at == clock()
    [(job, exc)] = failed
    assert job.attempts == 3 and isinstance(exc, Boom)


def test_retry_strategy_fn_sees_the_current_attempt_and_the_exception(db: Harness) -> None:
    calls: list[tuple[int, str]] = []

    def strategy(job: Job, exc: BaseException) -> RetryStrategy:
        calls.append((job.attempts, str(exc)))
        return RetryStrategy(retries=1)

    clock = FakeClock()
    enqueue_committed(db, "a", 7, clock=clock)
    run_one(db, fail, retry_strategy_fn=strategy, clock=clock)
    run_one(db, fail, retry_strategy_fn=strategy, clock=clock)
    assert calls == [(1, "failed 7"), (2, "failed 7")]
    assert db.archived_jobs()[0].attempts == 2


def test_no_retry_strategy_makes_the_first_failure_final(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    log = RecordingLog()
    assert run_one(db, fail, log=log) is True
    [archived] = db.archived_jobs()
    assert (archived.status, archived.attempts) == (":failure", 1)
    assert log.named(ev.NOT_RETRYING)[0][ev.RETRY_SPEC] is None


def test_a_failing_failed_job_fn_rolls_the_archive_back(db: Harness) -> None:
    enqueue_committed(db, "a", None)

    def failed_job_fn(job: Job, exc: BaseException) -> None:
        raise RuntimeError("cannot notify")

    with pytest.raises(FailedJobFnError) as raised:
        run_one(db, fail, failed_job_fn=failed_job_fn)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert isinstance(raised.value.job, Job)
    assert db.archived_jobs() == []
    [row] = db.jobs()
    assert row.attempts == 0


def test_an_invalid_retry_strategy_rolls_back_and_leaves_the_job(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    with pytest.raises(InvalidRetryStrategyError):
        run_one(db, fail, retry_strategy_fn=lambda job, exc: {"retries": 2, "delays": 1000})
    assert db.jobs()[0].attempts == 0
    assert db.archived_jobs() == []


def test_a_handler_raising_job_interrupted_leaves_the_job_untouched(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    log = RecordingLog()

    def handler(job_type: str, payload: Any) -> None:
        raise JobInterrupted("stopping")

    assert run_one(db, handler, log=log) is False
    assert db.jobs()[0].attempts == 0
    assert db.archived_jobs() == []
    assert len(log.named(ev.JOB_INTERRUPTED)) == 1


def test_a_base_exception_from_the_handler_rolls_back_and_escapes(db: Harness) -> None:
    enqueue_committed(db, "a", None)

    def handler(job_type: str, payload: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_one(db, handler)
    assert db.jobs()[0].attempts == 0


def test_a_payload_that_does_not_decode_fails_the_job_and_keeps_its_text(db: Harness) -> None:
    job_id = enqueue_committed(db, "a", None)
    _overwrite_payload(db, job_id, "not transit {")
    failures: list[BaseException] = []
    run_one(db, lambda t, p: None, failed_job_fn=lambda job, exc: failures.append(exc))
    [archived] = db.archived_jobs()
    assert archived.status == ":failure"
    assert archived.payload == "not transit {"
    assert isinstance(failures[0], PayloadDecodeError)


def _overwrite_payload(db: Harness, job_id: Any, payload: str) -> None:
    """Stand in for another program writing a payload our serializer cannot read."""
    if isinstance(db, SqlHarness):
        stored = job_id.bytes if db.dialect == "mysql" else job_id
        db.execute(
            f"UPDATE {db.job_table} SET payload = %(p)s WHERE job_id = %(id)s", {"p": payload, "id": stored}
        )
    elif isinstance(db, MemoryHarness):
        with db.memory.lock:
            row = db.memory.tables[db.job_table][job_id]
            db.memory._put(db.job_table, job_id, row._replace(payload=payload))


def test_advanced_mode_passes_the_whole_job(db: Harness) -> None:
    clock = FakeClock()
    job_id = enqueue_committed(db, "my.ns/report", {"id": 1}, queue="reports", clock=clock)
    jobs: list[Job] = []
    run_one(db, jobs.append, handler_fn_mode="advanced", queue="reports", clock=clock)
    assert jobs == [
        Job(
            job_id=job_id,
            queue="reports",
            job_type="my.ns/report",
            payload={"id": 1},
            attempts=1,
            enqueued_at=T0,
            process_at=T0,
        )
    ]


def test_an_unknown_handler_fn_mode_is_refused(db: Harness) -> None:
    with pytest.raises(ConfigurationError, match="handler_fn_mode"):
        create_queue_worker(db.data_source, fail, handler_fn_mode="fancy", **db.table_options)


def test_process_next_job_returns_none_when_nothing_is_due(db: Harness) -> None:
    clock = FakeClock()
    enqueue_committed(db, "a", None, clock=clock, process_in=timedelta(minutes=1))
    assert run_one(db, fail, clock=clock) is None
    assert run_one(db, lambda t, p: None, queue="other") is None


def test_log_events_carry_proletarians_names_and_keys(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    log = RecordingLog()
    run_one(db, fail, log=log, retry_strategy_fn=lambda job, exc: {"retries": 1})
    names = [name for name, _ in log.events]
    assert names == [ev.HANDLING_JOB, ev.HANDLE_JOB_EXCEPTION, ev.RETRYING]
    retrying = log.named(ev.RETRYING)[0]
    assert retrying[ev.ATTEMPT] == 1 and retrying[ev.RETRIES_LEFT] == 1
    assert retrying[ev.JOB_TYPE] == "a" and ev.RETRY_AT in retrying and ev.JOB_ID in retrying
    assert isinstance(log.named(ev.HANDLE_JOB_EXCEPTION)[0][ev.EXCEPTION], Boom)


def test_a_worker_logs_each_stage_with_its_id_and_thread(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    log = RecordingLog()
    worker = create_queue_worker(
        db.data_source, lambda t, p: None, log=log, polling_interval_ms=10, **db.table_options
    )
    with worker:
        assert wait_until(lambda: bool(log.named(ev.JOB_FINISHED)), timeout=20)
    finished = log.named(ev.JOB_FINISHED)[0]
    assert finished[ev.QUEUE_WORKER_ID] == "proletarian[:proletarian/default]"
    assert finished[ev.WORKER_THREAD_ID] == 1
    assert log.named(ev.POLLING_FOR_JOBS)
    assert [name for name, _ in log.events][-2:] == [ev.SHUTTING_DOWN, ev.COMPLETED_SHUTDOWN]


def test_retries_with_real_delays_end_archived_as_failure(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    failed = threading.Event()
    worker = create_queue_worker(
        db.data_source,
        fail,
        retry_strategy_fn=lambda job, exc: {"retries": 2, "delays": [10]},
        failed_job_fn=lambda job, exc: failed.set(),
        polling_interval_ms=10,
        log=RecordingLog(),
        **db.table_options,
    )
    with worker:
        assert failed.wait(timeout=20)
    assert wait_until(lambda: len(db.archived_jobs()) == 1, timeout=5)
    assert db.archived_jobs()[0].attempts == 3


def test_an_unexpected_error_stops_the_worker_by_default(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    log = RecordingLog()
    shut_down = threading.Event()
    worker = create_queue_worker(
        db.data_source,
        fail,
        retry_strategy_fn=lambda job, exc: cast(Any, "nonsense"),
        log=log,
        on_shutdown=shut_down.set,
        polling_interval_ms=10,
        **db.table_options,
    )
    worker.start()
    assert shut_down.wait(timeout=20), "on_polling_error's default should stop the worker"
    assert not worker.running
    errors = log.named(ev.JOB_WORKER_ERROR)
    assert len(errors) == 1 and isinstance(errors[0][ev.THROWABLE], InvalidRetryStrategyError)
    assert db.jobs()[0].attempts == 0


def test_on_polling_error_returning_false_keeps_polling(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    errors: list[BaseException] = []

    def keep_polling(exc: BaseException) -> bool:
        errors.append(exc)
        return False

    worker = create_queue_worker(
        db.data_source,
        fail,
        retry_strategy_fn=lambda job, exc: cast(Any, "nonsense"),
        on_polling_error=keep_polling,
        log=RecordingLog(),
        polling_interval_ms=10,
        **db.table_options,
    )
    with worker:
        assert wait_until(lambda: len(errors) >= 3, timeout=20)
        assert worker.running


def test_stop_lets_a_handler_that_ignores_it_finish_and_archive(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    started = threading.Event()

    def slow(job_type: str, payload: Any) -> None:
        started.set()
        time.sleep(0.3)

    worker = create_queue_worker(
        db.data_source, slow, polling_interval_ms=10, log=RecordingLog(), **db.table_options
    )
    worker.start()
    assert started.wait(timeout=20)
    assert worker.stop() is True
    assert [row.status for row in db.archived_jobs()] == [":success"]


def test_stop_interrupts_a_handler_sleeping_cooperatively(db: Harness) -> None:
    enqueue_committed(db, "a", None)
    started = threading.Event()

    def sleepy(job_type: str, payload: Any) -> None:
        started.set()
        proletarian_ref.sleep(60)

    log = RecordingLog()
    worker = create_queue_worker(db.data_source, sleepy, polling_interval_ms=10, log=log, **db.table_options)
    worker.start()
    assert started.wait(timeout=20)
    began = time.monotonic()
    worker.stop()
    assert time.monotonic() - began < 5
    assert db.jobs()[0].attempts == 0
    assert log.named(ev.JOB_INTERRUPTED)


def test_start_and_stop_follow_proletarians_lifecycle(db: Harness) -> None:
    calls: list[str] = []
    log = RecordingLog()
    worker = create_queue_worker(
        db.data_source, fail, log=log, on_shutdown=lambda: calls.append("shutdown"), **db.table_options
    )
    assert worker.stop() is None  # never started
    assert worker.start() is True
    assert worker.start() is None  # already started
    assert worker.stopping() is False
    assert worker.stop() is True
    assert worker.stopping() is True
    assert worker.stop() is True  # logs already-shut-down and calls on_shutdown again
    assert worker.start() is None  # a stopped worker cannot restart
    assert calls == ["shutdown", "shutdown"]
    assert log.named(ev.ALREADY_SHUT_DOWN)


def test_jobs_in_other_queues_are_left_alone(db: Harness) -> None:
    enqueue_committed(db, "a", 1, queue="mail")
    enqueue_committed(db, "a", 2, queue="sms")
    seen: list[Any] = []
    while run_one(db, lambda t, p: seen.append(p), queue="mail"):
        pass
    assert seen == [1]
    assert [row.queue for row in db.jobs()] == [":sms"]


def test_the_oldest_due_job_runs_first(db: Harness) -> None:
    clock = FakeClock()
    for n, minutes in enumerate([3, 1, 2]):
        enqueue_committed(db, "a", n, clock=clock, process_in=timedelta(minutes=minutes))
    clock.advance(minutes=5)
    seen: list[Any] = []
    while run_one(db, lambda t, p: seen.append(p), clock=clock):
        pass
    assert seen == [1, 2, 0]


def test_an_enqueue_does_not_wait_for_a_running_handler_of_another_queue(db: Harness) -> None:
    # Under MySQL's default REPEATABLE READ the claim's next-key lock covers the gap before the claimed
    # row, which is where a new job of the queue sorting just before it goes: that enqueue would wait for
    # the handler. The MySQL backend's READ COMMITTED worker sessions take no gap locks.
    clock = FakeClock()
    for queue in ("a", "b"):
        for n in range(3):
            enqueue_committed(db, "t", n, queue=queue, clock=clock, process_in=timedelta(seconds=10 * n))
    clock.advance(minutes=1)
    running, release = threading.Event(), threading.Event()

    def blocking(job_type: str, payload: Any) -> None:
        running.set()
        release.wait(timeout=20)

    claimer = threading.Thread(target=run_one, args=(db, blocking), kwargs={"queue": "b", "clock": clock})
    claimer.start()
    try:
        assert running.wait(timeout=10)
        began = time.monotonic()
        enqueue_committed(db, "t", "late", queue="a", clock=clock)
        assert time.monotonic() - began < 2, "the enqueue waited for the other queue's handler"
    finally:
        release.set()
        claimer.join(timeout=20)
    assert len(db.jobs()) == 6
