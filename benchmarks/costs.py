"""Per-job costs of a drain: the client's CPU, the server's CPU for its connections, and round trips.

Client CPU is the drain's processes' user + system time (psutil). Server CPU is the user + system time,
read from /proc, of what serves the drain's own connections (found by their client ports): the PostgreSQL
backends (a process each, in pg_stat_activity), or the MariaDB/MySQL server's threads (a thread each of
one process, named by information_schema.PROCESSLIST's TID on MariaDB, performance_schema.threads's
THREAD_OS_ID on MySQL 8). Only those are counted, never the server's background work (PostgreSQL's WAL
writer and checkpointer, InnoDB's purge, log writer and page cleaner threads): a server on this machine
only, else a reason says why it is not measured. Round trips are counted in the drain's process
(one-process drains only) at the drivers' single points of exchange: psycopg's Connection.wait (one per
statement, commit, or pipeline sync), PyMySQL's and aiomysql's Connection._execute_command (one per
command), and each send of asyncpg's protocol on asyncio's socket transport (one per exchange: asyncpg
writes an exchange's messages in one call; uvloop's transport is not counted). psycopg sends a
transaction's BEGIN inside the same wait as the statement that opens it, a round trip of its own outside
pipeline mode: counted apart.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psutil

from benchmarks.common import require_sql, sql_dialect
from conformance.harness import Harness


def client_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` so far (a process gone since counts nothing)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def server_cpu_reason(harness: Harness) -> str | None:
    """Why the server's CPU for a drain's connections cannot be read here, or None when it can."""
    dialect = sql_dialect(harness)
    if dialect == "postgresql":
        return None
    if dialect == "mysql":
        # Found on the server itself: its own connection's thread, as a drain's are found.
        sql_harness, _ = require_sql(harness)
        conn = sql_harness.connect()
        try:
            found = _mysql_threads(conn, lambda host, connection_id, own: connection_id == own)
        finally:
            conn.close()
        return found if isinstance(found, str) else None
    return f"{harness.name} is not a built-in SQL dialect"


class ServerCpu:
    """The CPU seconds the server spends serving `client_pids`' connections: the PostgreSQL backends
    (one process each) or the MariaDB/MySQL server's threads (one each), read from /proc."""

    def __init__(self, harness: Harness, client_pids: list[int]) -> None:
        self._harness, self._client_pids = harness, client_pids
        self._last: dict[str, float] = {}
        self.reason: str | None = None
        self.find()

    def find(self) -> None:
        """Look for the drain's connections again and count those not yet counted from now on: a drain's
        threads open theirs as they first claim, so one found early may not have all of them yet."""
        sql_harness, dialect = require_sql(self._harness)
        conn = sql_harness.connect()
        try:
            found = _serving(conn, dialect, self._client_pids)
        finally:
            conn.close()
        if isinstance(found, str):
            self.reason = found
            return
        for path in found:
            if path in self._last:
                continue
            # A backend or thread listed a moment ago may have ended since (another connection of this
            # process closing): that one is skipped, not every one (a clean-clone CI run lost the figure so).
            with contextlib.suppress(OSError):
                self._last[path] = sum(stat_times(path))
        self.reason = (
            None
            if self._last
            else (
                "no server process or thread of the drain's connections was found in /proc "
                "(a server on another host, or in a container?)"
            )
        )

    def seconds(self) -> float:
        for path in self._last:
            # A connection ended since counts what it had used by the last read.
            with contextlib.suppress(OSError):
                self._last[path] = sum(stat_times(path))
        return sum(self._last.values())


@dataclass(frozen=True)
class ToolRun:
    """A client tool's run (pgbench, mariadb-slap) with what it cost: its own CPU, and the server's for
    its connections (None, with `server_cpu_reason`, when that cannot be read here)."""

    returncode: int
    stdout: str
    stderr: str
    client_cpu_s: float
    server_cpu_s: float | None
    server_cpu_reason: str | None
    # Of client_cpu_s and server_cpu_s, the seconds the kernel charged as system time (stat_times).
    client_kernel_s: float
    server_kernel_s: float | None


# How often run_tool reads the server side of the tool's connections: they end with the tool, so what each
# used is its last reading, at most this long before the tool ended.
TOOL_SAMPLE_S: Final = 0.02


