"""MySQL keeps whole seconds: jobs of one second are claimed in job_id byte order (issue 11.7)."""

from __future__ import annotations

import uuid
from typing import Any

from support import T0, FakeClock

from conformance.harness import SqlHarness
from proletarian_ref import enqueue, mysql_time_ordered_uuid_strategy, mysql_uuid_strategy
from proletarian_ref.job_ids import JobIdStrategy
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text
from proletarian_ref.sql import render
from proletarian_ref.tables import table_name

JOBS = 200


def enqueue_in_one_second(db: SqlHarness, strategy: JobIdStrategy) -> list[uuid.UUID]:
    conn = db.connect()
    try:
        clock = FakeClock(T0)  # one instant for all: the order left is the index's
        ids = [
            enqueue(conn, "a", n, job_table=db.job_table, job_id_strategy=strategy, clock=clock)
            for n in range(JOBS)
        ]
        conn.commit()
    finally:
        conn.close()
    db.analyze()  # the plan with real statistics, as a production table has
    return ids


def claim_all(db: SqlHarness) -> list[uuid.UUID]:
    backend, table = db.backend(), table_name(db.job_table)
    claimed: list[uuid.UUID] = []
    queue = to_keyword_text(DEFAULT_QUEUE, what="queue")
    while True:
        with backend.transaction() as conn:
            job = backend.get_next_job(conn, table, queue, T0)
            if job is None:
                return claimed
            backend.delete_job(conn, table, job.job_id)
        claimed.append(uuid.UUID(bytes=bytes(job.job_id)))


def claim_plan(db: SqlHarness) -> list[tuple[Any, ...]]:
    statement = render("mysql", "get_next_job", table_name(db.job_table))
    params = {"queue": to_keyword_text(DEFAULT_QUEUE, what="queue"), "now": T0.replace(tzinfo=None)}
    conn = db.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute("EXPLAIN " + statement, params)
            return list(cursor.fetchall())
    finally:
        conn.rollback()
        conn.close()


def test_mysql_claims_jobs_of_one_second_in_enqueue_order_with_time_ordered_ids(mysql_db: SqlHarness) -> None:
    ids = enqueue_in_one_second(mysql_db, mysql_time_ordered_uuid_strategy())
    [plan] = claim_plan(mysql_db)
    # The claim reads the (queue, process_at) index in order: no filesort, whose order of ties is its own.
    assert plan[5] == "queue" and "filesort" not in str(plan[-1]), plan
    assert claim_all(mysql_db) == ids


def test_mysql_claims_jobs_of_one_second_by_id_bytes_so_random_ids_come_out_shuffled(
    mysql_db: SqlHarness,
) -> None:
    # Proletarian's default (random v4 ids): no first-in first-out within a second, as docs/mysql.md says.
    ids = enqueue_in_one_second(mysql_db, mysql_uuid_strategy())
    claimed = claim_all(mysql_db)
    assert claimed == sorted(ids, key=lambda job_id: job_id.bytes)
    assert claimed != ids


def test_time_ordered_ids_are_rfc_9562_version_7_and_their_bytes_sort_as_they_were_made() -> None:
    strategy = mysql_time_ordered_uuid_strategy()
    ids = [strategy.generate_id() for _ in range(JOBS)]
    assert {(job_id.version, job_id.variant) for job_id in ids} == {(7, uuid.RFC_4122)}
    assert sorted(ids, key=lambda job_id: job_id.bytes) == ids
    assert [strategy.decode_id(strategy.encode_id(job_id)) for job_id in ids] == ids
