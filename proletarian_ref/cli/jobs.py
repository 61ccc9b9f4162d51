"""`list`, `show`, `retry`, `cancel`, `reschedule` and `purge`: a queue's jobs, one by one or by filter."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from proletarian_ref.cli.database import add_database_options, open_database, tables_from
from proletarian_ref.cli.enqueue import _instant, _seconds
from proletarian_ref.cli.errors import CliError, ExitCode, UsageError
from proletarian_ref.cli.logs import notice
from proletarian_ref.cli.terminal import printable
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.keywords import from_keyword_text
from proletarian_ref.ops import jobs
from proletarian_ref.ops.db import Tables, parse_job_id
from proletarian_ref.ops.durations import format_duration, parse_duration
from proletarian_ref.ops.jobs import JobFilter, JobView, PurgeFilter, Result

_FILTER_OPTIONS: Final = ("queue", "job_type", "min_attempts", "max_attempts", "older_than", "newer_than")


def duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}: {text!r}")
        return value

    return parse


def _job_id(text: str) -> str:
    try:
        parse_job_id(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_filters(parser: argparse.ArgumentParser, *, status: str | None) -> None:
    group = parser.add_argument_group("filters (combined with AND)")
    group.add_argument("--queue", help="queue keyword, e.g. my.app/mail")
    group.add_argument("--job-type", help="job type keyword, e.g. my.app/send-email")
    if status is not None:
        group.add_argument("--status", default=status, help=f"(default: {status}); see the description")
    group.add_argument("--min-attempts", type=_count(0), metavar="N", help="attempts >= N")
    group.add_argument("--max-attempts", type=_count(0), metavar="N", help="attempts <= N")
    group.add_argument(
        "--older-than",
        type=duration,
        metavar="DURATION",
        help="enqueued over this long ago (e.g. 2h)",
    )
    group.add_argument("--newer-than", type=duration, metavar="DURATION", help="enqueued within this long")


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _add_confirm(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--yes", action="store_true", help="go on without asking (needed off a terminal)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")


def _filter_from(args: argparse.Namespace, status: str) -> JobFilter:
    try:
        return JobFilter(
            queue=args.queue,
            job_type=args.job_type,
            status=status,
            min_attempts=args.min_attempts,
            max_attempts=args.max_attempts,
            older_than=args.older_than,
            newer_than=args.newer_than,
        )
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from exc


def _filter_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, name) is not None for name in _FILTER_OPTIONS)


def _describe(job_filter: JobFilter) -> str:
    parts = [
        f"{name.replace('_', '-')} {from_keyword_text(value) if isinstance(value, str) else value}"
        for name in _FILTER_OPTIONS
        if (value := getattr(job_filter, name)) is not None
    ]
    return " and ".join(parts) if parts else "no filter"


@contextmanager
def _connection(args: argparse.Namespace) -> Iterator[tuple[Any, str, Tables]]:
    cli_tables = tables_from(args)
    with open_database(args, cli_tables) as db:
        conn = db.connect()
        try:
            yield conn, db.dialect, Tables(cli_tables.job, cli_tables.archived)
        finally:
            conn.close()


def _print_json(data: Any) -> None:
    # Standard JSON only: jsonable writes non-finite numbers as strings, and allow_nan=False holds to it.
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def format_jobs(views: list[JobView], now: datetime) -> str:
    columns = ["ID", "QUEUE", "JOB TYPE", "STATE", "ATTEMPTS", "PROCESS AT", "FINISHED AT", "AGE"]
    rows = [
        [
            str(v.job_id),
            printable(from_keyword_text(v.queue)),
            printable(from_keyword_text(v.job_type)),
            v.state(now),
            str(v.attempts),
            _when(v.process_at),
            _when(v.finished_at),
            format_duration(max(now - v.enqueued_at, timedelta(0))),
        ]
        for v in views
    ]
    widths = [max(len(row[i]) for row in [columns, *rows]) for i in range(len(columns))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [columns, *rows]
    ]
    return "\n".join(lines) + "\n"


# -- list and show ---------------------------------------------------------------------------------------


def run_list(args: argparse.Namespace) -> int:
    job_filter = _filter_from(args, args.status)
    now = datetime.now(UTC)
    with _connection(args) as (conn, dialect, tables):
        try:
            page = jobs.list_jobs(
                conn, job_filter, after=args.after, limit=args.limit, tables=tables, dialect=dialect
            )
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from exc
    if args.json:
        _print_json({"jobs": [v.to_json(now) for v in page.jobs], "next_cursor": page.next_cursor})
        return ExitCode.OK
    if page.jobs:
        sys.stdout.write(format_jobs(page.jobs, now))
    else:
        notice(f"no {from_keyword_text(job_filter.status)} jobs match ({_describe(job_filter)})")
    if page.next_cursor is not None:
        notice(f"more jobs: add --after {page.next_cursor}")
    return ExitCode.OK


def run_show(args: argparse.Namespace) -> int:
    with _connection(args) as (conn, dialect, tables):
        view = jobs.show_job(conn, args.job_id, tables=tables, dialect=dialect)
    if view is None:
        raise CliError(f"no job {args.job_id} in {tables.job} or {tables.archived}")
    data = view.to_json(datetime.now(UTC))
    try:
        data["payload"] = jobs.jsonable(view.payload())
    except Exception as exc:
        # The handler would fail the same way: shown, not hidden.
        data["payload_error"] = f"{type(exc).__name__}: {exc}"
    if args.json:
        _print_json(data)
        return ExitCode.OK
    for key in (
        "job_id",
        "queue",
        "job_type",
        "state",
        "attempts",
        "enqueued_at",
        "process_at",
        "finished_at",
    ):
        sys.stdout.write(f"{key:<12} {printable(str(data[key])) if data[key] is not None else '-'}\n")
    sys.stdout.write(f"{'transit':<12} {printable(data['payload_transit'])}\n")
    if "payload" in data:
        sys.stdout.write("payload (as a handler gets it):\n" + json.dumps(data["payload"], indent=2) + "\n")
    else:
        sys.stdout.write(f"payload does not decode: {printable(data['payload_error'])}\n")
    for error in data.get("errors", ()):
        # The error history (docs/errors.md): each failed attempt, oldest first.
        sys.stdout.write(
            f"attempt {error['attempt']} failed at {error['failed_at']} on {printable(error['host'])} "
            f"({printable(error['queue_worker_id']) or '-'} thread {printable(error['thread']) or '-'}): "
            f"{printable(error['error_type'])}: {printable(error['message'])}\n"
        )
        sys.stdout.write("".join(f"    {printable(line)}\n" for line in error["traceback"].splitlines()))
    return ExitCode.OK


# -- retry, cancel, reschedule ---------------------------------------------------------------------------


def confirm(plan: str, args: argparse.Namespace) -> bool:
    """Say what will be done; go on with --yes, or after a "y" on a terminal; refuse on a pipe."""
    notice(plan)
    if getattr(args, "dry_run", False):
        notice("dry run: nothing changed")
        return False
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError("stdin is not a terminal: add --yes to confirm")
    # The question goes to stderr with the plan, so stdout keeps only results.
    sys.stderr.write("proletarian-ref: go on? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        notice("nothing changed")
        return False
    return True


def _selected(
    args: argparse.Namespace, conn: Any, dialect: str, tables: Tables, status: str
) -> tuple[list[str], str, bool]:
    """The job ids to act on, a description of them, and whether they were named one by one."""
    if args.job_ids and (_filter_given(args) or args.all):
        raise UsageError("give job ids or filter options, not both")
    if args.job_ids:
        return list(dict.fromkeys(args.job_ids)), f"{len(set(args.job_ids))} job(s) by id", True
    if not (_filter_given(args) or args.all):
        raise UsageError("give job ids, or filter options (--queue, --job-type, ...), or --all")
    job_filter = _filter_from(args, status)
    found = [str(v.job_id) for v in jobs.iter_jobs(conn, job_filter, tables=tables, dialect=dialect)]
    return found, f"{len(found)} {from_keyword_text(status)} job(s) matching {_describe(job_filter)}", False


def _line(result: Result) -> str:
    return f"{result.job_id} {result.outcome}{': ' + result.detail if result.detail else ''}\n"


def _report(args: argparse.Namespace, results: list[Result], by_id: bool) -> int:
    """Each job's outcome (printed as it happened, or here as JSON); exit 1 for a job named by id that was
    left alone, or any job the database refused."""
    counts = Counter(r.outcome for r in results)
    if args.json:
        _print_json({"results": [r.to_json() for r in results], "counts": counts})
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no jobs"
    notice(summary)
    missed = [r for r in results if r.outcome not in jobs.CHANGED]
    if missed and by_id:
        raise CliError(f"{len(missed)} of the jobs named were not changed: {summary}")
    conflicts = counts.get("conflict", 0)
    if conflicts:
        raise CliError(f"the database refused {conflicts} of the jobs: {summary}")
    return ExitCode.OK


def _progress(args: argparse.Namespace) -> Callable[[Result], None] | None:
    """Each job's line on stdout as soon as its transaction ends (JSON waits for the end)."""
    if args.json:
        return None

    def progress(result: Result) -> None:
        sys.stdout.write(_line(result))
        sys.stdout.flush()

    return progress