def run_tool(
    harness: Harness, command: Sequence[str], env: Mapping[str, str], timeout: float, connections: int
) -> ToolRun:
    """Run `command` (a client of the harness's server holding `connections` connections while it works)
    to its end, as subprocess.run with its output captured, and measure it as a drain is measured: its user
    + system CPU (from its exit, wait4), and the server's for its connections (the backends or threads
    costs.ServerCpu finds by client port), read from /proc every TOOL_SAMPLE_S while it runs.

    The server is asked for the tool's connections only until all of them are open (a query and a look at
    the tool's sockets each time, which would otherwise take CPU from the server being measured); after
    that only their /proc files are read. A PostgreSQL backend begins with its connection, so its whole CPU
    counts; a MariaDB/MySQL thread may come from the thread cache, so only what it used from its first
    reading on (the tool's connecting, at most TOOL_SAMPLE_S, is missed)."""
    reason = server_cpu_reason(harness)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(list(command), stdout=out, stderr=err, env=dict(env), text=True)
        try:
            server = None if reason is not None else _ToolServer(harness, process.pid, connections)
            try:
                deadline = time.monotonic() + timeout
                while True:
                    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                    if pid:
                        break
                    if time.monotonic() > deadline:
                        raise subprocess.TimeoutExpired(list(command), timeout)
                    if server is not None:
                        server.read()
                    time.sleep(TOOL_SAMPLE_S)
            finally:
                if server is not None:
                    server.close()
        except BaseException:
            process.kill()
            process.wait()
            raise
        # Reaped here: Popen must not wait for it again.
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if server is not None and server.reason is not None:
        reason = server.reason
    server_cpu = server_kernel = None
    if reason is None and server is not None:
        server_cpu, server_kernel = server.seconds(), server.seconds(kernel=True)
    return ToolRun(
        process.returncode,
        stdout,
        stderr,
        usage.ru_utime + usage.ru_stime,
        server_cpu,
        reason,
        usage.ru_stime,
        server_kernel,
    )


class _ToolServer:
    """The server side of a running tool's connections, looked for until `connections` of them are open at
    once (the tool opens them as it starts, perhaps after one to check the server), each one's CPU from its
    first reading to its last."""

    def __init__(self, harness: Harness, pid: int, connections: int) -> None:
        sql_harness, self._dialect = require_sql(harness)
        self._pid = pid
        self._connections = connections
        self._conn: Any = sql_harness.connect()
        # (CPU, of it the kernel's) seconds of each path at its first and its latest reading.
        self._first: dict[str, tuple[float, float] | None] = {}
        self._last: dict[str, tuple[float, float]] = {}
        self._ended: set[str] = set()
        self.reason: str | None = "no server process or thread of the tool's connections was found"

    def read(self) -> None:
        if self._conn is not None:
            self._find()
        for path, first in self._first.items():
            if path in self._ended:
                continue
            try:
                user, system = stat_times(path)
            except OSError:
                self._ended.add(path)  # ended with its connection: its last reading stands
                continue
            if first is None:
                self._first[path] = (0.0, 0.0) if self._dialect == "postgresql" else (user + system, system)
            self._last[path] = (user + system, system)
        if self._last:
            self.reason = None

    def _find(self) -> None:
        found = _serving(self._conn, self._dialect, [self._pid])
        if isinstance(found, str):
            # "no backend ..." or "no server thread ...": none open yet. Any other reason (the server's
            # threads are another machine's) holds for the whole run.
            if not found.startswith("no ") and not self._last:
                self.reason = found
            return
        for path in found:
            self._first.setdefault(path, None)
        if sum(os.path.exists(path) for path in self._first) >= self._connections:
            self.close()

    def seconds(self, kernel: bool = False) -> float:
        """The CPU seconds of the tool's connections' server side (with `kernel`, the kernel's share)."""
        side = 1 if kernel else 0
        return sum(last[side] - (self._first[path] or (0.0, 0.0))[side] for path, last in self._last.items())

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def share_of(part: float, whole: float) -> float:
    """`part` of `whole` (seconds: of a side's CPU, the kernel's; of the cores' time, the idle), to three
    places; NaN when there was nothing to share."""
    return round(part / whole, 3) if whole > 0 else math.nan


def stat_times(path: str) -> tuple[float, float]:
    """User and system CPU seconds of the process or thread whose /proc stat file is `path` (OSError once
    it is gone). The kernel charges them a clock tick at a time to whichever task a tick finds running:
    over a window of seconds they are a sample, whose split is what they tell beside schedstat's exact
    total."""
    text = Path(path).read_text()
    # The command name (field 2) may hold spaces and parentheses: fields are counted after its last ")".
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS


