"""What every benchmark shares: backends named by factory string, bench tables, fast loads, statistics."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from conformance.harness import Harness, SqlHarness, load_harness
from proletarian_ref import enqueue
from proletarian_ref.backends import mysql_claim
from proletarian_ref.schema import index_name
from proletarian_ref.sql import render
from proletarian_ref.tables import TableName, table_name

Dialect = Literal["postgresql", "mysql"]
BUILTIN_DIALECTS: Final = ("postgresql", "mysql")
BENCH_SCHEMA: Final = "proletarian"
BENCH_QUEUE: Final = "bench/q"
BENCH_QUEUE_TEXT: Final = ":bench/q"
BENCH_JOB_TYPE: Final = "bench/job"
DEFAULT_BACKENDS: Final = ("conformance.builtin:postgresql", "conformance.builtin:mysql")
LOAD_CHUNK: Final = 100_000


class BenchmarkFailure(RuntimeError):
    """A benchmark found the queue misbehaving (lost or doubled jobs); the run must fail loudly."""


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A backend as the conformance suite names it: a "module:factory" string plus factory options."""

    factory: str
    options: dict[str, Any] = field(default_factory=dict)

    def load(self, job_table: str, archived_job_table: str) -> Harness:
        return load_harness(
            self.factory, job_table=job_table, archived_job_table=archived_job_table, **self.options
        )


def parse_backends(text: str) -> list[BackendSpec]:
    return [BackendSpec(part.strip()) for part in text.split(",") if part.strip()]


def bench_tables(bench: str, suffix: str = "") -> tuple[str, str]:
    """Our own tables, never the defaults or another engineer's: proletarian.bench_job_<bench><suffix>."""
    return (
        f"{BENCH_SCHEMA}.bench_job_{bench}{suffix}",
        f"{BENCH_SCHEMA}.bench_archived_job_{bench}{suffix}",
    )


def open_harness(spec: BackendSpec, bench: str, suffix: str = "") -> Harness:
    """Load the backend's harness on this benchmark's tables and (re)create them empty."""
    job, archived = bench_tables(bench, suffix)
    harness = spec.load(job, archived)
    harness.install()
    return harness


def sql_dialect(harness: Harness) -> Dialect | None:
    """The built-in dialect whose raw driver the ceilings and fast loads may use, else None."""
    if not isinstance(harness, SqlHarness):
        return None
    dialect = getattr(harness, "dialect", None)
    if dialect == "postgresql":
        return "postgresql"
    if dialect == "mysql":
        return "mysql"
    return None


def require_sql(harness: Harness) -> tuple[SqlHarness, Dialect]:
    dialect = sql_dialect(harness)
    if dialect is None or not isinstance(harness, SqlHarness):
        raise TypeError(f"{harness.name} is not a built-in SQL dialect")
    return harness, dialect


def job_table_of(harness: Harness) -> TableName:
    return table_name(harness.job_table)


def archived_table_of(harness: Harness) -> TableName:
    return table_name(harness.archived_job_table, option="archived_job_table")


def batch_claim(harness: SqlHarness, *, bounded: bool = True) -> str:
    """Batch mode's claim (get_next_jobs) for the harness's job table as the library sends it: on MySQL the
    bounded claim on the index the server names (mysql_claim), or Proletarian's classic one without
    `bounded` or an index."""
    job_table = job_table_of(harness)
    if harness.dialect != "mysql" or not bounded:
        return render(harness.dialect, "get_next_jobs", job_table)
    index = mysql_claim.pick(run_sql(harness, *mysql_claim.lookup(job_table)))
    return mysql_claim.statement("get_next_jobs", job_table, index)


# -- statements on the raw driver -----------------------------------------------------------------------


