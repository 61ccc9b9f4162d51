"""Deliberately broken asyncio backends, each wrong in one way, and the suite tests that must catch each."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from mutants import Mutant, _rewrite

from proletarian_ref.backend import JobRecord
from proletarian_ref.backends.postgres_async import AsyncPostgresBackend
from proletarian_ref.tables import TableName


class AsyncCommitBeforeHandler(AsyncPostgresBackend):
    """Commits the claim at once, so the row lock is gone while the handler runs."""

    async def get_next_job(
        self, conn: Any, job_table: TableName, queue: str, now: datetime
    ) -> JobRecord | None:
        job = await super().get_next_job(conn, job_table, queue, now)
        await conn.commit()
        return job


class AsyncClaimWithoutSkipLocked(AsyncPostgresBackend):
    """Claims with FOR UPDATE alone (its codec's statement rewritten): a second worker waits for the first."""

    def __init__(self, data_source: Any = None, *, compact: bool = False) -> None:
        super().__init__(data_source, compact=compact)
        self.codec = _rewrite("get_next_job", "FOR UPDATE SKIP LOCKED", "FOR UPDATE")(None)


class AsyncArchiveWithoutDelete(AsyncPostgresBackend):
    """Archives, but never deletes: the job stays queued after it finished."""

    async def delete_job(self, conn: Any, job_table: TableName, job_id: Any) -> None:
        return None


class AsyncSavepointKeepsWrites(AsyncPostgresBackend):
    """Batch mode's savepoint does nothing: a failed job whose failed_job_fn raises keeps its archive."""

    @contextlib.asynccontextmanager
    async def savepoint(self, conn: Any) -> AsyncIterator[None]:
        yield


class AsyncNeverCommits(AsyncPostgresBackend):
    """The transaction rolls back where it should commit: no job is ever archived or retried."""

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with super().transaction() as conn:
            yield conn
            await conn.rollback()


POSTGRESQL_ASYNC_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "aio_commit_before_handler",
        "the async claim commits at once, so the handler runs without the row lock",
        AsyncCommitBeforeHandler,
        ("S5", "P1"),
    ),
    Mutant(
        "aio_claim_without_skip_locked",
        "the async claim locks without SKIP LOCKED: a second worker waits for the first",
        AsyncClaimWithoutSkipLocked,
        ("S5", "S6"),
    ),
    Mutant(
        "aio_archive_without_delete",
        "the async delete_job does nothing",
        AsyncArchiveWithoutDelete,
        ("A3", "D1", "P1"),
    ),
    Mutant(
        "aio_batch_savepoint_keeps_writes",
        "the async savepoint rolls nothing back, so a failed job's undone writes commit",
        AsyncSavepointKeepsWrites,
        ("T3",),
        batch_size=8,
    ),
    Mutant(
        "aio_never_commits",
        "the async transaction rolls back at its end: nothing a job wrote stays",
        AsyncNeverCommits,
        ("A1", "P1"),
    ),
)


def _on_asyncpg(mutant: Mutant) -> Mutant:
    """The same mistake on AsyncpgBackend: the mutant's override first, then asyncpg's connections."""
    from proletarian_ref.backends.asyncpg_backend import AsyncpgBackend

    backend_class = type(
        f"Asyncpg{mutant.backend_class.__name__}", (mutant.backend_class, AsyncpgBackend), {}
    )
    return dataclasses.replace(mutant, name=f"asyncpg_{mutant.name}", backend_class=backend_class)


# Not the claim without SKIP LOCKED: its rewritten codec is psycopg's, whose times asyncpg does not bind.
ASYNCPG_MUTANTS: tuple[Mutant, ...] = tuple(
    _on_asyncpg(mutant)
    for mutant in POSTGRESQL_ASYNC_MUTANTS
    if mutant.name != "aio_claim_without_skip_locked"
)
