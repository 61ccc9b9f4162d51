"""The MySQL backends' bounded claim: which statement claims, and the job table's index it forces.

Both MySQL backends (threaded and asyncio) claim with queries.sql's claim_bounded, for one job or a batch,
where their plan is not Proletarian's exact one, once they know the job table's
(queue, process_at) index; this module keeps what they found and gives them the statement's text. The
lookup itself is theirs to run (columns.sql, claim_index), on the connection the claim is about to use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Final

from proletarian_ref import sql
from proletarian_ref.backends.mysql_payload import statements as column_statements
from proletarian_ref.tables import TableName

_DIALECT: Final = "mysql"
# Each claim's LIMIT in the bounded statement: one job, or the batch's bound parameter.
_LIMITS: Final = {"get_next_job": "1", "get_next_jobs": "%(limit)s"}
# Index names the claim will write between backquotes: the server allows any character, but a name of
# these is all Proletarian's DDL or a hand-made index would give, and it cannot close its quotes.
_PLAIN_NAME: Final = re.compile(r"[A-Za-z0-9_$]{1,64}")


def lookup(job_table: TableName) -> tuple[str, dict[str, Any]]:
    """The statement and parameters that read the names of `job_table`'s (queue, process_at) indexes."""
    return column_statements()["claim_index"], {"job_schema": job_table.schema, "job_name": job_table.name}


def pick(rows: Iterable[Sequence[Any]]) -> str | None:
    """The index the claim forces, of the lookup's rows: the first with a plain name, else None."""
    for (name,) in rows:
        text = name.decode() if isinstance(name, bytes) else str(name)
        if _PLAIN_NAME.fullmatch(text):
            return text
    return None


@lru_cache(maxsize=256)
def statement(name: str, job_table: TableName, index: str | None) -> str:
    """Claim `name` (get_next_job or get_next_jobs) for `job_table`: bounded on `index`, or Proletarian's
    classic statement where the table has no such index."""
    if index is None:
        return sql.render(_DIALECT, name, job_table)
    if not _PLAIN_NAME.fullmatch(index):
        raise ValueError(f"index name {index!r} is not 1 to 64 of [A-Za-z0-9_$]")
    template = sql.queries(_DIALECT)["claim_bounded"]
    return template.format(job_table=job_table, claim_index=f"`{index}`", limit=_LIMITS[name])


class ClaimIndexes:
    """Per job table, the index its bounded claims force (None: the table has none, so they claim as
    Proletarian does). Shared by a backend's threads; forgotten when a claim finds its index gone."""

    def __init__(self) -> None:
        # Whole-value stores and a clear: atomic dict operations, so threads need no lock of their own.
        self._found: dict[TableName, str | None] = {}

    def statement(self, name: str, job_table: TableName) -> str | None:
        """Claim `name`'s text for `job_table`, or None while its index has not been looked up."""
        found = self._found
        if job_table not in found:
            return None
        return statement(name, job_table, found[job_table])

    def record(self, name: str, job_table: TableName, rows: Iterable[Sequence[Any]]) -> str:
        """Keep what the lookup's `rows` say of `job_table`, and return claim `name`'s text for it."""
        index = self._found[job_table] = pick(rows)
        return statement(name, job_table, index)

    def forget(self) -> None:
        """Look every table up again: an index was dropped or renamed."""
        self._found.clear()
