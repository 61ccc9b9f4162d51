"""Periodic and unique jobs are Proletarian's rows: the very row enqueue writes, which a Clojure worker runs.

The side tables add rows of their own only; the job row of a scheduled tick or a keyed enqueue has the
seven columns, keyword text and Transit payload that plain enqueue writes (whose rows Proletarian was
shown to read: tests/test_interop.py, tests/test_transit_json_jvm.py), and a worker that knows nothing of
the side tables (Proletarian's statements alone) runs and archives them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from conformance.harness import Harness
from conformance.side_tables import prepare
from proletarian_ref.backend import JobRecord
from proletarian_ref.job import enqueue
from proletarian_ref.periodic import Schedule, Scheduler
from proletarian_ref.worker import process_next_job

NOW = datetime(2026, 1, 1, 10, 0, 30, tzinfo=UTC)


def _row(harness: Harness, job_id: Any) -> JobRecord:
    strategy = harness.job_id_strategy()
    (row,) = [r for r in harness.jobs() if strategy.decode_id(r.job_id) == job_id]
    return row


def _plain(harness: Harness, payload: Any, queue: str, process_at: datetime) -> JobRecord:
    """The row plain enqueue writes for the same job at the same `now` (then removed again)."""
    conn = harness.connect()
    try:
        job_id = enqueue(
            conn,
            "app/tick",
            payload,
            queue=queue,
            process_at=process_at,
            clock=lambda: NOW,
            **harness.table_options,
        )
        conn.commit()
        row = _row(harness, job_id)
    finally:
        conn.close()
    return row


def _same_but_id(ours: JobRecord, plain: JobRecord) -> None:
    assert ours._replace(job_id=None) == plain._replace(job_id=None)


def test_a_ticks_job_is_the_row_enqueue_writes_and_a_proletarian_worker_runs_it(db: Harness) -> None:
    prepare(db)
    now = [NOW - timedelta(minutes=5)]
    schedule = Schedule("tick", "* * * * *", "app/tick", {"a": [1, "b"]}, queue="reports")
    scheduler = Scheduler(db.backend(), [schedule], clock=lambda: now[0], **db.table_options)
    scheduler.register()
    now[0] = NOW
    (job_id,) = scheduler.tick()
    ours = _row(db, job_id)
    assert ours.attempts == 0 and ours.queue == ":reports" and ours.job_type == ":app/tick"
    _same_but_id(ours, _plain(db, {"a": [1, "b"]}, "reports", NOW - timedelta(seconds=30)))
    ran: list[tuple[str, Any]] = []
    for _ in range(2):
        process_next_job(
            db.backend(),
            lambda job_type, payload: ran.append((job_type, payload)),
            queue="reports",
            **db.table_options,
        )
    assert sorted(job_type for job_type, _ in ran) == ["app/tick", "app/tick"]
    assert db.jobs() == []


def test_a_keyed_job_is_the_row_enqueue_writes(db: Harness) -> None:
    prepare(db)
    conn = db.connect()
    try:
        job_id = enqueue(conn, "app/tick", {"k": 1}, unique_key="k", clock=lambda: NOW, **db.table_options)
        conn.commit()
    finally:
        conn.close()
    _same_but_id(_row(db, job_id), _plain(db, {"k": 1}, "proletarian/default", NOW))
