"""`proletarian-ref enqueue JOB_TYPE PAYLOAD_JSON`: insert one job and print its id."""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime, timedelta
from typing import Any

from proletarian_ref.cli.database import add_database_options, open_database, tables_from
from proletarian_ref.cli.errors import ExitCode, UsageError
from proletarian_ref.errors import InvalidKeywordError
from proletarian_ref.job import enqueue
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text

# About 31,700 years: far enough for any schedule, and short of timedelta's own limit.
_MAX_SECONDS = 1e12


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or abs(value) > _MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"not a number of seconds within +-{_MAX_SECONDS:.0e}: {text!r}")
    return value


def _instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 date-time: {text!r} (e.g. 2030-01-31T12:00:00Z or 2030-01-31T13:00:00+01:00)"
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset: add Z or one like +01:00")
    return value


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "enqueue",
        help="enqueue one job and print its id",
        description="Enqueue one job and print its id. Object keys of the payload become keywords, as "
        'Proletarian\'s Transit serializer writes them ({"email": ...} is read as {:email ...} in Clojure).',
    )
    parser.add_argument("job_type", metavar="JOB_TYPE", help="a keyword such as my.app/send-email")
    parser.add_argument("payload", metavar="PAYLOAD_JSON", help="the payload as JSON; - reads it from stdin")
    parser.add_argument("--queue", default=DEFAULT_QUEUE, help="queue keyword (default: %(default)s)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--process-in", type=_seconds, metavar="SECONDS", help="run it this many seconds from now (<= 0: now)"
    )
    when.add_argument(
        "--process-at", type=_instant, metavar="ISO8601", help="run it at this time (in the past: now)"
    )
    add_database_options(parser)
    parser.set_defaults(run=run)


def parse_payload(text: str) -> Any:
    source = sys.stdin.read() if text == "-" else text
    try:
        return json.loads(source)
    except ValueError as exc:
        raise UsageError(f"PAYLOAD_JSON is not JSON: {exc}: {source[:80]!r}") from exc


def run(args: argparse.Namespace) -> int:
    try:
        job_type = to_keyword_text(args.job_type, what="JOB_TYPE")
        queue = to_keyword_text(args.queue, what="--queue")
    except InvalidKeywordError as exc:
        raise UsageError(str(exc)) from exc
    payload = parse_payload(args.payload)
    tables = tables_from(args)
    process_in = None if args.process_in is None else timedelta(seconds=args.process_in)
    with open_database(args, tables) as db:
        conn = db.connect()
        try:
            job_id = enqueue(
                conn,
                job_type,
                payload,
                queue=queue,
                process_at=args.process_at,
                process_in=process_in,
                job_table=tables.job,
            )
            conn.commit()
        finally:
            conn.close()
    print(job_id)
    return ExitCode.OK
