"""Whether a queue is healthy: tables and columns present, due jobs not waiting too long, no claim stuck."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from proletarian_ref.clock import Clock
from proletarian_ref.keywords import from_keyword_text, to_keyword_text
from proletarian_ref.ops.db import Tables, dialect_of, end_read, query, statements
from proletarian_ref.ops.stats import queue_stats
from proletarian_ref.tables import TableName

JOB_COLUMNS: Final = ("job_id", "queue", "job_type", "payload", "attempts", "enqueued_at", "process_at")
ARCHIVED_JOB_COLUMNS: Final = (*JOB_COLUMNS, "status", "finished_at")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HealthReport:
    checks: tuple[Check, ...]

    @property
    def healthy(self) -> bool:
        return all(check.ok for check in self.checks)

    def failed(self, name: str) -> bool:
        return any(check.name == name and not check.ok for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail, **c.data} for c in self.checks],
        }


def table_columns(conn: Any, table: TableName, *, dialect: str | None = None) -> list[str]:
    """The table's column names, in order; empty if it does not exist."""
    active = dialect_of(conn, dialect)
    params = {"qualified": str(table), "schema": table.schema, "name": table.name}
    try:
        rows = query(conn, active, statements(active, "ops.sql")["table_columns"], params)
    finally:
        end_read(conn)
    return [str(row[0]).lower() for row in rows]


def _schema_check(conn: Any, tables: Tables, dialect: str) -> Check:
    problems = []
    for table, expected in ((tables.job, JOB_COLUMNS), (tables.archived, ARCHIVED_JOB_COLUMNS)):
        found = table_columns(conn, table, dialect=dialect)
        if not found:
            problems.append(f"{table} does not exist")
            continue
        missing = [c for c in expected if c not in found]
        if missing:
            problems.append(f"{table} lacks {', '.join(missing)}")
    if problems:
        return Check("schema", False, "; ".join(problems))
    return Check("schema", True, f"{tables.job} and {tables.archived} have Proletarian's columns")


def _lag_check(
    conn: Any, tables: Tables, dialect: str, max_lag: timedelta, queue: str | None, clock: Clock | None
) -> Check:
    wanted = None if queue is None else from_keyword_text(to_keyword_text(queue, what="queue"))
    # Never the archive: a probe's cost must not grow with it.
    stats = queue_stats(
        conn,
        job_table=tables.job,
        archived_job_table=tables.archived,
        dialect=dialect,
        clock=clock,
        archived=False,
        queues=None if wanted is None else [wanted],
    )
    lags = {
        q.queue: q.oldest_due_age.total_seconds()
        for q in stats.queues
        if q.oldest_due_age is not None and (wanted is None or q.queue == wanted)
    }
    worst = max(lags.values(), default=0.0)
    late = sorted(name for name, lag in lags.items() if lag > max_lag.total_seconds())
    detail = f"oldest due job no worker holds waits {worst:.1f}s (limit {max_lag.total_seconds():g}s)" + (
        f" on {', '.join(late)}" if late else ""
    )
    return Check("lag", not late, detail, {"lag_seconds": {k: round(v, 3) for k, v in lags.items()}})


def _claims_check(conn: Any, tables: Tables, dialect: str, max_claim: timedelta) -> Check:
    params = {"job_table": str(tables.job), "max_seconds": max_claim.total_seconds()}
    try:
        rows = query(conn, dialect, statements(dialect, "ops.sql")["long_claims"], params)
    finally:
        end_read(conn)
    held = [{"session": row[0], "seconds": round(float(row[1]), 3), "state": row[2]} for row in rows]
    limit = f"limit {max_claim.total_seconds():g}s"
    if held:
        longest = max(h["seconds"] for h in held)
        detail = (
            f"{len(held)} transaction(s) hold a claim longer than allowed, longest {longest:g}s ({limit})"
        )
        return Check("claims", False, detail, {"long_claims": held})
    return Check(
        "claims", True, f"no claim held longer than {max_claim.total_seconds():g}s", {"long_claims": []}
    )


def check_health(
    conn: Any,
    *,
    tables: Tables | None = None,
    dialect: str | None = None,
    max_lag: timedelta = timedelta(minutes=5),
    max_claim: timedelta = timedelta(minutes=10),
    queue: str | None = None,
    clock: Clock | None = None,
) -> HealthReport:
    """The schema, lag and claims checks; lag and claims are skipped when the schema check fails."""
    active = dialect_of(conn, dialect)
    tables = tables or Tables.of()
    checks = [Check("database", True, "reachable"), _schema_check(conn, tables, active)]
    if checks[-1].ok:
        checks.append(_lag_check(conn, tables, active, max_lag, queue, clock))
        checks.append(_claims_check(conn, tables, active, max_claim))
    return HealthReport(tuple(checks))
