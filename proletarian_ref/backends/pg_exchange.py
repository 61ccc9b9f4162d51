"""One exchange on a psycopg AsyncConnection in libpq's pipeline mode: every statement sent with one flush.

AsyncPostgresBackend(pipeline=True) sends a job's statements (a chain's checked archive, COMMIT AND CHAIN
and claim) through here rather than through psycopg's own pipeline mode, which flushes every statement as it
is queued and costs the client about as much CPU a job as the server's work (docs/benchmarks.md, limit9).
Only the backend's own statements go this way, and only on connections the backend opened itself: libpq
enters pipeline mode for the exchange and leaves it before it returns, so psycopg, the handler and anything
else on the connection see it as it was, in the transaction the exchange left it in.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from functools import lru_cache
from typing import Any, Final

import psycopg
from psycopg import pq
from psycopg.abc import Transformer as TransformerLike
from psycopg.adapt import PyFormat, Transformer
from psycopg.errors import error_from_result

# %(name)s or %s, the placeholders of sql/postgresql/queries.sql; no statement there has a literal %.
_PLACEHOLDER: Final = re.compile(r"%\((\w+)\)s|%s")
_PREFIX: Final = "_proletarian_"
# A prepared statement the server no longer has (a handler's DISCARD ALL or DEALLOCATE): forgotten here too.
_UNKNOWN_STATEMENT: Final = "26000"


class Command:
    """A statement of an exchange and, after it, its result."""

    __slots__ = ("params", "result", "statement")

    def __init__(self, statement: str, params: Any = None) -> None:
        self.statement = statement
        self.params = params
        self.result: pq.abc.PGresult | None = None

    @property
    def rowcount(self) -> int:
        """Rows the statement changed or returned (-1 before the exchange, as a psycopg cursor's)."""
        if self.result is None:
            return -1
        count = self.result.command_tuples
        return -1 if count is None else int(count)


@lru_cache(maxsize=256)
def numbered(statement: str) -> tuple[bytes, tuple[str, ...] | int]:
    """The statement with $1, $2... for its placeholders, and its parameters' names in that order (named
    placeholders) or how many there are (positional ones)."""
    names: list[str] = []
    positional = 0

    def number(match: re.Match[str]) -> str:
        nonlocal positional
        if match.group(1) is None:
            positional += 1
            return f"${positional}"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = _PLACEHOLDER.sub(number, statement)
    if names and positional:
        raise ValueError("a statement mixes named and positional placeholders")
    return text.encode(), tuple(names) if names else positional


def _text(value: Any, transformer: TransformerLike) -> bytes | None:
    # As psycopg sends them: str untyped, so the server infers each parameter's type from the statement.
    if value is None:
        return None
    if type(value) is str:
        return value.encode()
    if type(value) is uuid.UUID or type(value) is int:
        return str(value).encode()
    dumped = transformer.get_dumper(value, PyFormat.TEXT).dump(value)
    return None if dumped is None else bytes(dumped)


def parameters(statement: str, params: Any, transformer: TransformerLike) -> tuple[bytes, list[bytes | None]]:
    """The numbered statement and its parameters as text, from a dict (named) or a sequence (positional)."""
    text, names = numbered(statement)
    if isinstance(names, tuple):
        values: Sequence[Any] = [params[name] for name in names]
    else:
        values = params if params is not None else ()
        if len(values) != names:
            raise ValueError(f"the statement has {names} placeholders and {len(values)} parameters")
    return text, [_text(value, transformer) for value in values]


class Session:
    """What the exchanges keep for one connection: its prepared statements, its row loader, and the event
    loop's watch on its socket (read_input)."""

    __slots__ = (
        "__weakref__",
        "_close_fd",
        "_fd",
        "_loop",
        "_pgconn",
        "_waiter",
        "loader",
        "named",
        "prepared",
    )

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.prepared: dict[bytes, bytes] = {}
        self.loader: TransformerLike = Transformer.from_context(conn)
        # Names are never reused: a statement forgotten here may still be prepared on the server.
        self.named = 0
        self._pgconn = conn.pgconn
        # The socket under a number of its own, so that psycopg's own waits on the connection (which add
        # and remove a reader on libpq's number) never touch the watch kept between exchanges. Closed by
        # close(), or when the session is collected if close() was never called (it is not watched then);
        # by socket's dup and close, as a socket is not a C file descriptor everywhere (Windows).
        self._fd = socket.dup(conn.pgconn.socket)
        self._close_fd = weakref.finalize(self, socket.close, self._fd)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def watching(self) -> bool:
        """Whether the event loop watches the socket for this session now."""
        return self._loop is not None

    async def read_input(self) -> None:
        """Wait for the server's data and read it into libpq's buffer (an exchange's, under its lock).

        The loop watches the socket from the first wait to close(), not once a wait: adding and removing a
        watch costs a system call each and asyncio's bookkeeping, on every exchange. The data is read as
        soon as the loop sees it, so that the loop's next look finds the socket empty rather than waking
        the next exchange's wait for nothing.
        """
        # The loop it watches on, once watching: asking for the running loop costs a system call (a check
        # for a fork), and a psycopg connection is used on one loop (its lock is bound to it).
        loop = self._loop
        if loop is None:
            loop = asyncio.get_running_loop()
            loop.add_reader(self._fd, self._readable)
            self._loop = loop
        self._waiter = waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is None:
            # Data for no exchange (psycopg's own statement, a notice, the server closing): left for its
            # reader, and not watched until the next exchange, rather than wake the loop at every turn.
            self._unwatch()
        elif not waiter.done():
            try:
                self._pgconn.consume_input()
            except psycopg.Error as exc:
                waiter.set_exception(exc)
            else:
                waiter.set_result(None)

    def _unwatch(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)

    def close(self) -> None:
        """Stop watching the socket and close this session's number for it (the connection is not closed)."""
        if self._close_fd.alive:
            self._unwatch()
            self._close_fd()


async def exchange(conn: psycopg.AsyncConnection[Any], session: Session, commands: Sequence[Command]) -> None:
    """Send `commands` in one pipeline with one Sync, read every result back, and leave pipeline mode.

    Every statement is prepared on the connection the first time (named, in the same exchange), BEGIN and
    COMMIT too: a chain sends them with every job, and the server then parses none of them again. So the
    statements are a fixed set (the backend's SQL files), their values bound. The first statement the
    server refused is raised as psycopg's error, once every result is in and the connection is out of
    pipeline mode (the statements after it did nothing, and the transaction is failed, for the caller to
    roll back). Anything else that goes wrong (a cancellation, a broken connection) leaves the connection
    unusable: it is closed before the error goes on.
    """
    pgconn = conn.pgconn
    async with conn.lock:
        pgconn.enter_pipeline_mode()
        try:
            # What each result answers: a command, or the name of a statement being prepared.
            answers: list[Command | bytes] = []
            for command in commands:
                if command.params is None:
                    text, values = command.statement.encode(), None
                else:
                    text, values = parameters(command.statement, command.params, session.loader)
                name = session.prepared.get(text)
                if name is None:
                    name = f"{_PREFIX}{session.named}".encode()
                    session.named += 1
                    pgconn.send_prepare(name, text)
                    answers.append(name)
                    session.prepared[text] = name
                pgconn.send_query_prepared(name, values)
                answers.append(command)
            pgconn.pipeline_sync()
            results = await read_results(pgconn, len(answers), session.read_input)
            pgconn.exit_pipeline_mode()
        except BaseException:
            session.prepared.clear()
            session.close()
            await _close_quietly(conn)
            raise
    refused: pq.abc.PGresult | None = None
    for answer, result in zip(answers, results, strict=True):
        status = result.status
        if isinstance(answer, Command):
            answer.result = result
        elif status != pq.ExecStatus.COMMAND_OK:
            # Not prepared after all (the server refused it, or skipped it after an earlier error).
            session.prepared = {text: name for text, name in session.prepared.items() if name != answer}
        if status == pq.ExecStatus.FATAL_ERROR and refused is None:
            refused = result
    if refused is not None:
        error = error_from_result(refused, encoding=conn.info.encoding)
        if error.sqlstate == _UNKNOWN_STATEMENT:
            session.prepared.clear()
        raise error


async def read_results(
    pgconn: Any, count: int, read_input: Callable[[], Awaitable[None]]
) -> list[pq.abc.PGresult]:
    """The `count` results of a pipeline, up to and including its Sync's, waiting on the event loop
    (`read_input` until more of them is read)."""
    while pgconn.flush():
        await _writable(pgconn.socket)
    results: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            await read_input()
        result = pgconn.get_result()
        if result is None:
            continue  # the end of one statement's results
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            if len(results) != count:
                raise psycopg.InternalError(f"{count} statements in a pipeline, {len(results)} results")
            return results
        results.append(result)


async def _writable(fileno: int) -> None:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    loop.add_writer(fileno, wake)
    try:
        await waiter
    finally:
        loop.remove_writer(fileno)


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    # Broken already, perhaps: the error going on is the one to report.
    with contextlib.suppress(Exception):
        await conn.close()
