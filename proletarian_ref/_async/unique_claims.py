"""Unique keys claimed in the enqueuer's transaction: the side table's SQL store and the claim loop.

The source of both APIs' code: `python -m tools.generate_sync` makes proletarian_ref/_sync/unique_claims.py
(what proletarian_ref.enqueue runs) from this module (what proletarian_ref.aio.enqueue runs). The decisions
are unique.py's pure functions; the design is in its docstring and docs/unique.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, cast

from proletarian_ref import side_tables, unique
from proletarian_ref.backend import AsyncBackend
from proletarian_ref.errors import ConfigurationError, DatabaseError
from proletarian_ref.tables import TableName
from proletarian_ref.unique import (
    _FOUND,
    FEATURE,
    MemoryUniqueStore,
    UniqueKey,
    UniqueKeyHeldError,
    Until,
    decide,
    ordered_claims,
)


class AsyncSqlUniqueStore(side_tables.SqlStore):
    """UniqueStore over sql/<dialect>/unique.sql."""

    feature = FEATURE

    async def claim(self, conn: Any, key: str, job_id: Any, now: datetime) -> Any:
        params = {"unique_key": key, "job_id": job_id, "claimed_at": self._time(now)}
        if self.dialect == "mysql":
            await self._arun(conn, "claim", params, side_tables.acount)
            found = await self._arun(conn, "claim_holder", {"unique_key": key}, side_tables.arows)
        else:
            found = await self._arun(conn, "claim", params, side_tables.arows)
        if len(found) != 1:
            raise DatabaseError(f"claiming unique key {key!r} returned {len(found)} rows, not one")
        return found[0][0]

    async def holder_live(self, conn: Any, key: str, holder_id: Any, until: Until) -> bool:
        if until == "started":
            found = await self._arun(conn, "holder_waiting", {"job_id": holder_id}, side_tables.arows)
            return bool(found)
        if self.dialect != "mysql":
            found = await self._arun(conn, "holder_queued", {"job_id": holder_id}, side_tables.arows)
            return bool(found)
        found = await self._arun(conn, "holder_queued", {"unique_key": key}, side_tables.arows)
        # A snapshot older than the lock on the key row cannot tell: the key counts as held (the sound side).
        if len(found) != 1 or found[0][0] != holder_id:
            return True
        return found[0][1] is not None

    async def take_over(self, conn: Any, key: str, holder_id: Any, job_id: Any, now: datetime) -> None:
        params = {
            "unique_key": key,
            "job_id": job_id,
            "holder_id": holder_id,
            "claimed_at": self._time(now),
        }
        changed = await self._arun(conn, "take_over", params, side_tables.acount)
        if changed != 1:
            raise DatabaseError(f"taking over unique key {key!r} changed {changed} rows, not one")

    async def prune(self, conn: Any) -> int:
        """Delete the rows of free keys (their job is gone); how many. Never needed for correctness."""
        return await self._arun(conn, "prune", {}, side_tables.acount)


async def store_for(backend: AsyncBackend, conn: Any, job_table: TableName) -> unique.AsyncUniqueStore:
    """The backend's store for `job_table`'s side table, found to exist the first time it is asked for.

    A backend may bring its own store class as `unique_store` (a fork; the conformance suite's mutants).
    """
    own = getattr(backend, "unique_store", None)
    if own is not None:
        store: unique.AsyncUniqueStore = own(backend, job_table)
    elif backend.dialect == "memory":
        # Only the threaded API has a memory backend: the generated code's branch.
        store = cast(unique.AsyncUniqueStore, MemoryUniqueStore(backend, job_table))
    else:
        store = AsyncSqlUniqueStore(backend, job_table)
    found = (type(backend), job_table)
    if found not in _FOUND:
        if not await _side_table_exists(backend, conn, job_table):
            raise side_tables.missing_table_error(FEATURE, job_table)
        _FOUND.add(found)
    return store


async def _side_table_exists(backend: AsyncBackend, conn: Any, job_table: TableName) -> bool:
    if backend.dialect == "memory":
        return True
    query, params = side_tables.exists_query(backend.dialect, FEATURE, job_table)
    found = await side_tables.arun(backend, conn, query, params, side_tables.arows)
    return bool(found and found[0][0])


async def claim_keys(
    store: unique.AsyncUniqueStore,
    conn: Any,
    keys: Sequence[UniqueKey | None],
    new_ids: Sequence[Any],
    now: datetime,
    decode: Callable[[Any], Any],
) -> list[Any]:
    """Claim each job's key in the caller's transaction: per job, None (enqueue it) or the holder's id.

    `new_ids` are the stored ids the jobs will have. A key twice in one batch: the later job gets the
    earlier one's answer. A key held with conflict="raise" raises UniqueKeyHeldError, its job_id
    `decode`d from the stored id (the caller's
    transaction then holds the locks it took, and is the caller's to roll back).
    """
    if any(new_id is None for key, new_id in zip(keys, new_ids, strict=True) if key is not None):
        raise ConfigurationError(
            "unique_key needs job ids made before the INSERT: the database-generated id strategy cannot "
            "name its job in the unique key's row; use a UUID strategy"
        )
    answers: list[Any] = [None] * len(keys)
    seen: dict[str, Any] = {}
    for index, key in ordered_claims(keys):
        if key.key in seen:
            holder, held = seen[key.key], True
        else:
            holder = await store.claim(conn, key.key, new_ids[index], now)
            live = (
                None
                if holder == new_ids[index]
                else await store.holder_live(conn, key.key, holder, key.until)
            )
            decision = decide(new_ids[index], holder, live)
            if decision == "take_over":
                await store.take_over(conn, key.key, holder, new_ids[index], now)
                holder = new_ids[index]
            held = decision == "held"
            seen[key.key] = holder
        if held:
            if key.conflict == "raise":
                raise UniqueKeyHeldError(key.key, decode(holder))
            answers[index] = holder
    return answers


async def enqueued_before(
    conn: Any,
    backend: AsyncBackend,
    job_table: TableName,
    decode: Callable[[Any], Any],
    now: datetime,
    keys: Sequence[UniqueKey | None],
    new_ids: Sequence[Any],
) -> list[Any]:
    """enqueue's hook: claim the keys of jobs about to be inserted; per job None, or the live holder's id.

    Called before the INSERT, in the caller's transaction, with the checked keys and the jobs' stored ids;
    a job answered with an id is not to be inserted.
    """
    if all(key is None for key in keys):
        return [None] * len(keys)
    store = await store_for(backend, conn, job_table)
    held = await claim_keys(store, conn, keys, new_ids, now, decode)
    return [None if holder is None else decode(holder) for holder in held]
