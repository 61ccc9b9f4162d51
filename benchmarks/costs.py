"""Per-job costs of a drain: the client's CPU, the server's CPU for its connections, and round trips.

Client CPU is the drain's processes' user + system time (psutil). Server CPU is read from /proc for the
PostgreSQL backends serving the drain's own connections (found by their client ports); MariaDB/MySQL serve
every connection from threads of one process, told apart only through performance_schema, so there it is
not measured. Round trips are counted in the drain's process (one-process drains only) at the drivers'
single points of exchange: psycopg's Connection.wait (one per statement, commit, or pipeline sync) and
PyMySQL's Connection._execute_command (one per command). psycopg sends a transaction's BEGIN inside the
same wait as the statement that opens it, a round trip of its own outside pipeline mode: counted apart.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any

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
    dialect = sql_dialect(harness)
    if dialect == "postgresql":
        return None
    if dialect == "mysql":
        return (
            "MariaDB/MySQL serve every connection from threads of one process; without performance_schema "
            "a drain's threads cannot be told from other clients', so server CPU is not measured"
        )
    return f"{harness.name} is not a built-in SQL dialect"


class ServerCpu:
    """The CPU seconds of the PostgreSQL backends serving `client_pids`' connections to the server."""

    def __init__(self, harness: Harness, client_pids: list[int]) -> None:
        sql_harness, _ = require_sql(harness)
        self._backends: list[psutil.Process] = []
        self.reason: str | None = None
        conn = sql_harness.connect()
        try:
            server_port = conn.info.port
            ports = sorted(_client_ports(client_pids, server_port))
            cursor = conn.cursor()
            cursor.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE client_port = ANY(%s) AND datname = current_database()",
                (ports,),
            )
            pids = [int(row[0]) for row in cursor.fetchall()]
            conn.rollback()
        finally:
            conn.close()
        try:
            for pid in pids:
                # A backend listed a moment ago may have ended since (another connection of this process
                # closing): that one is skipped, not every backend (a clean-clone CI run lost the figure so).
                with contextlib.suppress(psutil.NoSuchProcess):
                    self._backends.append(psutil.Process(pid))
            self.seconds()
        except psutil.Error as exc:
            self._backends = []
            self.reason = f"the server's processes cannot be read here ({type(exc).__name__})"
        if not self._backends and self.reason is None:
            self.reason = "no backend of the drain's connections was found (a server on another host?)"

    def seconds(self) -> float:
        total = 0.0
        for process in self._backends:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                total += times.user + times.system
        return total


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
            ("psycopg", "Connection.wait"),
            ("pymysql.connections", "Connection._execute_command"),
        ]
        for module_name, attribute in targets:
            try:
                module = __import__(module_name, fromlist=["_"])
            except ImportError:
                continue
            owner_name, method_name = attribute.split(".")
            owner = getattr(module, owner_name)
            original = getattr(owner, method_name)
            setattr(owner, method_name, self._counting(original))
            patched.append((owner, method_name, original))
        with contextlib.suppress(ImportError):
            from psycopg._connection_base import BaseConnection

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
