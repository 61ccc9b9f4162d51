"""The database on cores of its own: a benchmark's clients on some CPUs, what serves them on the others.

On one machine the benchmark's Python clients and the database server share the cores, so a slower client
takes CPU from the server: a ratio to the server's limit then mixes the client's cost with the server's
capacity. `server_cores()` separates them, as a database on a host of its own is: this process and every
process it starts (drain processes, pgbench, mariadb-slap) run on the client CPUs, and the server side of
each of their connections on the server CPUs: the PostgreSQL backend (a process each) or the
MariaDB/MySQL server thread (a thread each), found by client port as costs.ServerCpu finds them and pinned
by a thread of this process every 50 ms. Only those move, never the server's background work.

The machine is left as it was found: PostgreSQL backends end with their connections; a MariaDB server
thread outlives its connection in the thread cache, so every pinned thread gets its former CPUs back at
the end, and a run killed before that is mended by the next one (a state file per run in the temp
directory, under a fixed prefix, swept at the start).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import psutil

from benchmarks.common import require_sql
from benchmarks.costs import _MYSQL_THREAD_QUERIES, _client_ports, _port, _server_pid
from conformance.harness import Harness

STATE_PREFIX: Final = "proletarian-bench-server-cores-"
PIN_EVERY_S: Final = 0.05


def split_cpus(cpus: set[int]) -> tuple[set[int], set[int]]:
    """The client CPUs and the server CPUs out of `cpus`: the first half (at least one) for the clients."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        raise RuntimeError(
            f"the database on cores of its own needs two CPUs or more; this process has {ordered}"
        )
    half = len(ordered) // 2
    return set(ordered[:half]), set(ordered[half:])


@contextlib.contextmanager
def server_cores(harness: Harness) -> Iterator[dict[str, Any]]:
    """Within the block, this process and its children on the client CPUs and the server side of their
    connections on the server CPUs (`harness` names the server). Yields what it did, read at the end:
    client_cpus, server_cpus, pinned (backends or threads moved), restored, pinner_cpu_s (the pinning
    thread's own CPU, on a client CPU), failures."""
    sweep_leftovers()
    client, server = split_cpus(os.sched_getaffinity(0))
    found: dict[str, Any] = {
        "client_cpus": sorted(client),
        "server_cpus": sorted(server),
        "pinned": 0,
        "restored": 0,
        "pinner_cpu_s": 0.0,
        "failures": [],
    }
    before = os.sched_getaffinity(0)
    pinner = _Pinner(harness, server, Path(tempfile.gettempdir()) / f"{STATE_PREFIX}{os.getpid()}.json")
    os.sched_setaffinity(0, client)
    thread = threading.Thread(target=pinner.run, name="server-cores", daemon=True)
    thread.start()
    try:
        yield found
    finally:
        pinner.stop.set()
        thread.join()
        os.sched_setaffinity(0, before)
        found["restored"] = pinner.restore()
        found["pinned"] = len(pinner.pinned)
        found["pinner_cpu_s"] = round(pinner.cpu_s, 3)
        found["failures"] = pinner.failures


