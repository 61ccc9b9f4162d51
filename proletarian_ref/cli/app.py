"""The argument parser and main(): one subcommand per module, errors mapped to documented exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from proletarian_ref import __version__
from proletarian_ref.cli import (
    aio_worker,
    dashboard,
    demo,
    embedded,
    enqueue,
    health,
    jobs,
    periodic,
    schema,
    stats,
)
from proletarian_ref.cli.database import is_driver_error
from proletarian_ref.cli.env import EnvError, apply_env_defaults, leaf_parsers
from proletarian_ref.cli.errors import CliError, ExitCode
from proletarian_ref.cli.logs import add_log_options, cli_logging
from proletarian_ref.cli.logs import error as log_error
from proletarian_ref.errors import (
    ConfigurationError,
    DatabaseError,
    ProletarianError,
    SchemaMissingError,
    SerializationError,
)
from proletarian_ref.ops.embedded import EmbeddedServerError

PROG = "proletarian-ref"

EPILOG = """\
database: --dsn, else $PROLETARIAN_DSN, else the embedded PostgreSQL (started on demand in the user data
directory, schema installed, stopped when the last command using it ends).

every option can also be set as PROLETARIAN_<OPTION> (e.g. PROLETARIAN_JOB_TABLE); the command line wins.

exit codes: 0 ok, 1 runtime error, 2 usage error, 3 cannot connect to the database, 4 schema missing,
5 and 6 (health only) lag and claims, 7 cannot listen on a port, 130 interrupted. See docs/cli.md.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Proletarian's durable job queue on PostgreSQL and MySQL, from the command line.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (schema, enqueue, aio_worker, stats, periodic, health, demo, embedded):
        module.add_parser(subparsers)
    jobs.add_parsers(subparsers)
    dashboard.add_parser(subparsers)
    for leaf in leaf_parsers(parser):
        if leaf is not parser and not any(isinstance(a, argparse._SubParsersAction) for a in leaf._actions):
            add_log_options(leaf)
    return parser


def _error(message: str, code: ExitCode) -> int:
    log_error(message)
    return int(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (docs/cli.md) instead of exiting."""
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        apply_env_defaults(parser, arguments)
    except EnvError as exc:
        return _error(str(exc), ExitCode.USAGE_ERROR)
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exc:
        # argparse exits 2 on a usage error and 0 after --help or --version.
        return exc.code if isinstance(exc.code, int) else int(ExitCode.USAGE_ERROR)
    # `worker --processes N` starts its children with the same arguments.
    args.cli_argv = arguments
    with cli_logging(args.log_level, args.log_format):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.run(args))
    except CliError as exc:
        return _error(str(exc), exc.exit_code)
    except EmbeddedServerError as exc:
        return _error(str(exc), ExitCode.CANNOT_CONNECT)
    except SchemaMissingError as exc:
        return _error(str(exc), ExitCode.SCHEMA_MISSING)
    except (ConfigurationError, SerializationError) as exc:
        return _error(str(exc), ExitCode.USAGE_ERROR)
    except (DatabaseError, ProletarianError) as exc:
        return _error(f"{type(exc).__name__}: {exc}", ExitCode.RUNTIME_ERROR)
    except KeyboardInterrupt:
        return _error("interrupted", ExitCode.INTERRUPTED)
    except Exception as exc:
        if is_driver_error(exc):
            return _error(
                f"database error: {type(exc).__name__}: {' '.join(str(exc).split())}", ExitCode.RUNTIME_ERROR
            )
        raise
