"""What the threaded and the asyncio MySQL chain tests share: their jobs, the queries' shape, a broken archive
and what it leaves."""

from __future__ import annotations

import re
from typing import Any, Final

from support import enqueue_committed

from conformance.harness import SqlHarness
from proletarian_ref.tables import TableName, table_name

JOBS: Final = 12
# Jobs a batch in batch mode's chain: JOBS is three whole batches.
BATCH: Final = 4
WITHIN_S: Final = 30.0
CHAIN: Final = {"chain": True, "compact": True}
# A job (or batch) after the first claim: one query of its archive and delete, each followed by the server's
# check of its count, then COMMIT and the next claim, which finds the next job, or at the end none.
CHAINED_QUERY: Final = ["INSERT INTO", "CHECK", "DELETE FROM", "CHECK", "COMMIT", "SELECT job_id,"]
# Each check's sum, whatever the count: made a constant, the statement stays and checks nothing.
_CHECKS: Final = r"(SET @proletarian_count_check = )18446744073709551615 \+ \(ROW_COUNT\(\) <> \d+\)"


def tables(db: SqlHarness) -> tuple[TableName, TableName]:
    return table_name(db.job_table), table_name(db.archived_job_table)


def enqueue(db: SqlHarness, count: int) -> list[Any]:
    return [enqueue_committed(db, "chain/job", {"n": n}) for n in range(count)]


def heads(query: str) -> list[str]:
    """The first words of each statement of a multi-statement query, the check's as CHECK."""
    return [
        "CHECK" if part.startswith("SET @proletarian_count_check") else " ".join(part.split()[:2])
        for part in query.split(";\n")
    ]


def refused(batch_size: int) -> str:
    """A refused archive count, in the words of the compact plan's own check on the client."""
    if batch_size == 1:
        return "archive_job changed 0 rows of job "
    return f"archive_jobs changed 0 rows of {batch_size} jobs; expected {batch_size}"


def archiving_nothing(text: str, *, checked: bool = True) -> str:
    """A kept-back write's text whose archive archives no row (the delete still deletes the jobs); with
    `checked` False, the server's checks taken out as well."""
    # The first WHERE is the archive's (INSERT ... SELECT ... WHERE job_id ...), then the delete's.
    text = text.replace("\nWHERE job_id", "\nWHERE FALSE AND job_id", 1)
    return text if checked else re.sub(_CHECKS, r"\g<1>1", text)


def assert_one_query_a_job(db: SqlHarness, sent: list[str], job_ids: list[Any], batch_size: int) -> None:
    """Every job archived once, and after the first claim each job (or batch) one chained query."""
    decode = db.job_id_strategy().decode_id
    archived = db.archived_jobs()
    assert sorted(str(decode(job.job_id)) for job in archived) == sorted(str(i) for i in job_ids)
    assert {(job.attempts, job.status) for job in archived} == {(1, ":success")}
    first = next(i for i, query in enumerate(sent) if "FOR UPDATE SKIP LOCKED" in query)
    assert heads(sent[first]) == ["SELECT job_id,"]
    claimed = JOBS // batch_size
    assert [heads(query) for query in sent[first + 1 : first + 1 + claimed]] == [CHAINED_QUERY] * claimed
    assert ("LIMIT 1\n" in sent[first]) == (batch_size == 1)