def _serving(conn: Any, dialect: str, client_pids: list[int]) -> list[str] | str:
    """The /proc stat files of what serves `client_pids`' connections (found by their client ports), or why
    none is found: the PostgreSQL backends, or the MariaDB/MySQL server threads. The connection asking is
    never one of them, though `client_pids` may hold its process."""
    if dialect == "postgresql":
        return _postgresql_backends(conn, client_pids)
    ports = _client_ports(client_pids, int(conn.port))
    return _mysql_threads(conn, lambda host, cid, own: _port(host) in ports and cid != own)


def _postgresql_backends(conn: Any, client_pids: list[int]) -> list[str] | str:
    ports = sorted(_client_ports(client_pids, conn.info.port))
    cursor = conn.cursor()
    cursor.execute(
        "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s) AND datname = current_database() "
        "AND pid <> pg_backend_pid()",
        (ports,),
    )
    pids = [int(row[0]) for row in cursor.fetchall()]
    conn.rollback()
    if not pids:
        return "no backend of the drain's connections was found (a server on another host?)"
    return [f"/proc/{pid}/stat" for pid in pids]


# The OS thread of each connection: MariaDB lists it in its PROCESSLIST (TID); MySQL 8 only in
# performance_schema.threads (THREAD_OS_ID), when performance_schema is on.
_MYSQL_THREAD_QUERIES: Final = (
    "SELECT HOST, ID, TID, CONNECTION_ID() FROM information_schema.PROCESSLIST",
    "SELECT p.HOST, p.ID, t.THREAD_OS_ID, CONNECTION_ID() FROM information_schema.PROCESSLIST p "
    "JOIN performance_schema.threads t ON t.PROCESSLIST_ID = p.ID",
)
_SERVER_NAMES: Final = ("mariadbd", "mysqld")


def _mysql_threads(conn: Any, wanted: Callable[[str, int, int], bool]) -> list[str] | str:
    """The /proc stat files of the server threads serving the connections `wanted(host, id, own id)`
    picks, or why they cannot be read: no column names a connection's OS thread, or the server is not
    a process of this machine."""
    import pymysql

    rows: list[tuple[Any, ...]] | None = None
    cursor = conn.cursor()
    for query in _MYSQL_THREAD_QUERIES:
        try:
            cursor.execute(query)
        except pymysql.err.MySQLError:
            # An unknown column or table, or no access to it: the next query, or the reason below.
            continue
        rows = [tuple(row) for row in cursor.fetchall()]
        break
    cursor.execute("SELECT @@hostname")
    (server_host,) = cursor.fetchone()
    conn.rollback()
    if rows is None:
        return (
            "the server names no connection's OS thread: neither information_schema.PROCESSLIST.TID "
            "(MariaDB) nor performance_schema.threads.THREAD_OS_ID (MySQL 8, performance_schema on)"
        )
    tids = [int(tid) for host, cid, tid, own in rows if tid is not None and wanted(str(host), cid, own)]
    if not tids:
        return "no server thread of the drain's connections was found (performance_schema off on MySQL 8?)"
    local = str(getattr(conn, "host", "")) in ("127.0.0.1", "::1", "localhost") or (
        str(server_host) == socket.gethostname()
    )
    server = _server_pid(tids) if local else None
    if server is None:
        return (
            "the server's threads are not this machine's (a server on another host, or in a container), "
            "so their CPU cannot be read from /proc"
        )
    return [f"/proc/{server}/task/{tid}/stat" for tid in tids]


def _server_pid(tids: list[int]) -> int | None:
    """The local MariaDB/MySQL server process holding every one of `tids` among its threads."""
    for process in psutil.process_iter(["name"]):
        if process.info["name"] in _SERVER_NAMES and all(
            os.path.exists(f"/proc/{process.pid}/task/{tid}") for tid in tids
        ):
            return process.pid
    return None


def _port(host: str) -> int | None:
    """The client port of a PROCESSLIST HOST ("127.0.0.1:35462"); None for a socket's "localhost"."""
    _, sep, port = host.rpartition(":")
    return int(port) if sep and port.isdigit() else None


def _client_ports(pids: list[int], server_port: int) -> set[int]:
    ports: set[int] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for c in psutil.Process(pid).net_connections(kind="tcp"):
                if c.raddr and c.raddr.port == server_port:
                    ports.add(c.laddr.port)
    return ports


