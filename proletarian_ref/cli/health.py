"""`proletarian-ref health`: a probe's exit code: reachable, schema, lag of due jobs, claims held too long."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from proletarian_ref.cli.database import add_database_options, open_database, tables_from
from proletarian_ref.cli.errors import CannotConnectError, ExitCode
from proletarian_ref.cli.jobs import duration
from proletarian_ref.cli.terminal import printable
from proletarian_ref.ops.db import Tables
from proletarian_ref.ops.health import Check, HealthReport, check_health


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "health",
        help="check the queue for a probe: exit 0 healthy, else a code saying what is wrong",
        description="Exit 0 when the database answers, both tables have Proletarian's columns, no due job "
        "has waited over --max-lag and no transaction has held a claimed job over --max-claim. Else exit "
        "3 (cannot connect), 4 (a table or column missing), 5 (lag) or 6 (a claim held too long).",
    )
    parser.add_argument("--max-lag", type=duration, default="5m", metavar="DURATION", help="(default: 5m)")
    parser.add_argument(
        "--max-claim", type=duration, default="10m", metavar="DURATION", help="(default: 10m)"
    )
    parser.add_argument("--queue", help="check the lag of this queue only")
    parser.add_argument("--json", action="store_true", help="print every check as JSON")
    add_database_options(parser)
    parser.set_defaults(run=run)


def exit_code(report: HealthReport) -> ExitCode:
    for name, code in (
        ("database", ExitCode.CANNOT_CONNECT),
        ("schema", ExitCode.SCHEMA_MISSING),
        ("lag", ExitCode.QUEUE_LAGGING),
        ("claims", ExitCode.CLAIM_HELD_TOO_LONG),
    ):
        if report.failed(name):
            return code
    return ExitCode.OK


def _print(report: HealthReport, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
        return
    for check in report.checks:
        # A lagging queue's name comes from the rows.
        sys.stdout.write(f"{'ok  ' if check.ok else 'FAIL'} {check.name:<9} {printable(check.detail)}\n")


def run(args: argparse.Namespace) -> int:
    cli_tables = tables_from(args)
    try:
        with open_database(args, cli_tables, check_schema=False) as db:
            conn = db.connect()
            try:
                report = check_health(
                    conn,
                    tables=Tables(cli_tables.job, cli_tables.archived),
                    dialect=db.dialect,
                    max_lag=args.max_lag,
                    max_claim=args.max_claim,
                    queue=args.queue,
                )
            finally:
                conn.close()
    except CannotConnectError as exc:
        report = HealthReport((Check("database", False, str(exc)),))
    _print(report, args.json)
    return exit_code(report)