def run_retry(args: argparse.Namespace) -> int:
    with _connection(args) as (conn, dialect, tables):
        ids, what, by_id = _selected(args, conn, dialect, tables, jobs.STATUS_FAILURE)
        when = "now" if args.process_at is None else args.process_at.isoformat()
        plan = f"retry {what}: back to {tables.job} with attempts 0, due {when}"
        if not ids:
            notice(f"nothing to retry: {what}")
            return ExitCode.OK
        if (args.dry_run or not by_id) and not confirm(plan, args):
            return ExitCode.OK
        results = jobs.retry_jobs(
            conn,
            ids,
            process_at=args.process_at,
            tables=tables,
            dialect=dialect,
            on_result=_progress(args),
        )
    return _report(args, results, by_id)


def run_cancel(args: argparse.Namespace) -> int:
    with _connection(args) as (conn, dialect, tables):
        ids, what, by_id = _selected(args, conn, dialect, tables, args.status)
        plan = f"cancel {what}: archived as {jobs.STATUS_CANCELLED}; jobs running now are skipped"
        if not ids:
            notice(f"nothing to cancel: {what}")
            return ExitCode.OK
        if not confirm(plan, args):
            return ExitCode.OK
        results = jobs.cancel_jobs(conn, ids, tables=tables, dialect=dialect, on_result=_progress(args))
    return _report(args, results, by_id)