class _Pinner:
    """Pins the server side of this process tree's connections, and remembers how to undo it."""

    def __init__(self, harness: Harness, server: set[int], state: Path) -> None:
        self.harness = harness
        self.server = server
        self.state = state
        self.stop = threading.Event()
        # /proc stat path -> (its start time, its CPUs before), for restore() and a later run's sweep.
        self.pinned: dict[str, tuple[int, list[int]]] = {}
        self.failures: list[str] = []
        self.cpu_s = 0.0

    def run(self) -> None:
        sql_harness, dialect = require_sql(self.harness)
        conn = sql_harness.connect()
        # Connections seen that are not this process tree's: never looked at again.
        foreign: set[Any] = set()
        server_pid: list[int] = []
        try:
            while not self.stop.wait(PIN_EVERY_S):
                # One cheap query a tick; the client ports (a walk of /proc) only when a new connection came.
                new = [
                    c
                    for c in _connections(conn, dialect, server_pid)
                    if c[2] not in self.pinned and c[0] not in foreign
                ]
                if not new:
                    continue
                pids = [os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))]
                ours = _client_ports(pids, int(conn.info.port if dialect == "postgresql" else conn.port))
                for key, port, path in new:
                    if port in ours:
                        self._pin(path)
                    else:
                        foreign.add(key)
        except Exception as exc:  # a benchmark's figures must say the pinning broke, not hide it
            self.failures.append(f"pinning stopped: {exc!r}")
        finally:
            conn.close()
            self.cpu_s = time.thread_time()

    def _pin(self, path: str) -> None:
        tid = _tid(path)
        try:
            started = _start_time(path)
            cpus = sorted(os.sched_getaffinity(tid))
            os.sched_setaffinity(tid, self.server)
        except (ProcessLookupError, FileNotFoundError):
            return  # its connection closed meanwhile
        except OSError as exc:
            self.failures.append(f"{path}: {exc}")
            return
        self.pinned[path] = (started, cpus)
        self.state.write_text(json.dumps(self.pinned), encoding="utf-8")

    def restore(self) -> int:
        restored = _restore(self.pinned)
        self.state.unlink(missing_ok=True)
        return restored


def _connections(conn: Any, dialect: str, server_pid: list[int]) -> list[tuple[Any, int | None, str]]:
    """Every other client connection of the server: its key, its client port, and the /proc stat path of
    the backend or server thread serving it. `server_pid` keeps the MariaDB/MySQL server's pid once found."""
    cursor = conn.cursor()
    if dialect == "postgresql":
        cursor.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE client_port IS NOT NULL "
            "AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        rows = cursor.fetchall()
        conn.rollback()
        return [(int(pid), port, f"/proc/{pid}/stat") for pid, port in rows]
    import pymysql

    found: list[tuple[Any, int | None, str]] = []
    for query in _MYSQL_THREAD_QUERIES:
        try:
            cursor.execute(query)
        except pymysql.err.MySQLError:
            continue  # the next query names the OS thread (MySQL 8), as costs._mysql_threads reads them
        rows = [tuple(row) for row in cursor.fetchall()]
        tids = [int(tid) for host, cid, tid, own in rows if tid is not None and cid != own]
        if tids and not server_pid:
            pid = _server_pid(tids)
            if pid is None:
                raise RuntimeError("the server's threads are not this machine's: nothing to pin")
            server_pid.append(pid)
        found = [
            (int(cid), _port(str(host)), f"/proc/{server_pid[0]}/task/{int(tid)}/stat")
            for host, cid, tid, own in rows
            if tid is not None and cid != own
        ]
        break
    conn.rollback()
    return found


def _tid(path: str) -> int:
    # /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat: the number before "stat".
    return int(Path(path).parent.name)


def _start_time(path: str) -> int:
    """When the process or thread of `path` started (clock ticks since boot): a reused id has another."""
    text = Path(path).read_text()
    return int(text[text.rindex(")") + 2 :].split()[19])


def _restore(pinned: dict[str, tuple[int, list[int]]]) -> int:
    """Give each still-running pinned backend or thread its former CPUs back; how many were."""
    restored = 0
    for path, (started, cpus) in pinned.items():
        with contextlib.suppress(OSError, ValueError):
            if _start_time(path) == started:
                os.sched_setaffinity(_tid(path), set(cpus))
                restored += 1
    return restored


def sweep_leftovers() -> int:
    """Mend what a killed run left pinned (its state file outlived it); how many were given back."""
    restored = 0
    for state in Path(tempfile.gettempdir()).glob(f"{STATE_PREFIX}*.json"):
        owner = state.name[len(STATE_PREFIX) : -len(".json")]
        if owner.isdigit() and psutil.pid_exists(int(owner)):
            continue  # a run still going
        with contextlib.suppress(OSError, ValueError):
            pinned = json.loads(state.read_text(encoding="utf-8"))
            restored += _restore({path: (int(s), list(c)) for path, (s, c) in pinned.items()})
        state.unlink(missing_ok=True)
    return restored
