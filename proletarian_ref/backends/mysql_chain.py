"""The MySQL backend's chained plan: a finished job's checked writes, COMMIT and next claim in one query.

MySQLBackend(chain=True) keeps a finished job's archive_job and delete_job back (a Deferred) rather than send
them when the worker asks, and sends them with the COMMIT and the next claim as one multi-statement query:
one round trip a job. Their row counts come back only after the COMMIT has run, so the server checks each
itself (sql/mysql/queries.sql, chain_check_count): a wrong count stops the query before its COMMIT, and the
client reports it in its own check's words. Kept back writes that do not go with a chain (the worker stops,
or another statement comes first) go alone, checked the same way, before anything else runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Final

from proletarian_ref import sql
from proletarian_ref.backends import mysql_driver
from proletarian_ref.backends._dbapi import _wrong_batch_count, _wrong_count
from proletarian_ref.errors import DatabaseError
from proletarian_ref.tables import TableName

# "BIGINT UNSIGNED value is out of range": what chain_check_count raises for a count other than expected.
_WRONG_COUNT: Final = 1690
_DIALECT: Final = "mysql"

# Writes one parameter value as SQL text, as the driver's cursor would bind it.
Quote = Callable[[Any], str]


class Deferred:
    """A job's (or a batch's) archive and delete, with their server-side checks, as the SQL text to send."""

    __slots__ = ("job_id", "jobs", "text", "writes")

    def __init__(self, text: str, writes: tuple[str, str], job_id: Any = None, jobs: int = 0) -> None:
        self.text = text
        # The statements' names, as the client's own count check names them.
        self.writes = writes
        self.job_id = job_id  # one job's id; None for a batch of `jobs`
        self.jobs = jobs

    def check(self, cursor: Any) -> None:
        """Read the writes' results on `cursor`, which has just sent the text: raise DatabaseError, in the
        words of the client's own check, if the server refused a count. Leaves the cursor at the last
        check's result, so that the next result read is the statement sent after them."""
        for what in self.writes:
            count = int(cursor.rowcount)
            try:
                cursor.nextset()  # the check's result: its OK, or its error
            except mysql_driver.error_classes() as exc:
                if exc.args and exc.args[0] == _WRONG_COUNT:
                    raise self._wrong(count, what) from exc
                raise
            if what == self.writes[0]:
                cursor.nextset()  # the next write's result

    async def acheck(self, cursor: Any) -> None:
        """check() on an asyncio cursor (aiomysql's), whose nextset is awaited."""
        for what in self.writes:
            count = int(cursor.rowcount)
            try:
                await cursor.nextset()
            except mysql_driver.error_classes() as exc:
                if exc.args and exc.args[0] == _WRONG_COUNT:
                    raise self._wrong(count, what) from exc
                raise
            if what == self.writes[0]:
                await cursor.nextset()

    def _wrong(self, count: int, what: str) -> DatabaseError:
        if self.job_id is not None:
            return _wrong_count(count, what, self.job_id)
        return _wrong_batch_count(count, what, self.jobs)


@cache
def _check() -> str:
    return sql.queries(_DIALECT)["chain_check_count"]


def commit_statement() -> str:
    return sql.queries(_DIALECT)["chain_commit"]


def literal(quote: Quote, statement: str, params: Any) -> str:
    """`statement` with its parameters written in by `quote` (mysql_driver.quote: PyMySQL's escape,
    mysqlclient's literal; or the asyncio backend's byte-for-byte twin of PyMySQL's) as cursor.execute
    writes them (a dict for %(name)s placeholders, a sequence for %s), so that it can go in one query with
    others."""
    if isinstance(params, dict):
        return statement % {key: quote(value) for key, value in params.items()}
    return statement % tuple(quote(value) for value in params)


def deferred_job(
    quote: Quote,
    statements: Any,
    job_table: TableName,
    archived_job_table: TableName,
    params: dict[str, Any],
) -> Deferred:
    """archive_job and delete_job of one job (`params`: job_id, status, finished_at), each checked."""
    text = ";\n".join(
        (
            statements["archive_job", job_table, archived_job_table],
            _check(),
            statements["delete_job", job_table, None],
            _check(),
        )
    )
    return Deferred(
        literal(quote, text, {**params, "count": 1}), ("archive_job", "delete_job"), job_id=params["job_id"]
    )


def deferred_batch(
    quote: Quote,
    job_table: TableName,
    archived_job_table: TableName,
    job_ids: Sequence[Any],
    status: str,
    finished_at: Any,
) -> Deferred:
    """archive_jobs and delete_jobs of a batch, each checked for one row a job."""
    count = len(job_ids)
    check = sql.positional(_check())[0]
    text = ";\n".join(
        (
            sql.render_ids(_DIALECT, "archive_jobs", job_table, archived_job_table, count),
            check,
            sql.render_ids(_DIALECT, "delete_jobs", job_table, None, count),
            check,
        )
    )
    params = [status, finished_at, *job_ids, count, *job_ids, count]
    return Deferred(literal(quote, text, params), ("archive_jobs", "delete_jobs"), jobs=count)
