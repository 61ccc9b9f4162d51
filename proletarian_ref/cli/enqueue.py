"""`proletarian-ref enqueue JOB_TYPE PAYLOAD_JSON | --from FILE`: insert one job or many; print the ids."""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime, timedelta
from typing import IO, Any

from proletarian_ref.cli.database import add_database_options, open_database, tables_from
from proletarian_ref.cli.errors import ExitCode, UsageError
from proletarian_ref.errors import (
    ConfigurationError,
    InvalidKeywordError,
    ProletarianError,
    SerializationError,
)
from proletarian_ref.job import JobSpec, enqueue, enqueue_many
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text

# About 31,700 years: far enough for any schedule, and short of timedelta's own limit.
_MAX_SECONDS = 1e12
_LINE_KEYS = ("job_type", "payload", "queue", "process_in", "process_at")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or abs(value) > _MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"not a number of seconds within +-{_MAX_SECONDS:.0e}: {text!r}")
    if value > 0:
        try:
            datetime.now(UTC) + timedelta(seconds=value)
        except OverflowError:
            raise argparse.ArgumentTypeError(
                f"{text} seconds from now is past the year 9999, the last a time can have"
            ) from None
    return value


def _not_standard(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON (no JSON parser but Python's reads it)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is too large for a 64-bit float: it would be stored as infinity")
    return value


def strict_json(text: str) -> Any:
    """`text` as standard JSON: NaN, Infinity and numbers that overflow a float are refused, like text
    nested deeper than Python's JSON reader goes, with a ValueError that says so."""
    try:
        return json.loads(text, parse_constant=_not_standard, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deeply for Python's JSON reader (about 1,000 levels at most)") from None


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


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of jobs of at least 1: {text!r}")
    return value


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "enqueue",
        help="enqueue one job, or many from JSON lines, and print the ids",
        description="Enqueue one job, or one per line of --from, and print the ids. Object keys of the "
        'payload become keywords, as Proletarian\'s Transit serializer writes them ({"email": ...} is read '
        "as {:email ...} in Clojure).",
    )
    parser.add_argument("job_type", metavar="JOB_TYPE", nargs="?", help="a keyword such as my.app/send-email")
    parser.add_argument(
        "payload", metavar="PAYLOAD_JSON", nargs="?", help="the payload as JSON; - reads it from stdin"
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="enqueue one job per line of FILE (- for stdin): a JSON object with job_type and payload, and "
        "optionally queue, process_in (seconds) and process_at (ISO 8601); all in one transaction",
    )
    parser.add_argument(
        "--batch-size",
        type=_batch_size,
        default=1000,
        metavar="N",
        help="with --from: jobs per enqueue_many call, all in the one transaction (default: %(default)s)",
    )
    parser.add_argument("--queue", default=DEFAULT_QUEUE, help="queue keyword (default: %(default)s)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--process-in", type=_seconds, metavar="SECONDS", help="run it this many seconds from now (<= 0: now)"
    )
    when.add_argument(
        "--process-at", type=_instant, metavar="ISO8601", help="run it at this time (in the past: now)"
    )
    parser.add_argument(
        "--notify",
        action="store_true",
        help="announce the jobs to listening workers at commit (PostgreSQL NOTIFY: they start at once; "
        "elsewhere nothing)",
    )
    parser.add_argument("--json", action="store_true", help='print {"count": N, "job_ids": [...]}')
    add_database_options(parser)
    parser.set_defaults(run=run)


def _stdin(what: str) -> IO[str]:
    if sys.stdin is None or sys.stdin.closed:
        raise UsageError(f"{what} is -, but stdin is closed: pipe the input in, or give it otherwise")
    return sys.stdin


def parse_payload(text: str) -> Any:
    source = _stdin("PAYLOAD_JSON").read() if text == "-" else text
    try:
        return strict_json(source)
    except json.JSONDecodeError as exc:
        raise UsageError(f"PAYLOAD_JSON is not JSON: {exc}: {source[:80]!r}") from exc
    except ValueError as exc:
        raise UsageError(f"PAYLOAD_JSON: {exc}: {source[:80]!r}") from exc


def parse_job_line(text: str) -> JobSpec:
    """The job of one --from line; ValueError says what is wrong with it."""
    try:
        item = strict_json(text)
    except json.JSONDecodeError as exc:
        # The line number is the caller's: the reader's own "line 1" would say it twice, and wrongly.
        raise ValueError(f"not JSON: {exc.msg} at column {exc.colno}: {text[:80]!r}") from None
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object with job_type and payload, got {type(item).__name__}")
    unknown = sorted(set(item) - set(_LINE_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; the keys are {', '.join(_LINE_KEYS)}")
    missing = [key for key in ("job_type", "payload") if key not in item]
    if missing:
        raise ValueError(f"no {missing[0]!r}")
    if "process_in" in item and "process_at" in item:
        raise ValueError("process_in and process_at exclude each other")
    process_in = process_at = None
    try:
        job_type = to_keyword_text(_text(item, "job_type"), what="job_type")
        queue = None if item.get("queue") is None else to_keyword_text(_text(item, "queue"), what="queue")
        if item.get("process_in") is not None:
            seconds = item["process_in"]
            if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                raise ValueError(f"process_in must be a number of seconds, got {seconds!r}")
            process_in = timedelta(seconds=_seconds(str(seconds)))
        if item.get("process_at") is not None:
            process_at = _instant(_text(item, "process_at"))
    except (InvalidKeywordError, argparse.ArgumentTypeError) as exc:
        raise ValueError(str(exc)) from None
    return JobSpec(job_type, item["payload"], queue, process_at, process_in)


def _text(item: dict[str, Any], key: str) -> str:
    value = item[key]
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {json.dumps(value)}")
    return value


# Enough to fix a file in one go, short enough to read; the count of the others is given.
_BAD_LINES_SHOWN = 20


def read_job_lines(stream: IO[str], name: str) -> list[tuple[int, JobSpec]]:
    """(line number, job) for every line of `stream` that is not blank.

    Every line is checked: bad lines make one UsageError that names each of them (the first
    _BAD_LINES_SHOWN, and how many in all), so a file can be fixed in one go.
    """
    jobs: list[tuple[int, JobSpec]] = []
    bad: list[str] = []
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            jobs.append((number, parse_job_line(line)))
        except ValueError as exc:
            bad.append(f"{name} line {number}: {exc}")
    if bad:
        shown = "\n  ".join(bad[:_BAD_LINES_SHOWN])
        more = f"\n  ... and {len(bad) - _BAD_LINES_SHOWN} more" if len(bad) > _BAD_LINES_SHOWN else ""
        lines = "1 bad line" if len(bad) == 1 else f"{len(bad)} bad lines"
        raise UsageError(f"{lines}, nothing was enqueued:\n  {shown}{more}")
    return jobs


def _read_jobs(source: str) -> list[tuple[int, JobSpec]]:
    if source == "-":
        return read_job_lines(_stdin("--from"), "stdin")
    try:
        with open(source, encoding="utf-8") as stream:
            return read_job_lines(stream, source)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --from {source}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    try:
        queue = to_keyword_text(args.queue, what="--queue")
    except InvalidKeywordError as exc:
        raise UsageError(str(exc)) from exc
    if args.source is not None:
        if args.job_type is not None or args.process_in is not None or args.process_at is not None:
            raise UsageError(
                "--from takes no JOB_TYPE, PAYLOAD_JSON, --process-in or --process-at: each line has its own"
            )
        return _enqueue_lines(args, queue)
    if args.job_type is None or args.payload is None:
        raise UsageError("give JOB_TYPE and PAYLOAD_JSON, or --from FILE")
    try:
        job_type = to_keyword_text(args.job_type, what="JOB_TYPE")
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
                archived_job_table=tables.archived,
                notify=args.notify,
            )
            conn.commit()
        finally:
            conn.close()
    _print_ids(args, [job_id], count=False)
    return ExitCode.OK


def _enqueue_lines(args: argparse.Namespace, queue: str) -> int:
    """Every job of --from in one transaction: a line refused, or any error, commits none of them."""
    tables = tables_from(args)
    numbered = _read_jobs(args.source)  # every line parsed before the database is opened
    ids: list[Any] = []
    with open_database(args, tables) as db:
        conn = db.connect()
        try:
            for start in range(0, len(numbered), args.batch_size):
                batch = numbered[start : start + args.batch_size]
                try:
                    ids += enqueue_many(
                        conn,
                        [spec for _, spec in batch],
                        queue=queue,
                        job_table=tables.job,
                        archived_job_table=tables.archived,
                        notify=args.notify,
                    )
                except ProletarianError as exc:
                    if exc.index is None or not isinstance(exc, ConfigurationError | SerializationError):
                        raise
                    reason = exc.__cause__ if exc.__cause__ is not None else exc
                    name = "stdin" if args.source == "-" else args.source
                    line = batch[exc.index][0]
                    raise UsageError(f"{name} line {line}: {reason}; nothing was enqueued") from exc
            conn.commit()
        finally:
            conn.close()  # without the commit, the server rolls back what was written
    _print_ids(args, ids, count=True)
    return ExitCode.OK


def _print_ids(args: argparse.Namespace, ids: list[Any], *, count: bool) -> None:
    """The ids on stdout, one a line (or JSON); with `count`, how many on stderr, which --from needs."""
    if args.json:
        print(json.dumps({"count": len(ids), "job_ids": [str(job_id) for job_id in ids]}))
        return
    for job_id in ids:
        print(job_id)
    if count:
        print(f"{len(ids)} job{'' if len(ids) == 1 else 's'} enqueued", file=sys.stderr)
