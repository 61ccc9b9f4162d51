"""Unique jobs: at most one live job per key, the key held in a side table in the enqueuer's transaction.

The design (docs/unique.md): the side table `<job_table>_unique_key` has one row per key naming the job
that holds it, and a key counts as held only while that job is still in the job table. An enqueue locks
the key's row (inserting it if there is none), reads whether its job is still queued, and either answers
with that job or gives the key to its own new job, all in the caller's transaction: a rollback leaves no
key, and concurrent enqueues of one key queue on the row lock. Whoever archives the job (this library's
worker, or a Clojure worker that knows nothing of the side table) frees the key by deleting the job row,
so the archive transaction needs nothing new.

The decisions are pure functions (`unique_key_of`, `decide`, `ordered_claims`); the statements go through
a UniqueStore. The SQL store and the claim loop (`SqlUniqueStore`, `claim_keys`, `enqueued_before`) are
written once, as asyncio code, in proletarian_ref/_async/unique_claims.py; the threaded ones are generated
from it into proletarian_ref/_sync/unique_claims.py (tools/generate_sync.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple, Protocol

from proletarian_ref import side_tables
from proletarian_ref.backends.memory import _DELETED
from proletarian_ref.errors import ConfigurationError, DatabaseError, ProletarianError
from proletarian_ref.tables import TableName

Conflict = Literal["existing", "raise"]
Until = Literal["archived", "started"]
MAX_KEY_LENGTH: Final = 255  # MySQL's VARCHAR(255) primary key; the same limit everywhere
FEATURE: Final = "unique"


class UniqueKey(NamedTuple):
    """A job's unique key and what a second enqueue of it does; a plain str is UniqueKey(str).

    `conflict`: "existing" returns the id of the job holding the key (nothing is enqueued), "raise"
    raises UniqueKeyHeldError naming it. `until`: the key is held while its job is in the job table
    ("archived": queued, running or waiting for a retry), or only while it waits to start ("started":
    a job a worker has claimed no longer holds it, so the next enqueue gets a new job at once).
    """

    key: str
    conflict: Conflict = "existing"
    until: Until = "archived"


class UniqueKeyHeldError(ProletarianError):
    """enqueue with UniqueKey(conflict="raise") found the key held by a live job, `job_id`."""

    def __init__(self, key: str, job_id: Any) -> None:
        super().__init__(f"unique key {key!r} is held by job {job_id}, which is still in the job table")
        self.key = key
        self.job_id = job_id


def unique_key_of(value: object) -> UniqueKey:
    """`value` (a str or UniqueKey) checked: a non-empty key of at most 255 characters and known options."""
    key = UniqueKey(value) if isinstance(value, str) else value
    if not isinstance(key, UniqueKey):
        raise ConfigurationError(f"unique_key must be a str or a UniqueKey, not {type(value).__name__}")
    if not isinstance(key.key, str) or not 1 <= len(key.key) <= MAX_KEY_LENGTH:
        raise ConfigurationError(f"unique key {key.key!r} must be a str of 1 to {MAX_KEY_LENGTH} characters")
    if key.conflict not in ("existing", "raise"):
        raise ConfigurationError(f"UniqueKey.conflict must be 'existing' or 'raise', not {key.conflict!r}")
    if key.until not in ("archived", "started"):
        raise ConfigurationError(f"UniqueKey.until must be 'archived' or 'started', not {key.until!r}")
    return key


Decision = Literal["claimed", "take_over", "held"]


def decide(new_id: Any, holder_id: Any, holder_live: bool | None) -> Decision:
    """What an enqueue does once it holds the key's row lock.

    `holder_id` is the job the row names (`new_id` when the claim inserted the row); `holder_live`
    whether that job still holds the key (None: not asked, as the row is the new job's).
    """
    if holder_id == new_id:
        return "claimed"
    return "held" if holder_live else "take_over"


def ordered_claims(keys: Sequence[UniqueKey | None]) -> list[tuple[int, UniqueKey]]:
    """The positions of the keyed jobs of a batch in the order their rows are locked: by key text.

    One order for every batch, so two batches locking the same keys cannot each wait for the other.
    """
    keyed = [(index, key) for index, key in enumerate(keys) if key is not None]
    return sorted(keyed, key=lambda item: (item[1].key, item[0]))


class UniqueStore(Protocol):
    """The side table's three statements on the caller's connection, inside its transaction."""

    def claim(self, conn: Any, key: str, job_id: Any, now: datetime) -> Any:
        """Lock the key's row, inserting it for `job_id` if there is none; the stored id it names."""
        ...

    def holder_live(self, conn: Any, key: str, holder_id: Any, until: Until) -> bool:
        """Whether `holder_id` (named by the locked row) still holds the key."""
        ...

    def take_over(self, conn: Any, key: str, holder_id: Any, job_id: Any, now: datetime) -> None:
        """Give the locked key row, held by the gone `holder_id`, to `job_id`."""
        ...


class AsyncUniqueStore(Protocol):
    """UniqueStore, awaited: the side table's statements on a caller's asyncio connection."""

    async def claim(self, conn: Any, key: str, job_id: Any, now: datetime) -> Any: ...

    async def holder_live(self, conn: Any, key: str, holder_id: Any, until: Until) -> bool: ...

    async def take_over(self, conn: Any, key: str, holder_id: Any, job_id: Any, now: datetime) -> None: ...


class MemoryUniqueStore:
    """The in-memory twin of the side table: the executable specification of the three statements.

    Rows live in the MemoryDatabase beside the jobs, under the side table's name; a row lock another
    transaction holds raises TransientDatabaseError where a database would wait (as the memory backend's
    own writes do), so the caller rolls back and tries again.
    """

    def __init__(self, backend: Any, job_table: TableName) -> None:
        self.db = backend.db
        self.job_table = str(job_table)
        self.table = str(side_tables.side_table(job_table, FEATURE))

    def claim(self, conn: Any, key: str, job_id: Any, now: datetime) -> Any:
        with self.db.lock:
            conn.check_alive()
            conn._lock_row(self.table, key)
            row = conn._get(self.table, key)
            if row is None:
                conn._write(self.table, key, (job_id, now))
                return job_id
            return row[0]

    def holder_live(self, conn: Any, key: str, holder_id: Any, until: Until) -> bool:
        with self.db.lock:
            conn.check_alive()
            if conn._get(self.job_table, holder_id) is None:
                return False
            if until == "archived":
                return True
            owner = self.db.row_locks.get((self.job_table, holder_id))
            if owner is not None and owner is not conn:
                return False  # a worker holds it: the job has started
            conn._lock_row(self.job_table, holder_id)
            return True

    def take_over(self, conn: Any, key: str, holder_id: Any, job_id: Any, now: datetime) -> None:
        with self.db.lock:
            conn.check_alive()
            row = conn._get(self.table, key)
            if row is None or row[0] != holder_id:
                raise DatabaseError(f"taking over unique key {key!r} changed 0 rows, not one")
            conn._write(self.table, key, (job_id, now))

    def prune(self, conn: Any) -> int:
        with self.db.lock:
            conn.check_alive()
            keys = set(self.db.tables.get(self.table, {})) | set(conn._changes.get(self.table, {}))
            deleted = 0
            for key in keys:
                row = conn._get(self.table, key)
                if row is not None and conn._get(self.job_table, row[0]) is None:
                    conn._lock_row(self.table, key)
                    conn._write(self.table, key, _DELETED)
                    deleted += 1
            return deleted


# Side tables found once per process for each (backend class, job table): an enqueue asks only the first time.
_FOUND: set[tuple[type, TableName]] = set()
