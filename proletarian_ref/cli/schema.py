"""`proletarian-ref schema print|install`: the DDL of both tables, printed or run (idempotently)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from proletarian_ref import schema
from proletarian_ref.backends.dsn import dialect_of_dsn
from proletarian_ref.cli.database import Tables, add_database_options, given_dsn, open_database, tables_from
from proletarian_ref.cli.errors import CliError, ExitCode, UsageError
from proletarian_ref.cli.logs import notice
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.ops.stats import TableLocation, missing_tables, table_location
from proletarian_ref.side_tables import FEATURES, parse_features, side_table
from proletarian_ref.sql import DIALECTS
from proletarian_ref.tables import TableName


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("schema", help="print or install the job and archive tables")
    actions = parser.add_subparsers(dest="schema_action", metavar="{print,install}", required=True)

    printer = actions.add_parser(
        "print",
        help="print the DDL",
        description="Print the DDL. The dialect is --dialect, else the DSN's, else postgresql.",
    )
    printer.add_argument("--dialect", choices=DIALECTS, help="postgresql or mysql (default: from the DSN)")
    _add_with_option(printer)
    add_database_options(printer)
    printer.set_defaults(run=run_print)

    installer = actions.add_parser(
        "install",
        help="create the schema, tables and index if missing (safe to run again)",
        description="Create the schema, tables and index where missing; existing tables and rows are kept.",
    )
    add_database_options(installer)
    _add_with_option(installer)
    installer.set_defaults(run=run_install)


def _add_with_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--with",
        dest="with_features",
        metavar="FEATURES",
        help=f"also the optional side tables of these features, comma-separated: {', '.join(FEATURES)} "
        "(named <job table>_periodic_tick, <job table>_unique_key, <job table>_error; docs/periodic.md, "
        "docs/unique.md, docs/errors.md)",
    )


def _features(args: argparse.Namespace) -> list[str]:
    try:
        return parse_features(getattr(args, "with_features", None))
    except ConfigurationError as exc:
        raise UsageError(f"--with: {exc}") from exc


def render(statements: list[str]) -> str:
    return "".join(f"{statement};\n\n" for statement in statements).rstrip("\n") + "\n"


def run_print(args: argparse.Namespace) -> int:
    tables = tables_from(args)
    dialect = args.dialect
    if dialect is None:
        dsn, source = given_dsn(args)
        try:
            dialect = dialect_of_dsn(dsn) if dsn is not None else "postgresql"
        except ConfigurationError as exc:
            raise UsageError(f"{exc} (from {source}); or pass --dialect") from exc
    statements = schema.schema_statements(
        dialect, job_table=tables.job, archived_job_table=tables.archived, with_features=_features(args)
    )
    sys.stdout.write(f"-- proletarian-ref schema for {dialect}: {tables.job} and {tables.archived}\n\n")
    sys.stdout.write(render(statements))
    return ExitCode.OK


def run_install(args: argparse.Namespace) -> int:
    tables = tables_from(args)
    features = _features(args)
    with open_database(args, tables, check_schema=False) as db:
        conn = db.connect()
        try:
            missing = missing_tables(conn, tables.as_list, dialect=db.dialect)
            schema.install(
                conn,
                job_table=tables.job,
                archived_job_table=tables.archived,
                dialect=db.dialect,
                with_features=features,
            )
            located = [table_location(conn, table, dialect=db.dialect) for table in tables.as_list]
        finally:
            conn.close()
        sides = "".join(f", with {feature} ({side_table(tables.job, feature)})" for feature in features)
        notice(f"{installed_message(tables, located, created=missing)}{sides} on {db.describe()}")
    return ExitCode.OK


def installed_message(
    tables: Tables, located: list[TableLocation | None], *, created: list[TableName] | None = None
) -> str:
    """Which tables the install made (`created`, default both) and which were there already, by their real
    qualified names, and where they are.

    On MySQL `proletarian.job` is in the database `proletarian` whatever database the DSN names (the seed's
    DDL qualifies it), so the message says both rather than let the DSN suggest another place.
    """
    found = [where for where in located if where is not None]
    if len(found) != len(located):
        missing = [str(t) for t, where in zip(tables.as_list, located, strict=True) if where is None]
        raise CliError(f"the install ran but {' and '.join(missing)} cannot be found afterwards")
    made = tables.as_list if created is None else created
    named = {table: where.qualified(table) for table, where in zip(tables.as_list, found, strict=True)}
    new = " and ".join(named[t] for t in tables.as_list if t in made)
    kept = " and ".join(named[t] for t in tables.as_list if t not in made)
    if not kept:
        what = f"installed {new}"
    elif not new:
        what = f"{kept} already existed: nothing created, their rows kept"
    else:
        what = f"installed {new}; {kept} already existed, its rows kept"
    own = found[0].connection_database
    if found[0].schema is not None:
        schemas = _listed("schema", [where.schema or "" for where in found])
        return f"{what} ({schemas} of database `{found[0].database}`)"
    databases = [where.database for where in found]
    if own is None:
        return f"{what} ({_listed('database', databases)}; your DSN names no database)"
    if set(databases) == {own}:
        return f"{what} (database `{own}`, your DSN's)"
    return f"{what} ({_listed('database', databases)}; your DSN's database is `{own}`)"


def _listed(kind: str, names: list[str]) -> str:
    unique = list(dict.fromkeys(names))
    if len(unique) == 1:
        return f"{kind} `{unique[0]}`"
    return f"{kind}s " + " and ".join(f"`{name}`" for name in unique)
