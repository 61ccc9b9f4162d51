"""Installing the seed's DDL (sql/<dialect>/schema.sql), with custom table names where asked."""

from __future__ import annotations

import re
from typing import Any, Final

from proletarian_ref.backends import dialect_of_connection
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.side_tables import install_statements
from proletarian_ref.sql import read_sql_file
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE, TableName, table_name

_DEFAULT_JOB: Final = table_name(DEFAULT_JOB_TABLE)
_DEFAULT_ARCHIVED: Final = table_name(DEFAULT_ARCHIVED_JOB_TABLE)


def _split_statements(text: str) -> list[str]:
    # The DDL has no string literals or semicolons in comments, so a statement ends at a ';' that ends
    # a line.
    return [s.strip() for s in re.split(r";\s*$", text, flags=re.MULTILINE) if s.strip()]


def index_name(job_table: TableName) -> str:
    """`<table>_queue_process_at`: for the default table that is the seed's job_queue_process_at."""
    return f"{job_table.name}_queue_process_at"


def schema_statements(
    dialect: str,
    *,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    with_features: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """The DDL statements for `dialect`, the seed's text with the table names replaced.

    `with_features` ("periodic", "unique") adds the CREATE TABLE of those optional side tables, named
    beside the job table (proletarian_ref.side_tables); without it the seed's DDL alone, as before.
    """
    return _seed_statements(dialect, job_table, archived_job_table) + install_statements(
        dialect, list(with_features), job_table
    )


def _seed_statements(
    dialect: str, job_table: str | TableName, archived_job_table: str | TableName
) -> list[str]:
    job = table_name(job_table, option="job_table")
    archived = table_name(archived_job_table, option="archived_job_table")
    if job == archived:
        raise ConfigurationError(f"job_table and archived_job_table must differ, both are {job}")
    statements = _split_statements(read_sql_file(dialect, "schema.sql"))
    if (job, archived) == (_DEFAULT_JOB, _DEFAULT_ARCHIVED):
        return statements
    rendered: list[str] = []
    schemas = sorted({t.schema for t in (job, archived) if t.schema is not None})
    for statement in statements:
        if statement.startswith(("CREATE SCHEMA", "CREATE DATABASE")):
            keyword = statement.split()[1]
            rendered.extend(f"CREATE {keyword} IF NOT EXISTS {schema}" for schema in schemas)
            continue
        # The lookahead spares "proletarian.job/enqueue!" in the seed's column comment.
        text = re.sub(r"\bproletarian\.archived_job\b", str(archived), statement)
        text = re.sub(r"\bproletarian\.job\b(?=[\s(]|$)", str(job), text)
        if statement.startswith("DROP INDEX"):
            qualified = index_name(job) if job.schema is None else f"{job.schema}.{index_name(job)}"
            text = f"DROP INDEX IF EXISTS {qualified}"
        elif statement.startswith("CREATE INDEX"):
            text = text.replace(f"INDEX {index_name(_DEFAULT_JOB)} ", f"INDEX {index_name(job)} ")
        rendered.append(text)
    return rendered


def install(
    conn: Any,
    *,
    job_table: str | TableName = DEFAULT_JOB_TABLE,
    archived_job_table: str | TableName = DEFAULT_ARCHIVED_JOB_TABLE,
    dialect: str | None = None,
    with_features: list[str] | tuple[str, ...] = (),
) -> None:
    """Create the schema, both tables and the index on `conn` and commit; safe to run again.

    `with_features` also creates those side tables (schema_statements).

    A qualified name is taken as it is: on MySQL the default `proletarian.job` goes to the database
    `proletarian`, whatever database `conn` uses, as Proletarian's DDL puts it.
    """
    statements = schema_statements(
        dialect if dialect is not None else dialect_of_connection(conn),
        job_table=job_table,
        archived_job_table=archived_job_table,
        with_features=with_features,
    )
    with conn.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    conn.commit()
