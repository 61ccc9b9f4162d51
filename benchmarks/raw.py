"""The ceiling: Proletarian's statements in a plain loop on the raw driver, no library code in the loop.

The SQL text is read from sql/<dialect>/queries.sql once, before any loop starts, so the ceiling runs the
very statements the backends run; after that only psycopg or PyMySQL is called.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import (
    BENCH_QUEUE_TEXT,
    Dialect,
    archived_table_of,
    db_now,
    job_table_of,
    timed_transactions,
)
from conformance.harness import SqlHarness
from proletarian_ref.sql import render

STATUS_SUCCESS = ":success"
# The Transit text proletarian_ref writes for the enqueue benchmark's payload {"i": n}, as someone writing
# the rows by hand with the driver would format it: the rows are the library's, the encoding the cheapest.
RAW_PAYLOAD = '["^ ","~:i",{}]'
RAW_JOB_TYPE = ":bench/job"


@dataclass(frozen=True, slots=True)
class RawStatements:
    claim: str
    archive: str
    delete: str
    enqueue: str
    enqueue_copy: str

    @classmethod
    def of(cls, harness: SqlHarness, dialect: Dialect) -> RawStatements:
        job, archived = job_table_of(harness), archived_table_of(harness)
        return cls(
            claim=render(dialect, "get_next_job", job),
            archive=render(dialect, "archive_job", job, archived),
            delete=render(dialect, "delete_job", job),
            enqueue=render(dialect, "enqueue", job),
            # The column list of the PostgreSQL COPY; MySQL's batched insert is the enqueue INSERT.
            enqueue_copy=render(dialect, "enqueue_copy", job) if dialect == "postgresql" else "",
        )


def raw_connection(harness: SqlHarness, dialect: Dialect) -> Any:
    """A driver connection set up as the backend sets up a worker's (MySQL: UTC, READ COMMITTED)."""
    conn = harness.connect()
    if dialect == "mysql":
        cursor = conn.cursor()
        cursor.execute("SET time_zone = '+00:00'")
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cursor.close()
        conn.commit()
    return conn


class RawDrainer:
    """`threads` threads, each claiming, archiving, deleting and committing on its own connection."""

    def __init__(
        self,
        harness: SqlHarness,
        dialect: Dialect,
        threads: int,
        polling_interval_ms: float,
        on_job: Callable[[], Any],
        *,
        synchronous_commit_off: bool = False,
    ) -> None:
        self._dialect: Dialect = dialect
        self._statements = RawStatements.of(harness, dialect)
        # PostgreSQL: SET LOCAL synchronous_commit = off first in each transaction (benchmarks.sync_commit).
        self._prelude = "SET LOCAL synchronous_commit = off" if synchronous_commit_off else None
        self._interval = polling_interval_ms / 1000
        self._on_job = on_job
        self._stop = threading.Event()
        # Connections are opened before the clock starts, as the library's worker keeps one per thread.
        self._connections = [raw_connection(harness, dialect) for _ in range(threads)]
        self._threads = [
            threading.Thread(target=self._loop, args=(conn,), name=f"raw-drain-{n}", daemon=True)
            for n, conn in enumerate(self._connections, 1)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for conn in self._connections:
            # Tidying up after the measurement; a broken connection is as good as closed.
            with contextlib.suppress(Exception):
                conn.close()

    def _loop(self, conn: Any) -> None:
        cursor = conn.cursor()
        while not self._stop.is_set():
            if self._prelude is not None:
                cursor.execute(self._prelude)
            if not claim_one(conn, cursor, self._statements, self._dialect, self._on_job):
                self._stop.wait(self._interval)
        cursor.close()


def claim_one(conn: Any, cursor: Any, s: RawStatements, dialect: Dialect, on_job: Callable[[], Any]) -> bool:
    """One poll, one transaction: claim, on_job, archive, delete, commit; False when none was due."""
    cursor.execute(s.claim, {"queue": BENCH_QUEUE_TEXT, "now": db_now(dialect)})
    row = cursor.fetchone()
    if row is None:
        conn.commit()
        return False
    on_job()
    cursor.execute(s.archive, {"job_id": row[0], "status": STATUS_SUCCESS, "finished_at": db_now(dialect)})
    cursor.execute(s.delete, {"job_id": row[0]})
    conn.commit()
    return True


def _raw_row(dialect: Dialect, n: int, at: Any) -> dict[str, Any]:
    """The enqueue INSERT's parameters for job number `n`, the very row the library writes for it."""
    job_id = uuid.uuid4()
    return {
        "job_id": job_id if dialect == "postgresql" else job_id.bytes,
        "queue": BENCH_QUEUE_TEXT,
        "job_type": RAW_JOB_TYPE,
        "payload": RAW_PAYLOAD.format(n),
        "attempts": 0,
        "enqueued_at": at,
        "process_at": at,
    }


def raw_enqueue(
    harness: SqlHarness, dialect: Dialect, per_transaction: int, window_s: float, max_jobs: int
) -> tuple[int, float]:
    """Jobs inserted and seconds taken, `per_transaction` INSERTs per COMMIT, bounded by count and time."""
    statement = RawStatements.of(harness, dialect).enqueue
    conn = raw_connection(harness, dialect)
    try:
        cursor = conn.cursor()

        def one_transaction(first: int) -> None:
            for _ in range(per_transaction):
                # The clock read once per job, as enqueue reads it once per call.
                cursor.execute(statement, _raw_row(dialect, first, db_now(dialect, datetime.now(UTC))))

        return timed_transactions(conn, per_transaction, window_s, max_jobs, one_transaction)
    finally:
        conn.close()


def raw_enqueue_batched(
    harness: SqlHarness,
    dialect: Dialect,
    per_transaction: int,
    window_s: float,
    max_jobs: int,
    *,
    copy: bool = True,
) -> tuple[int, float]:
    """The same, each transaction's jobs sent in one go the driver's own fastest way.

    PostgreSQL: one COPY with psycopg's write_row, or with `copy` False the enqueue INSERT through
    psycopg's executemany (pipelined: one round trip for the batch), the batched insert most code writes.
    MySQL: PyMySQL's executemany of the enqueue INSERT, which PyMySQL itself rewrites into multi-row
    INSERTs of up to about 1 MB each.
    """
    statements = RawStatements.of(harness, dialect)
    conn = raw_connection(harness, dialect)
    try:
        cursor = conn.cursor()

        def one_transaction(first: int) -> None:
            at = db_now(dialect, datetime.now(UTC))
            numbers = range(first, first + per_transaction)
            if dialect == "postgresql" and copy:
                with cursor.copy(statements.enqueue_copy) as writer:
                    for n in numbers:
                        payload = RAW_PAYLOAD.format(n)
                        writer.write_row((uuid.uuid4(), BENCH_QUEUE_TEXT, RAW_JOB_TYPE, payload, 0, at, at))
            else:
                cursor.executemany(statements.enqueue, [_raw_row(dialect, n, at) for n in numbers])

        return timed_transactions(conn, per_transaction, window_s, max_jobs, one_transaction)
    finally:
        conn.close()
