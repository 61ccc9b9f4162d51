"""Loads the named SQL blocks of sql/<dialect>/ and renders them with validated table names."""

from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Final

from proletarian_ref.errors import ConfigurationError
from proletarian_ref.tables import TableName

DIALECTS: Final = ("postgresql", "mysql")
_NAME_LINE: Final = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)
# A row of a multi-row VALUES list: positional placeholders only, so a row can never carry a value.
_ROW_TEMPLATE: Final = re.compile(r"\(%s(?:, %s)*\)")
_NAMED_PLACEHOLDER: Final = re.compile(r"%\(([a-z_]+)\)s")


def sql_dir(dialect: str) -> Traversable:
    """The folder of a dialect's SQL: inside the installed wheel, or the repository's sql/ in a checkout."""
    if dialect not in DIALECTS:
        raise ConfigurationError(f"unknown SQL dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
    packaged = resources.files("proletarian_ref") / "sql" / dialect
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "sql" / dialect


def read_sql_file(dialect: str, filename: str) -> str:
    return (sql_dir(dialect) / filename).read_text(encoding="utf-8")


def parse_named_blocks(text: str) -> dict[str, str]:
    """Split `-- name: x` blocks; a block's leading comment lines are its documentation, not its SQL."""
    blocks: dict[str, str] = {}
    matches = list(_NAME_LINE.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end() : end]
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";").strip()
        if match.group(1) in blocks:
            raise ValueError(f"SQL block {match.group(1)!r} is defined twice")
        blocks[match.group(1)] = statement
    return blocks


@cache
def queries(dialect: str) -> dict[str, str]:
    return parse_named_blocks(read_sql_file(dialect, "queries.sql"))


@cache
def sessions(dialect: str) -> dict[str, str]:
    """What a worker asks of the server's sessions, on a session of its own (sql/<dialect>/sessions.sql)."""
    return parse_named_blocks(read_sql_file(dialect, "sessions.sql"))


@lru_cache(maxsize=256)
def positional(statement: str) -> tuple[str, tuple[str, ...]]:
    """`statement` with each %(name)s placeholder as %s, and the names in the order they come.

    Both drivers bind a tuple for less than a dict of the same values, and send the same statement.
    """
    return _NAMED_PLACEHOLDER.sub("%s", statement), tuple(_NAMED_PLACEHOLDER.findall(statement))


@lru_cache(maxsize=256)
def render(dialect: str, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
    """The statement `name` with table names filled in; only TableName values can get here."""
    template = queries(dialect)[name]
    return template.format(job_table=job_table, archived_job_table=archived_job_table)


@lru_cache(maxsize=64)
def render_rows(dialect: str, name: str, job_table: TableName, rows: int) -> str:
    """The multi-row statement `name` with `rows` copies of the block `<name>_row` as its VALUES list.

    The row block must be a parenthesised list of positional placeholders, so every value stays a bound
    parameter; its parameters are the rows' values one after another.
    """
    statements = queries(dialect)
    row = statements[f"{name}_row"]
    if not _ROW_TEMPLATE.fullmatch(row):
        raise ValueError(f"SQL block {name}_row must be placeholders such as (%s, %s), not {row!r}")
    if rows < 1:
        raise ValueError(f"a multi-row statement needs at least one row, not {rows}")
    return statements[name].format(job_table=job_table, rows=", ".join([row] * rows))


@lru_cache(maxsize=256)
def render_ids(
    dialect: str, name: str, job_table: TableName, archived_job_table: TableName | None, count: int
) -> str:
    """The statement `name` with tables filled in and {ids} as `count` positional placeholders."""
    if count < 1:
        raise ValueError(f"an id list needs at least one id, not {count}")
    return queries(dialect)[name].format(
        job_table=job_table, archived_job_table=archived_job_table, ids=", ".join(["%s"] * count)
    )


def render_channel(dialect: str, name: str, channel: str) -> str:
    """The statement `name` with {channel}: a notification channel made of identifier characters, quoted."""
    if not re.fullmatch(r"[a-z0-9_.]{1,63}", channel):
        raise ValueError(f"notification channel {channel!r} is not 1 to 63 of [a-z0-9_.]")
    return queries(dialect)[name].format(channel=f'"{channel}"')
