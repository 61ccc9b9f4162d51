"""`proletarian-ref periodic list`, and the scheduler `worker --schedules` runs beside its queue workers."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from proletarian_ref.cli.database import Database, add_database_options, open_database, tables_from
from proletarian_ref.cli.errors import CliError, ExitCode, UsageError
from proletarian_ref.cli.logs import notice
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.log import stdlib_logger


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "periodic", help="periodic jobs: list schedules with their last and next tick"
    )
    actions = parser.add_subparsers(dest="periodic_action", metavar="{list}", required=True)
    lister = actions.add_parser(
        "list",
        help="list schedules with their last and next tick",
        description="The schedules recorded in the side table <job table>_periodic_tick, with those of "
        "--schedules: each one's definition, last tick enqueued and next tick. A recorded schedule no longer "
        "in --schedules is marked (not in code).",
    )
    lister.add_argument("--schedules", metavar="MODULE:OBJECT", help="the list of Schedule objects in code")
    lister.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_database_options(lister)
    lister.set_defaults(run=run_list)


def load_schedules(spec: str) -> list[Any]:
    """The Schedule objects named by "package.module:OBJECT" (a list or tuple of them)."""
    from proletarian_ref.cli.worker import load_attribute
    from proletarian_ref.periodic import checked_schedules

    found = load_attribute(spec, "--schedules", "SCHEDULES")
    if callable(found):
        found = found()
    try:
        return checked_schedules(found)
    except (ConfigurationError, TypeError) as exc:
        raise UsageError(f"--schedules {spec!r}: {exc}") from exc


def _scheduler(db: Database, schedules: list[Any]) -> Any:
    from proletarian_ref.periodic import Scheduler

    return Scheduler(
        db.connect,
        schedules,
        job_table=db.tables.job,
        archived_job_table=db.tables.archived,
        log=stdlib_logger,
    )


def _format(value: datetime | None) -> str:
    return "-" if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z"


def run_list(args: argparse.Namespace) -> int:
    from proletarian_ref.periodic import listing

    schedules = load_schedules(args.schedules) if args.schedules else []
    tables = tables_from(args)
    with open_database(args, tables) as db:
        scheduler = _scheduler(db, schedules)
        try:
            states = scheduler.states()
        except Exception as exc:
            raise CliError(
                f"cannot read the periodic side table: {exc} (proletarian-ref schema install "
                "--with periodic creates it)"
            ) from exc
        finally:
            scheduler.backend.close()
    rows = listing(schedules, states, datetime.now(UTC))
    if args.json:
        out = [
            {
                "name": n,
                "definition": d,
                "last_tick": None if lt is None else lt.isoformat(),
                "next_tick": None if nt is None else nt.isoformat(),
            }
            for n, d, lt, nt in rows
        ]
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return ExitCode.OK
    table = [["SCHEDULE", "LAST TICK", "NEXT TICK", "DEFINITION"]] + [
        [name, _format(last), _format(upcoming), definition] for name, definition, last, upcoming in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        sys.stdout.write(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n"
        )
    if not rows:
        sys.stdout.write("no schedules recorded or given\n")
    return ExitCode.OK


@contextmanager
def running_scheduler(spec: str | None, db: Database, stop: threading.Event) -> Iterator[None]:
    """With `spec`, a scheduler thread ticking the schedules it names until `stop` is set; else nothing."""
    if spec is None:
        yield
        return
    schedules = load_schedules(spec)
    scheduler = _scheduler(db, schedules)
    try:
        scheduler.register()
    except ConfigurationError as exc:
        scheduler.backend.close()
        raise CliError(str(exc)) from exc
    thread = threading.Thread(
        target=scheduler.run, args=(stop,), name="proletarian-ref-scheduler", daemon=True
    )
    thread.start()
    notice(f"scheduler running {len(schedules)} schedule{'s' if len(schedules) != 1 else ''} from {spec}")
    try:
        yield
    finally:
        stop.set()
        thread.join()
        scheduler.backend.close()
