"""psycopg AsyncConnection's face on an asyncpg connection: what AsyncPostgresBackend's verbs use of one."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, NamedTuple, NoReturn

from proletarian_ref import sql
from proletarian_ref.backends.asyncpg_enqueue import numbered, translate
from proletarian_ref.errors import TransientDatabaseError


class Notify(NamedTuple):
    """One notification, as psycopg's Notify names its fields."""

    channel: str
    payload: str
    pid: int


class AsyncpgSession:
    """An asyncpg Connection (or a pool's connection proxy) seen as a psycopg AsyncConnection.

    As psycopg's default mode: unless `autocommit`, the first statement begins a transaction (asyncpg's
    own `transaction()`, so asyncpg's nested ones become savepoints in it) that commit() or rollback()
    ends. Every asyncpg error leaves as the library's (DatabaseError, TransientDatabaseError, ...), by
    SQLSTATE as PostgresBackend translates psycopg's. A session of a pool's connection gives it back on
    close(), once.
    """

    def __init__(self, raw: Any, *, autocommit: bool = False, pool: Any = None) -> None:
        self.raw = raw
        self.autocommit = autocommit
        self._pool = pool
        self._transaction: Any = None
        self._notifies: asyncio.Queue[Notify | None] | None = None

    # -- what AsyncPostgresBackend's transaction() and close() use ------------------------------------

    @property
    def closed(self) -> bool:
        return bool(self.raw.is_closed())

    broken = closed

    @property
    def info(self) -> AsyncpgSession:
        return self  # psycopg's conn.info.backend_pid

    @property
    def backend_pid(self) -> int:
        return int(self.raw.get_server_pid())

    @property
    def server_version(self) -> int:
        """As libpq numbers it (psycopg's conn.info.server_version): 150004 for 15.4."""
        version = self.raw.get_server_version()
        return int(version.major) * 10000 + int(version.minor)

    async def set_autocommit(self, value: bool) -> None:
        if self._transaction is not None:
            raise TransientDatabaseError("cannot change autocommit inside a transaction")
        self.autocommit = value

    async def ready(self) -> Any:
        """The asyncpg connection, in this session's transaction (begun here unless autocommit, or one
        the connection is already in)."""
        if not self.autocommit and self._transaction is None and not self.raw.is_in_transaction():
            # try/except, not translated(): this runs for every job, and a generator-based block costs more.
            try:
                transaction = self.raw.transaction()
                await transaction.start()
            except Exception as exc:
                _reraise(exc)
            self._transaction = transaction
        return self.raw

    async def commit(self) -> None:
        transaction, self._transaction = self._transaction, None
        if transaction is not None:
            try:  # as in ready()
                await transaction.commit()
            except Exception as exc:
                _reraise(exc)

    async def rollback(self) -> None:
        transaction, self._transaction = self._transaction, None
        if transaction is not None:
            with translated():
                await transaction.rollback()

    async def close(self) -> None:
        """Close the connection: at once in a transaction (the server rolls it back), else politely."""
        raw = self.raw
        if not raw.is_closed():
            if self._transaction is not None or raw.is_in_transaction():
                raw.terminate()
            else:
                try:
                    await raw.close(timeout=5)
                except Exception:
                    raw.terminate()
        self._transaction = None
        await self.release()

    async def release(self) -> None:
        """Give a pool's connection back (a closed one too: the pool replaces it); then nothing more."""
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                await pool.release(self.raw)

    def cursor(self, *args: Any, **kwargs: Any) -> AsyncpgCursor:
        return AsyncpgCursor(self)

    # -- LISTEN (asyncpg's add_listener), read as psycopg's notifies() ---------------------------------

    async def listen(self, channel: str) -> None:
        queue: asyncio.Queue[Notify | None] = asyncio.Queue()

        def received(_conn: Any, pid: int, channel: str, payload: str) -> None:
            queue.put_nowait(Notify(channel, payload, pid))

        with translated():
            await self.raw.add_listener(channel, received)
        # A connection the server ends (terminated, restarted) tells its waiter at once.
        self.raw.add_termination_listener(lambda _conn: queue.put_nowait(None))
        self._notifies = queue

    async def notifies(self, *, timeout: float) -> AsyncIterator[Notify]:
        """The notifications that come within `timeout` seconds, as psycopg's notifies(timeout=)."""
        queue = self._notifies
        if queue is None:
            raise TransientDatabaseError("notifies() on a session that LISTENs to nothing")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.raw.is_closed() and queue.empty():
                raise TransientDatabaseError("the listening connection is closed")
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                notify = await asyncio.wait_for(queue.get(), remaining)
            except TimeoutError:
                return
            if notify is None:
                raise TransientDatabaseError("the listening connection was closed by the server")
            yield notify


class AsyncpgCursor:
    """psycopg's AsyncCursor, enough of it: execute with %s / %(name)s parameters, then fetch the rows."""

    def __init__(self, session: AsyncpgSession) -> None:
        self._session = session
        self._rows: list[tuple[Any, ...]] = []
        self.rowcount = -1

    async def execute(self, statement: str, params: Any = None) -> AsyncpgCursor:
        raw = await self._session.ready()
        query, args = dollar(statement, params)
        with translated():
            if not args and ";" in statement.strip().rstrip(";"):
                # A script (asyncpg prepares one statement at a time): run as it is, no rows.
                self._rows, self.rowcount = [], -1
                await raw.execute(statement)
                return self
            prepared = await raw.prepare(query)
            self._rows = [tuple(record) for record in await prepared.fetch(*args)]
            self.rowcount = status_count(prepared.get_statusmsg())
        return self

    async def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    async def close(self) -> None:
        self._rows = []

    async def __aenter__(self) -> AsyncpgCursor:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


def dollar(statement: str, params: Any) -> tuple[str, Sequence[Any]]:
    """A psycopg statement and its parameters (a mapping for %(name)s, a sequence for %s, or None) as
    asyncpg takes them: $1, $2, ... and a sequence."""
    if params is None:
        return statement, ()
    if isinstance(params, dict):
        query, names = _numbered_named(statement)
        return query, [params[name] for name in names]
    return _numbered_positional(statement), params


# A worker sends the same few statements for every job: each is converted once, not once a statement.
@functools.lru_cache(maxsize=512)
def _numbered_named(statement: str) -> tuple[str, tuple[str, ...]]:
    text, names = sql.positional(statement)
    return numbered(text).replace("%%", "%"), names


@functools.lru_cache(maxsize=512)
def _numbered_positional(statement: str) -> str:
    return numbered(statement).replace("%%", "%")


def status_count(status: str) -> int:
    """The row count of a command status ("UPDATE 3", "INSERT 0 1"), -1 for one with none ("SAVEPOINT")."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else -1


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """asyncpg's exceptions (and a dropped socket's) as the library's, the driver's chained."""
    try:
        yield
    except Exception as exc:
        _reraise(exc)


def _reraise(exc: Exception) -> NoReturn:
    """Raise `exc` as the library's error (the driver's chained), or as it is if it has none."""
    error = translate(exc)
    if error is None:
        raise exc
    raise error from exc
