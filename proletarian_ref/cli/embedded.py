"""`proletarian-ref embedded start|stop|status`: keep the embedded PostgreSQL running between commands."""

from __future__ import annotations

import argparse
from typing import Any

from proletarian_ref.cli.database import add_database_options, open_database, tables_from
from proletarian_ref.cli.errors import CannotConnectError, ExitCode
from proletarian_ref.cli.logs import notice
from proletarian_ref.ops import embedded


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "embedded",
        help="start, stop or show the embedded PostgreSQL",
        description="The embedded PostgreSQL that commands use when no --dsn or PROLETARIAN_DSN is given. "
        f"Its data directory is ${embedded.EMBEDDED_DIR_ENV}, else the user data directory. By default it "
        "runs while a command uses it; `start` keeps it running (and prints its DSN) until `stop`.",
    )
    actions = parser.add_subparsers(dest="embedded_action", metavar="{start,stop,status}", required=True)
    starter = actions.add_parser("start", help="start it, install the schema, keep it running, print its DSN")
    add_database_options(starter, dsn=False)
    starter.set_defaults(run=run_start)
    stopper = actions.add_parser("stop", help="stop it (jobs in flight roll back and stay queued)")
    stopper.set_defaults(run=run_stop)
    status = actions.add_parser("status", help="print its DSN if it is running (exit 3 if not)")
    status.set_defaults(run=run_status)


def run_start(args: argparse.Namespace) -> int:
    tables = tables_from(args)
    # This subcommand is about the embedded server only, whatever PROLETARIAN_DSN says.
    with open_database(args, tables, keep_embedded=True, ignore_env=True) as db:
        print(db.dsn)
    return ExitCode.OK


def run_stop(args: argparse.Namespace) -> int:
    try:
        was_running = embedded.stop()
    except embedded.EmbeddedServerError as exc:
        raise CannotConnectError(str(exc)) from exc
    state = "stopped" if was_running else "was not running"
    notice(f"the embedded PostgreSQL in {embedded.default_data_dir()} {state}")
    return ExitCode.OK


def run_status(args: argparse.Namespace) -> int:
    dsn = embedded.running_dsn()
    if dsn is None:
        notice(f"the embedded PostgreSQL in {embedded.default_data_dir()} is not running")
        return ExitCode.CANNOT_CONNECT
    print(dsn)
    return ExitCode.OK