def run_reschedule(args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    when = args.process_at if args.process_at is not None else now + timedelta(seconds=args.process_in)
    with _connection(args) as (conn, dialect, tables):
        ids, what, by_id = _selected(args, conn, dialect, tables, args.status)
        plan = f"reschedule {what} to {when.isoformat()}; jobs running now are skipped"
        if not ids:
            notice(f"nothing to reschedule: {what}")
            return ExitCode.OK
        if not confirm(plan, args):
            return ExitCode.OK
        try:
            results = jobs.reschedule_jobs(
                conn, ids, when, tables=tables, dialect=dialect, on_result=_progress(args)
            )
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from exc
    return _report(args, results, by_id)


# -- purge -----------------------------------------------------------------------------------------------


def run_purge(args: argparse.Namespace) -> int:
    try:
        purge = PurgeFilter(older_than=args.older_than, queue=args.queue, status=args.status)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from exc
    with _connection(args) as (conn, dialect, tables):
        count = jobs.purge_count(conn, purge, tables=tables, dialect=dialect)
        scope = " ".join(
            part
            for part in (
                f"of queue {from_keyword_text(purge.queue)}" if purge.queue else "",
                f"with status {from_keyword_text(purge.status)}" if purge.status else "",
            )
            if part
        )
        plan = (
            f"purge {count} archived job(s) {scope + ' ' if scope else ''}finished over "
            f"{format_duration(purge.older_than)} ago from {tables.archived}, {args.batch_size} a transaction"
        )
        if count == 0:
            notice(plan)
            deleted = 0
        elif not confirm(plan, args):
            return ExitCode.OK
        else:

            def progress(total: int) -> None:
                notice(f"deleted {total} of {count}")

            deleted = jobs.purge_archive(
                conn, purge, tables=tables, dialect=dialect, batch_size=args.batch_size, on_batch=progress
            )
    if args.json:
        _print_json({"deleted": deleted})
    else:
        sys.stdout.write(f"{deleted}\n")
    return ExitCode.OK


# -- parsers ---------------------------------------------------------------------------------------------


def add_parsers(subparsers: Any) -> None:
    lister = subparsers.add_parser(
        "list",
        help="list queued or archived jobs by filter, a page at a time",
        description="List jobs, a page at a time (keyset paging: add the --after printed at the end). "
        "--status queued (the default), due or scheduled lists the job table, next to run first; archived, "
        "success, failure, cancelled or any other status lists the archive, last finished first.",
    )
    _add_filters(lister, status="queued")
    lister.add_argument("--limit", type=_count(1), default=50, metavar="N", help="jobs a page (default: 50)")
    lister.add_argument("--after", metavar="CURSOR", help="the cursor printed after the previous page")
    _add_output(lister)
    add_database_options(lister)
    lister.set_defaults(run=run_list)

    shower = subparsers.add_parser(
        "show",
        help="show one job, queued or archived, with its payload decoded",
        description="Show one job with its payload decoded as a default-mode handler gets it.",
    )
    shower.add_argument("job_id", metavar="ID", type=_job_id)
    _add_output(shower)
    add_database_options(shower)
    shower.set_defaults(run=run_show)

    retrier = subparsers.add_parser(
        "retry",
        help="move archived failures back to the job table",
        description="Move archived :failure jobs back to the job table: same id, queue, job type and "
        "payload, attempts 0, due now or at --process-at. Each job moves in one transaction; two retries "
        "at once still give one job. By id, or by filter (then --yes, or a 'y' on a terminal).",
    )
    retrier.add_argument("job_ids", metavar="ID", nargs="*", type=_job_id)
    _add_filters(retrier, status=None)
    retrier.add_argument("--all", action="store_true", help="every archived failure")
    retrier.add_argument("--process-at", type=_instant, metavar="ISO8601", help="run them at this time")
    _add_confirm(retrier)
    _add_output(retrier)
    add_database_options(retrier)
    retrier.set_defaults(run=run_retry)

    canceller = subparsers.add_parser(
        "cancel",
        help="archive queued jobs as cancelled",
        description="Archive queued jobs with status :cancelled (attempts unchanged) and remove them "
        "from the job table, each in one transaction. A job a worker is running is reported, never waited "
        "for. --status: queued (default), due or scheduled.",
    )
    canceller.add_argument("job_ids", metavar="ID", nargs="*", type=_job_id)
    _add_filters(canceller, status="queued")
    canceller.add_argument("--all", action="store_true", help="every queued job")
    _add_confirm(canceller)
    _add_output(canceller)
    add_database_options(canceller)
    canceller.set_defaults(run=run_cancel)

    rescheduler = subparsers.add_parser(
        "reschedule",
        help="change when queued jobs run",
        description="Set process_at of queued jobs; a job a worker is running is reported and skipped.",
    )
    rescheduler.add_argument("job_ids", metavar="ID", nargs="*", type=_job_id)
    _add_filters(rescheduler, status="queued")
    rescheduler.add_argument("--all", action="store_true", help="every queued job")
    when = rescheduler.add_mutually_exclusive_group(required=True)
    when.add_argument("--process-at", type=_instant, metavar="ISO8601", help="run them at this time")
    when.add_argument("--process-in", type=_seconds, metavar="SECONDS", help="run them this long from now")
    _add_confirm(rescheduler)
    _add_output(rescheduler)
    add_database_options(rescheduler)
    rescheduler.set_defaults(run=run_reschedule)

    purger = subparsers.add_parser(
        "purge",
        help="delete old archived jobs in small batches",
        description="Delete archived jobs finished more than --older-than ago, --batch-size rows a "
        "transaction, with progress on stderr. Safe to run from cron while workers run.",
    )
    purger.add_argument("--older-than", type=duration, required=True, metavar="DURATION", help="e.g. 30d")
    purger.add_argument("--queue", help="only this queue")
    purger.add_argument("--status", help="only this status, e.g. success")
    purger.add_argument("--batch-size", type=_count(1), default=jobs.DEFAULT_BATCH_SIZE, metavar="N")
    _add_confirm(purger)
    _add_output(purger)
    add_database_options(purger)
    purger.set_defaults(run=run_purge)
