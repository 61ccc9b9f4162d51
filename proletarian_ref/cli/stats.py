"""`proletarian-ref stats`: per queue, jobs due and scheduled, the oldest due job's age, archived jobs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from proletarian_ref.cli.database import add_database_options, open_database, tables_from
from proletarian_ref.cli.errors import ExitCode
from proletarian_ref.cli.terminal import printable
from proletarian_ref.ops.durations import format_duration as format_age
from proletarian_ref.ops.stats import Stats, queue_stats


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "stats",
        help="jobs due, scheduled and archived, per queue",
        description="Per queue: jobs due now and waiting, jobs running (held by a worker), jobs scheduled "
        "later, the age of the oldest waiting job, and archived jobs by status. Queue and status names are "
        "shown without their EDN colon.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_database_options(parser)
    parser.set_defaults(run=run)


def format_table(stats: Stats) -> str:
    header = (
        f"job table {stats.job_table}, archive {stats.archived_job_table}, at {stats.now:%Y-%m-%d %H:%M:%S}Z"
    )
    if not stats.queues:
        return f"{header}\nno jobs, queued or archived\n"
    others = sorted({status for q in stats.queues for status in q.archived} - {"success", "failure"})
    statuses = ["success", "failure", *others]
    columns = [
        "QUEUE",
        "DUE",
        "RUNNING",
        "SCHEDULED",
        "OLDEST DUE",
        *(printable(s.upper()) for s in statuses),
    ]
    rows = [
        [
            printable(q.queue),
            str(q.due),
            str(q.running),
            str(q.scheduled),
            format_age(q.oldest_due_age),
            *(str(q.archived.get(s, 0)) for s in statuses),
        ]
        for q in stats.queues
    ]
    widths = [max(len(row[i]) for row in [columns, *rows]) for i in range(len(columns))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([header, line(columns), *(line(row) for row in rows)]) + "\n"


def run(args: argparse.Namespace) -> int:
    tables = tables_from(args)
    with open_database(args, tables) as db:
        conn = db.connect()
        try:
            stats = queue_stats(
                conn, job_table=tables.job, archived_job_table=tables.archived, dialect=db.dialect
            )
        finally:
            conn.close()
    if args.json:
        sys.stdout.write(json.dumps(stats.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(format_table(stats))
    return ExitCode.OK