def run_sql(harness: SqlHarness, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """One statement on a fresh connection, committed; rows if it returned any."""
    conn = harness.connect()
    try:
        cursor = conn.cursor()
        if harness.dialect == "mysql":
            cursor.execute("SET time_zone = '+00:00'")
        cursor.execute(statement, params)
        rows = [tuple(r) for r in cursor.fetchall()] if cursor.description else []
        cursor.close()
        conn.commit()
        return rows
    finally:
        conn.close()


def claim_sql(dialect: Dialect, harness: Harness) -> str:
    return render(dialect, "get_next_job", job_table_of(harness))


def db_now(dialect: Dialect, now: datetime | None = None) -> Any:
    """`now` as the backend binds it: ISO text with offset on PostgreSQL, naive UTC whole seconds on MySQL."""
    value = now if now is not None else datetime.now(UTC)
    if dialect == "postgresql":
        return value.isoformat()
    return value.astimezone(UTC).replace(tzinfo=None, microsecond=0)


def timed_transactions(
    conn: Any,
    per_transaction: int,
    window_s: float,
    max_jobs: int,
    one_transaction: Callable[[int], None],
) -> tuple[int, float]:
    """Commit `one_transaction(first job's number)` of `per_transaction` jobs on `conn` until `max_jobs`
    or `window_s`; (jobs, seconds). The enqueue benchmarks' library and raw loops all time with it."""
    count = 0
    start = time.perf_counter()
    deadline = start + window_s
    while count < max_jobs and time.perf_counter() < deadline:
        one_transaction(count)
        conn.commit()
        count += per_transaction
    return count, time.perf_counter() - start


def truncate(harness: Harness) -> None:
    dialect = sql_dialect(harness)
    if dialect is None:
        harness.clear()
        return
    sql_harness, _ = require_sql(harness)
    for table in (harness.job_table, harness.archived_job_table):
        run_sql(sql_harness, f"TRUNCATE TABLE {table}")


def analyze(harness: Harness, *, vacuum: bool = False) -> None:
    """Fresh planner statistics for the job table; with `vacuum`, PostgreSQL also clears its dead rows.

    A drain leaves a dead row per job, which later claims must step over until autovacuum comes by at a
    moment of its own choosing; vacuuming before each measured drain starts every one from the same state.
    """
    dialect = sql_dialect(harness)
    if dialect is None:
        return
    sql_harness, _ = require_sql(harness)
    if vacuum and dialect == "postgresql":
        conn = sql_harness.connect()
        try:
            conn.autocommit = True  # VACUUM cannot run in a transaction
            conn.execute(f"VACUUM ANALYZE {harness.job_table}")
        finally:
            conn.close()
        return
    run_sql(sql_harness, f"ANALYZE {'TABLE ' if dialect == 'mysql' else ''}{harness.job_table}")


def count_rows(harness: Harness, *, archived: bool = False, queue_text: str | None = None) -> int:
    """Committed rows of a table (of one queue), through SQL where we can, else the harness's reader."""
    table = harness.archived_job_table if archived else harness.job_table
    dialect = sql_dialect(harness)
    if dialect is None:
        rows = harness.archived_jobs() if archived else harness.jobs()
        return sum(1 for r in rows if queue_text is None or r.queue == queue_text)
    sql_harness, _ = require_sql(harness)
    where = "" if queue_text is None else " WHERE queue = %(queue)s"
    result = run_sql(sql_harness, f"SELECT count(*) FROM {table}{where}", {"queue": queue_text})
    return int(result[0][0])


# -- the (queue, process_at) index ----------------------------------------------------------------------


def index_names(harness: SqlHarness, dialect: Dialect) -> list[str]:
    job = job_table_of(harness)
    if dialect == "postgresql":
        rows = run_sql(
            harness,
            "SELECT indexname FROM pg_indexes WHERE schemaname = %(schema)s AND tablename = %(table)s "
            "AND indexdef NOT LIKE '%%UNIQUE%%'",
            {"schema": job.schema or "public", "table": job.name},
        )
    else:
        rows = run_sql(
            harness,
            "SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = "
            "COALESCE(%(schema)s, DATABASE()) AND table_name = %(table)s AND index_name <> 'PRIMARY'",
            {"schema": job.schema, "table": job.name},
        )
    return [str(r[0]) for r in rows]


def drop_index(harness: Harness) -> bool:
    """Drop the job table's secondary indexes; False for a backend we cannot reach through SQL."""
    dialect = sql_dialect(harness)
    if dialect is None:
        return False
    sql_harness, _ = require_sql(harness)
    job = job_table_of(harness)
    for name in index_names(sql_harness, dialect):
        if dialect == "postgresql":
            run_sql(sql_harness, f"DROP INDEX IF EXISTS {job.schema + '.' if job.schema else ''}{name}")
        else:
            run_sql(sql_harness, f"ALTER TABLE {job} DROP INDEX {name}")
    return True


def create_index(harness: Harness) -> bool:
    """Create the seed's (queue, process_at) index as schema.sql defines it."""
    dialect = sql_dialect(harness)
    if dialect is None:
        return False
    sql_harness, _ = require_sql(harness)
    job = job_table_of(harness)
    if index_names(sql_harness, dialect):
        return True
    if dialect == "postgresql":
        run_sql(sql_harness, f"CREATE INDEX {index_name(job)} ON {job} (queue, process_at)")
    else:
        run_sql(sql_harness, f"ALTER TABLE {job} ADD INDEX {index_name(job)} (queue(256), process_at)")
    return True


# -- fast loads ---------------------------------------------------------------------------------------

Layout = Literal["mixed", "due"]

# "mixed": half the rows in seven other queues (due), 49% in ours but a day ahead, 1% in ours and due, so
# most of the table is noise a poll must not read. "due": every row due in our queue, oldest first.
_PG_QUEUE: Final = {
    "mixed": "CASE WHEN mod(i, 2) = 1 THEN ':bench/other-' || mod(i, 7) ELSE %(queue)s END",
    "due": "%(queue)s",
}
_PG_PROCESS_AT: Final = {
    "mixed": "CASE WHEN mod(i, 2) = 1 OR mod(i, 100) = 0 "
    "THEN %(base)s::timestamptz - interval '30 days' + i * interval '1 second' "
    "ELSE %(base)s::timestamptz + interval '1 day' + i * interval '1 second' END",
    "due": "%(base)s::timestamptz - interval '30 days' + i * %(apart_us)s * interval '1 microsecond'",
}
_MY_QUEUE: Final = {
    "mixed": "CASE WHEN MOD(n, 2) = 1 THEN CONCAT(':bench/other-', MOD(n, 7)) ELSE %(queue)s END",
    "due": "%(queue)s",
}
_MY_PROCESS_AT: Final = {
    "mixed": "CASE WHEN MOD(n, 2) = 1 OR MOD(n, 100) = 0 THEN %(base)s - INTERVAL 30 DAY + INTERVAL n SECOND "
    "ELSE %(base)s + INTERVAL 1 DAY + INTERVAL n SECOND END",
    "due": "%(base)s - INTERVAL 30 DAY + INTERVAL n * %(apart_us)s MICROSECOND",
}
# How far apart bulk_load's due rows are. A millisecond, not a second: a QueueFiller numbers its rows over a
# whole run, and a second a row put the 2,592,001st row of a run thirty days on, due only in the future
# (limit18's first try, its last PostgreSQL point). On MySQL, Proletarian's TIMESTAMP keeps whole seconds,
# so a thousand rows share one, as in a queue enqueued a thousand jobs a second.
DUE_APART: Final = timedelta(milliseconds=1)
# How long before now bulk_load's first due row is (the "due" layout's 30 days).
DUE_WITHIN: Final = timedelta(days=30)
_DIGITS: Final = "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {d}" for d in range(1, 10)) + ")"