class RoundTrips:
    """Counts the drivers' exchanges with the server in this process while installed."""

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._read = 0

    @property
    def count(self) -> int:
        # next() on itertools.count is atomic under the GIL; each read consumes one, subtracted here.
        value = next(self._counter) - self._read
        self._read += 1
        return value

    @contextlib.contextmanager
    def installed(self) -> Iterator[RoundTrips]:
        patched: list[tuple[Any, str, Any]] = []
        targets: list[tuple[str, str]] = [
            ("pymysql.connections", "Connection._execute_command"),
            # mysqlclient's exchanges: its C calls, through its Connection's Python class.
            ("MySQLdb.connections", "Connection.query"),
            ("MySQLdb.connections", "Connection.commit"),
            ("MySQLdb.connections", "Connection.rollback"),
            # Coroutine functions: counted when called, as each call is awaited once.
            ("aiomysql.connection", "Connection._execute_command"),
            # AsyncPostgresBackend(pipeline=True)'s exchanges: each reads back one pipeline's results.
            ("proletarian_ref.backends.pg_exchange", "read_results"),
        ]
        for module_name, attribute in targets:
            try:
                module = __import__(module_name, fromlist=["_"])
            except ImportError:
                continue
            owner_name, _, method_name = attribute.rpartition(".")
            owner = getattr(module, owner_name) if owner_name else module
            original = getattr(owner, method_name)
            setattr(owner, method_name, self._counting(original))
            patched.append((owner, method_name, original))
        # asyncpg has no Python point of exchange (its protocol is compiled): each send of its protocol
        # on asyncio's socket transport is one, as it writes an exchange's messages in one call.
        from asyncio import selector_events

        transport = getattr(selector_events, "_SelectorSocketTransport")  # noqa: B009 - private, untyped
        original_write = transport.write
        setattr(transport, "write", self._counting_asyncpg(original_write))  # noqa: B010
        patched.append((transport, "write", original_write))
        with contextlib.suppress(ImportError):
            import psycopg
            from psycopg._connection_base import BaseConnection
            from psycopg._pipeline_base import BasePipeline

            # psycopg waits once per statement; in pipeline mode a wait only sends what was queued, and the
            # exchange is the Sync or the flush request after which results come back.
            for owner, name, counting in (
                (psycopg.Connection, "wait", self._counting_outside_pipeline),
                # A coroutine function: counted when called, as each call is awaited once.
                (psycopg.AsyncConnection, "wait", self._counting_outside_pipeline),
                (BasePipeline, "_sync_gen", self._counting),
                (BasePipeline, "_fetch_gen", self._counting_flush),
            ):
                original = getattr(owner, name)
                setattr(owner, name, counting(original))
                patched.append((owner, name, original))
            original = BaseConnection._start_query
            # setattr: mypy refuses assigning to a method.
            setattr(BaseConnection, "_start_query", self._counting_begin(original))  # noqa: B010
            patched.append((BaseConnection, "_start_query", original))
        try:
            yield self
        finally:
            for owner, method_name, original in patched:
                setattr(owner, method_name, original)

    def _counting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        counter = self._counter

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            next(counter)
            return original(*args, **kwargs)

        return counted

    def _counting_outside_pipeline(self, original: Callable[..., Any]) -> Callable[..., Any]:
        counter = self._counter

        @functools.wraps(original)
        def wait(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if not conn._pipeline:
                next(counter)
            return original(conn, *args, **kwargs)

        return wait

    def _counting_flush(self, original: Callable[..., Any]) -> Callable[..., Any]:
        counter = self._counter

        @functools.wraps(original)
        def fetch(pipeline: Any, *, flush: bool) -> Any:
            # A flush request asks for the results queued so far (psycopg sends none when it has none).
            if flush and pipeline.result_queue:
                next(counter)
            return original(pipeline, flush=flush)

        return fetch

    def _counting_asyncpg(self, original: Callable[..., Any]) -> Callable[..., Any]:
        counter = self._counter

        @functools.wraps(original)
        def write(transport: Any, data: Any) -> Any:
            if type(transport._protocol).__module__.startswith("asyncpg."):
                next(counter)
            return original(transport, data)

        return write

    def _counting_begin(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from psycopg.pq import TransactionStatus

        counter = self._counter

        @functools.wraps(original)
        def start_query(conn: Any) -> Any:
            # The same test psycopg makes before it sends BEGIN, and waits for its result, outside a pipeline.
            if (
                not conn.autocommit
                and conn.pgconn.transaction_status == TransactionStatus.IDLE
                and not conn._pipeline
            ):
                next(counter)
            return original(conn)

        return start_query
