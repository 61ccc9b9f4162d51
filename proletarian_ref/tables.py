"""Validated table names: the only way a name reaches SQL text, since drivers cannot bind identifiers."""

from __future__ import annotations

import functools
import re
from typing import Final, NamedTuple

from proletarian_ref.errors import ConfigurationError

DEFAULT_JOB_TABLE: Final = "proletarian.job"
DEFAULT_ARCHIVED_JOB_TABLE: Final = "proletarian.archived_job"

# Unquoted identifiers only: PostgreSQL folds them to lower case exactly as Proletarian's unquoted SQL
# does, so a name means the same table to both implementations. 63 is PostgreSQL's NAMEDATALEN - 1 and
# below MySQL's 64.
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class TableName(NamedTuple):
    """A table name, optionally schema-qualified, checked to be a plain SQL identifier.

    A tuple, so that hashing it (statements are cached by table name, once per statement run) costs no
    Python call.
    """

    schema: str | None
    name: str

    def __str__(self) -> str:
        return self.name if self.schema is None else f"{self.schema}.{self.name}"


def table_name(value: object, *, option: str = "job_table") -> TableName:
    """Validate `value` ("table" or "schema.table") for the option named `option`."""
    if isinstance(value, TableName):
        return value
    if type(value) is str:
        # enqueue checks its two table names on every call; a plain str always parses the same way.
        return _parsed(value, option)
    return _parse(value, option)


@functools.lru_cache(maxsize=256)
def _parsed(value: str, option: str) -> TableName:
    return _parse(value, option)


def _parse(value: object, option: str) -> TableName:
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{option} must be a str such as 'proletarian.job', not {type(value).__name__}"
        )
    parts = value.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ConfigurationError(
            f"{option}={value!r} is not a valid table name: use 'table' or 'schema.table', each part a "
            "letter or underscore then up to 62 letters, digits or underscores (no quotes, spaces or dots)"
        )
    if len(parts) == 2:
        return TableName(parts[0], parts[1])
    return TableName(None, parts[0])