def _mysql_numbers(count: int) -> str:
    """A derived table of n = lo + k for k in [0, count): cross joins of digits, MySQL and MariaDB alike."""
    places = max(1, len(str(max(count - 1, 1))))
    k = " + ".join(f"{10**p} * d{p}.d" for p in range(places))
    joins = " CROSS JOIN ".join(f"{_DIGITS} d{p}" for p in range(places))
    return f"(SELECT %(lo)s + {k} AS n FROM {joins} HAVING n < %(hi)s) nums"


def bulk_load(
    harness: Harness,
    start: int,
    stop: int,
    layout: Layout,
    *,
    base: datetime | None = None,
    apart: timedelta = DUE_APART,
) -> None:
    """Add rows numbered [start, stop): COPY-speed INSERT ... SELECT on our dialects, enqueue elsewhere; the
    due ones `apart` from each other in process_at, oldest first."""
    when = base if base is not None else datetime.now(UTC)
    dialect = sql_dialect(harness)
    if dialect is None:
        _library_load(harness, start, stop, layout, when)
        return
    sql_harness, _ = require_sql(harness)
    salt = uuid.uuid4().hex
    apart_us = apart // timedelta(microseconds=1)
    columns = "(job_id, queue, job_type, payload, attempts, enqueued_at, process_at)"
    for lo in range(start, stop, LOAD_CHUNK):
        hi = min(stop, lo + LOAD_CHUNK)
        if dialect == "postgresql":
            statement = (
                f"INSERT INTO {harness.job_table} {columns} SELECT gen_random_uuid(), {_PG_QUEUE[layout]}, "
                f"':bench/job', '[\"^ \",\"~:i\",' || i || ']', 0, %(base)s::timestamptz, "
                f"{_PG_PROCESS_AT[layout]} "
                "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS s(i)"
            )
            params: dict[str, Any] = {
                "queue": BENCH_QUEUE_TEXT,
                "base": when.isoformat(),
                "lo": lo,
                "hi": hi,
                "apart_us": apart_us,
            }
        else:
            statement = (
                f"INSERT INTO {harness.job_table} {columns} SELECT UNHEX(MD5(CONCAT(%(salt)s, n))), "
                f"{_MY_QUEUE[layout]}, ':bench/job', CONCAT('[\"^ \",\"~:i\",', n, ']'), 0, %(base)s, "
                f"{_MY_PROCESS_AT[layout]} FROM {_mysql_numbers(hi - lo)}"
            )
            params = {
                "queue": BENCH_QUEUE_TEXT,
                "base": db_now("mysql", when),
                "lo": lo,
                "hi": hi,
                "salt": salt,
                "apart_us": apart_us,
            }
        run_sql(sql_harness, statement, params)


def _library_load(harness: Harness, start: int, stop: int, layout: Layout, base: datetime) -> None:
    # A third-party backend: only the public API reaches its tables, so it pays for every enqueue.
    backend = harness.backend()
    conn = harness.connect()
    try:
        for i in range(start, stop):
            other = layout == "mixed" and i % 2 == 1
            future = layout == "mixed" and not other and i % 100 != 0
            enqueue(
                conn,
                BENCH_JOB_TYPE,
                {"i": i},
                queue=f"bench/other-{i % 7}" if other else BENCH_QUEUE,
                process_at=base + timedelta(days=1, seconds=i) if future else None,
                job_table=harness.job_table,
                backend=backend,
            )
            if (i - start) % 1000 == 999:
                conn.commit()
        conn.commit()
    finally:
        conn.close()


# -- numbers ------------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of already sorted values."""
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return sorted_values[0]
    rank = (len(sorted_values) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def summarize_ms(samples_s: Sequence[float]) -> dict[str, float | int]:
    """p50/p95/p99/mean/max in milliseconds, and the sample count, of durations in seconds."""
    ms = sorted(s * 1000 for s in samples_s)
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "mean_ms": statistics.fmean(ms) if ms else float("nan"),
        "max_ms": ms[-1] if ms else float("nan"),
    }


class Counter:
    """A thread-safe count with an optional hook for the new value (the child processes' shared slot)."""

    def __init__(self, publish: Callable[[int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._value = 0
        self._publish = publish

    def add(self, n: int = 1) -> int:
        with self._lock:
            self._value += n
            value = self._value
        if self._publish is not None:
            self._publish(value)
        return value

    @property
    def value(self) -> int:
        return self._value


def wait_until(predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> bool:
    """Poll `predicate` until true or `timeout_s` passed; never waits longer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step_s)


@contextmanager
def closing_harness(harness: Harness) -> Iterator[Harness]:
    try:
        yield harness
    finally:
        harness.close()


def skipped(reason: str) -> dict[str, Any]:
    return {"skipped": reason}
