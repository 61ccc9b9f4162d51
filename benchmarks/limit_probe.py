"""Where a drain's time goes (issue 31): wait states, run-queue delay, idle cores, CPU a job of one drain.

`python -m benchmarks.limit_probe --dsn DSN --point 4x4x10 [--factory postgresql_pipeline] --out FILE.json`
tops up a queue, drains it at processes x threads x jobs a commit, and during the measured window samples,
every few milliseconds, what serves the drain's own connections (never the probe's: PostgreSQL, state and
wait event in pg_stat_activity; MariaDB, command and state in information_schema.PROCESSLIST with the InnoDB
transaction's state, LOCK WAIT among them; MySQL 8's PROCESSLIST names no connection's thread, so it is not
probed), and reads /proc/<pid>/schedstat of every client thread and of every backend or server thread
serving the drain: the CPU time and the time spent runnable but waiting for a core (the run queue), and
the share of that CPU the kernel charged as its own (system time: the system calls, the network stack). It
also reads the machine's idle share of its cores and the whole server's CPU (its background work included:
WAL writer, InnoDB's log writer and purge). Per job, those say whether the CPU (client or server), the
locks, the scheduler's queue on a loaded machine or neither (idle cores: the drain waited) bound the drain.
On a MariaDB started with performance_schema on, each result also keeps the server's wait instruments with
the most time a job (InnoDB's latches among them when `wait/synch/%` is enabled); on any MariaDB, InnoDB's
counters a job (the pages it read, the rows asked for by key and next, written, deleted) and its purge
backlog (history list length) at both ends of the window: `--table` prints them as a second table. On
either database, drain or limit, it also samples what one claim reads as the server accounts for it
(ClaimPages: the pages or blocks a claim of the point's jobs a commit read, run and rolled back on a
connection of its own every CLAIM_EVERY_S): `--table` prints them as a third.

A drain is `FACTORY` (a conformance.builtin factory, the threaded worker) or `FACTORY:MODE`, MODE one of
benchmarks.workers' asyncio modes (`async`, `async_chain`, `async_chain_uvloop`, `async_pipeline`); `limit`
is the server's own limit at the point (pgbench, or the stored procedure under mariadb-slap).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast, get_args

import psutil

from benchmarks.common import (
    BENCH_QUEUE_TEXT,
    BackendSpec,
    Dialect,
    batch_claim,
    db_now,
    open_harness,
    require_sql,
)
from benchmarks.costs import _client_ports, _port, _server_pid, share_of, stat_times
from benchmarks.machine import describe, machine
from benchmarks.server_limit import limit_rate
from benchmarks.throughput import QueueFiller
from benchmarks.workers import DrainRun, Mode

# The poll loops look their run functions up in their own modules (the threaded one generated from the
# asyncio one, _async/poll_loop.py).
from proletarian_ref._async import poll_loop as async_poll_loop
from proletarian_ref._sync import poll_loop as poll_loop_module
from proletarian_ref.backends.mysql import _ISOLATION_SQL as WORKER_ISOLATION_SQL

# The server's processes, by the name each of their processes (PostgreSQL) or the one process (MariaDB) has.
_SERVER_PROCESSES: Final = ("postgres", "mariadbd", "mysqld")
# How often the sampler asks the server what the drain's connections are doing.
SAMPLE_S: Final = 0.005


def schedstat(pids: list[int], threads: bool) -> tuple[float, float, float]:
    """Seconds on a core, seconds runnable in the run queue, and seconds of the CPU spent in the kernel
    (kernel_seconds), summed over `pids` (and their threads)."""
    return _summed([path for pid in pids for path in _tasks(pid, threads)])


def _tasks(pid: int, threads: bool) -> list[str]:
    """The /proc paths of `pid`'s threads (when `threads`), or of the process."""
    tasks = [f"/proc/{pid}/task/{t}" for t in os.listdir(f"/proc/{pid}/task")] if threads else []
    return tasks or [f"/proc/{pid}"]


def _summed(paths: list[str]) -> tuple[float, float, float]:
    read = [(*_schedstat(path), kernel_seconds(path)) for path in paths]
    return sum(r[0] for r in read), sum(r[1] for r in read), sum(r[2] for r in read)


def _schedstat(path: str) -> tuple[float, float]:
    """The (on a core, in the run queue) seconds of the process or thread at /proc `path`; zero once gone."""
    with contextlib.suppress(OSError):
        fields = Path(path, "schedstat").read_text().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    return 0.0, 0.0


def kernel_seconds(path: str) -> float:
    """The seconds of CPU the process or thread at /proc `path` spent in the kernel (stat's system time:
    system calls, the network stack, page faults; costs.stat_times), zero once gone."""
    with contextlib.suppress(OSError):
        return stat_times(f"{path}/stat")[1]
    return 0.0


def cores_busy() -> tuple[float, float]:
    """The machine's CPU seconds so far, all cores: (idle or waiting on I/O, in all)."""
    times = psutil.cpu_times()
    return times.idle + getattr(times, "iowait", 0.0), sum(times)


def server_processes_cpu() -> dict[int, float]:
    """User + system CPU seconds so far of every server process of this machine, by pid."""
    cpu: dict[int, float] = {}
    for process in psutil.process_iter(["name"]):
        if process.info["name"] in _SERVER_PROCESSES:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                cpu[process.pid] = times.user + times.system
    return cpu


def server_cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """The server's CPU seconds between two server_processes_cpu() readings, over the processes in both: its
    background work (WAL writer, InnoDB's log writer, purge and page cleaners, one MariaDB process whose
    ended threads' CPU it keeps) and the connections open throughout. A PostgreSQL backend that began or
    ended between them is not counted."""
    return sum(after[pid] - before[pid] for pid in after.keys() & before.keys())


@contextlib.contextmanager
def _counting_claims(batch: int, asyncio: bool) -> Iterator[collections.Counter[str]]:
    """In this process, every claim the worker makes, and those that found nothing (each followed by an
    idle wait of the polling interval): the poll loop's share of the window."""
    claims: collections.Counter[str] = collections.Counter()
    name = "run_next_job" if batch == 1 else "run_next_batch"
    module: Any = async_poll_loop if asyncio else poll_loop_module
    original = getattr(module, name)

    def count(ran: Any) -> Any:
        claims["claims" if ran is not None else "empty"] += 1
        return ran

    async def counted_async(*args: Any, **kwargs: Any) -> Any:
        return count(await original(*args, **kwargs))

    def counted(*args: Any, **kwargs: Any) -> Any:
        return count(original(*args, **kwargs))

    setattr(module, name, counted_async if asyncio else counted)
    try:
        yield claims
    finally:
        setattr(module, name, original)


class _Served:
    """What serves a drain's connections (those `client_pids` hold to the server, less the client ports
    open `before` the drain began: neither the probe's own nor the harness's), and what each is doing,
    asked of the server by `watcher`."""

    def __init__(self, watcher: Any, dialect: Dialect, client_pids: list[int], before: set[int]) -> None:
        self._watcher = watcher
        self._dialect = dialect
        if dialect == "postgresql":
            ports = sorted(_client_ports(client_pids, watcher.info.port) - before)
            self._ids = [
                int(r[0])
                for r in watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", (ports,)
                ).fetchall()
            ]
            self.paths = [f"/proc/{pid}" for pid in self._ids]
        else:
            wanted = _client_ports(client_pids, int(watcher.port)) - before
            cursor = watcher.cursor()
            cursor.execute("SELECT ID, HOST, TID FROM information_schema.PROCESSLIST")
            rows = [
                (int(cid), int(tid)) for cid, host, tid in cursor.fetchall() if _port(str(host)) in wanted
            ]
            self._ids = [cid for cid, _ in rows]
            server = _server_pid([tid for _, tid in rows])
            if server is None:
                raise RuntimeError("the server's threads are not this machine's: nothing to read in /proc")
            self.paths = [f"/proc/{server}/task/{tid}" for _, tid in rows]
        if not self._ids:
            raise RuntimeError("no connection of the drain was found on the server")

    @property
    def connections(self) -> int:
        return len(self._ids)

    def cpu(self) -> tuple[float, float, float]:
        """Seconds on a core, in the run queue and in the kernel so far, summed over what serves the drain."""
        return _summed(self.paths)

    def sample(self) -> list[str]:
        """One sample: a state of each connection, "state|wait_event_type:wait_event" on PostgreSQL,
        "command|state|InnoDB transaction state" on MariaDB (its PROCESSLIST names each one's thread)."""
        if self._dialect == "postgresql":
            rows = self._watcher.execute(
                "SELECT state, wait_event_type, wait_event FROM pg_stat_activity WHERE pid = ANY(%s)",
                (self._ids,),
            ).fetchall()
            return [f"{state}|{wtype}:{wevent}" for state, wtype, wevent in rows]
        cursor = self._watcher.cursor()
        marks = ", ".join(["%s"] * len(self._ids))
        cursor.execute(
            "SELECT p.COMMAND, p.STATE, t.trx_state FROM information_schema.PROCESSLIST p "
            "LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID "
            f"WHERE p.ID IN ({marks})",
            self._ids,
        )
        return [f"{command}|{state or ''}|{trx or ''}" for command, state, trx in cursor.fetchall()]


class _Every:
    """Calls `fn` on a thread of its own every `interval_s` from start() to stop(); stop() raises what it
    raised, if anything."""

    def __init__(self, fn: Callable[[], None], interval_s: float, name: str) -> None:
        self._fn = fn
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._fn()
                self._stop.wait(self._interval_s)
        except BaseException as exc:  # handed to stop()
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop calling fn (again, or before start(): nothing)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"{self._thread.name} failed") from error


class ClaimPages:
    """What one claim reads now, sampled every CLAIM_EVERY_S on a connection of its own while a drain or
    the limit runs: batch mode's claim (get_next_jobs, LIMIT jobs a commit; on MariaDB the library's bounded
    claim, common.batch_claim, or Proletarian's classic one without `bounded`) run under the server's own
    account of it (MariaDB's ANALYZE FORMAT=JSON, whose r_engine_stats count the pages each table's access
    read, 10.9 on; PostgreSQL's EXPLAIN (ANALYZE, BUFFERS): shared blocks hit and read), in a transaction
    rolled back at once, at the isolation level the worker's own claims run at (READ COMMITTED on MariaDB,
    as MySQLBackend sets it). The rows it claims are locked for that moment, and a drain's claims pass over
    them as over any other worker's; none is changed. `isolation` (MariaDB: a `SET SESSION TRANSACTION
    ISOLATION LEVEL` statement) runs it at another level, as benchmarks.delete_marked does."""

    def __init__(
        self,
        harness: Any,
        dialect: Dialect,
        batch: int,
        isolation: str = WORKER_ISOLATION_SQL,
        *,
        bounded: bool = True,
    ) -> None:
        self._conn: Any = _connect(harness, dialect)
        if dialect == "mysql":
            cursor = self._conn.cursor()
            cursor.execute(isolation)
            cursor.close()
        self._dialect = dialect
        prefix = "ANALYZE FORMAT=JSON " if dialect == "mysql" else "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
        self._statement = prefix + batch_claim(require_sql(harness)[0], bounded=bounded)
        self._params = {"queue": BENCH_QUEUE_TEXT, "limit": batch}
        self._samples: list[tuple[int, int]] = []
        self._every = _Every(lambda: self._samples.append(self.claim()), CLAIM_EVERY_S, "probe-claim-pages")

    def claim(self) -> tuple[int, int]:
        """(pages read, rows claimed) of one claim, rolled back."""
        params = {**self._params, "now": db_now(self._dialect)}
        if self._dialect == "postgresql":
            with self._conn.transaction(force_rollback=True):
                ((plan,),) = self._conn.execute(self._statement, params).fetchall()
            top = plan[0]["Plan"]
            return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"]), int(top["Actual Rows"])
        cursor = self._conn.cursor()
        cursor.execute("START TRANSACTION")
        try:
            cursor.execute(self._statement, params)
            ((text,),) = cursor.fetchall()
        finally:
            cursor.execute("ROLLBACK")
        tables = list(_tables(json.loads(text)))
        if not tables or any("r_engine_stats" not in t for t in tables):
            raise RuntimeError("the server's ANALYZE names no pages a table read (MariaDB 10.9 on does)")
        pages = sum(int(t["r_engine_stats"].get("pages_accessed", 0)) for t in tables)
        return pages, int(tables[0]["r_rows"])

    def start(self) -> None:
        self._every.start()

    def stop(self) -> None:
        """Stop sampling and close the connection (again: nothing); raise what a sample raised."""
        try:
            self._every.stop()
        finally:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

    def result(self) -> dict[str, Any]:
        """{"claims": {samples, the medians of pages a claim, rows a claim and pages a row}}."""
        found = [(pages, rows) for pages, rows in self._samples if rows > 0]
        if not found:
            return {"claims": {"samples": 0}}
        return {
            "claims": {
                "samples": len(found),
                "pages": statistics.median(p for p, _ in found),
                "rows": statistics.median(r for _, r in found),
                "pages_per_row": statistics.median(p / r for p, r in found),
            }
        }


def _tables(node: Any) -> Iterator[dict[str, Any]]:
    """Every "table" object of a MariaDB ANALYZE FORMAT=JSON document, depth first."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "table" and isinstance(value, dict):
                yield value
            yield from _tables(value)
    elif isinstance(node, list):
        for item in node:
            yield from _tables(item)


# How often a claim is sampled: often enough for a median over a two-second window, seldom enough that its
# moment's locks are a small share of what the drain's claims pass.
CLAIM_EVERY_S: Final = 0.05


def waiting_on_client(state: str) -> bool:
    """A sampled state (either dialect's) in which the server waits for the client's next message."""
    return "ClientRead" in state or state.startswith("Sleep|")


def waiting_on_lock(state: str) -> bool:
    """A sampled state (either dialect's) in which the server waits for a lock another transaction holds."""
    return "|Lock:" in state or state.endswith("|LOCK WAIT")


def _connect(harness: Any, dialect: Dialect) -> Any:
    """The harness's own connection, in autocommit, for what the probe asks the server."""
    sql_harness, _ = require_sql(harness)
    conn = sql_harness.connect()
    if dialect == "postgresql":
        conn.autocommit = True
    else:
        conn.autocommit(True)
    return conn


def _sends_bounded_claims(harness: Any) -> bool:
    """Whether the drain's backend claims with MySQL's bounded statements (MySQLBackend's bounded_claim;
    the asyncio drains' AsyncMySQLBackend keeps its default, on), so that the sampled claim is its own."""
    return bool(getattr(harness.backend(), "_bounded_claims", False))


def parse_drain(text: str) -> tuple[str, Mode]:
    """ "FACTORY" or "FACTORY:MODE" as (factory, benchmarks.workers mode), refusing what names neither."""
    factory, _, mode = text.partition(":")
    mode = mode or "library"
    if not factory or mode not in get_args(Mode) or mode == "raw":
        raise ValueError(
            f"{text!r} is not a drain: FACTORY or FACTORY:MODE, MODE one of "
            + ", ".join(m for m in get_args(Mode) if m not in ("library", "raw"))
        )
    return factory, cast(Mode, mode)


def probe(
    dsn: str,
    drain: str,
    point: tuple[int, int, int],
    window_s: float,
    preload: int,
    suffix: str = "_limitprobe",
) -> dict[str, Any]:
    """Drain at `point` with `drain` (parse_drain's) and read, over `window_s`, what its time went to."""
    processes, threads, batch = point
    factory, mode = parse_drain(drain)
    spec = BackendSpec(f"conformance.builtin:{factory}", {"dsn": dsn})
    harness = open_harness(spec, "probe", suffix)
    _, dialect = require_sql(harness)
    filler = QueueFiller(harness, preload)
    filler.top_up()
    run = DrainRun(harness, spec, mode, processes, threads, 100.0, batch_size=batch)
    samples: collections.Counter[str] = collections.Counter()
    # A chained claim is made inside run_next_job's call, so only unchained drains' claims are counted.
    counted = processes == 1 and "chain" not in drain
    claiming: contextlib.AbstractContextManager[collections.Counter[str]] = (
        _counting_claims(batch, mode != "library")
        if counted
        else contextlib.nullcontext(collections.Counter())
    )
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(harness.close)
        watcher = _connect(harness, dialect)
        cleanup.callback(watcher.close)
        claims: collections.Counter[str] = cleanup.enter_context(claiming)
        cleanup.callback(run.stop)
        claim_pages = ClaimPages(harness, dialect, batch, bounded=_sends_bounded_claims(harness))
        cleanup.callback(claim_pages.stop)
        server_port = watcher.info.port if dialect == "postgresql" else int(watcher.port)
        # Ports open now are the probe's own (the watcher's, the claim sampler's, the harness's).
        before = _client_ports([os.getpid()], server_port)
        run.start()
        while run.count == 0:
            time.sleep(0.01)
        time.sleep(0.3)
        served = _Served(watcher, dialect, run.pids, before)
        states = _Every(lambda: samples.update(served.sample()), SAMPLE_S, "probe-states")
        cleanup.callback(states.stop)
        claims.clear()
        c0, t0 = run.count, time.perf_counter()
        client0, server0, machine0 = (
            schedstat(run.pids, True),
            served.cpu(),
            MachineReading.take(watcher, dialect),
        )
        states.start()
        claim_pages.start()
        time.sleep(window_s)
        states.stop()
        claim_pages.stop()
        client1, server1, machine1 = (
            schedstat(run.pids, True),
            served.cpu(),
            MachineReading.take(watcher, dialect),
        )
        c1, t1 = run.count, time.perf_counter()
        polls = dict(claims)
    jobs = c1 - c0
    if jobs <= 0 or c1 >= preload:
        raise RuntimeError(f"the queue of {preload} jobs ran dry before the window ended: a larger --preload")
    total = sum(samples.values())
    server_all_cpu, machine = machine0.until(machine1, jobs)
    return {
        "point": list(point),
        "factory": drain,
        "dialect": dialect,
        "jobs": jobs,
        "connections": served.connections,
        "seconds": round(t1 - t0, 3),
        "jobs_per_s": jobs / (t1 - t0),
        "per_job_us": {
            "client_cpu": (client1[0] - client0[0]) / jobs * 1e6,
            "client_runqueue": (client1[1] - client0[1]) / jobs * 1e6,
            "server_cpu": (server1[0] - server0[0]) / jobs * 1e6,
            "server_runqueue": (server1[1] - server0[1]) / jobs * 1e6,
            "server_all_cpu": server_all_cpu,
        },
        # Of each side's CPU over the window, the share the kernel charged to its system time.
        "kernel_share": {
            "client": share_of(client1[2] - client0[2], client1[0] - client0[0]),
            "server": share_of(server1[2] - server0[2], server1[0] - server0[0]),
        },
        "polls": polls if counted else None,
        "backend_states": {k: round(v / total, 3) for k, v in samples.most_common()},
        **claim_pages.result(),
        **machine,
    }


@dataclass(frozen=True)
class MachineReading:
    """What a probe reads of the whole machine before and after its window, the drain's and the limit's
    alike: the server's wait instruments (server_waits), the cores' busy and idle time (cores_busy), every
    server process's CPU (server_processes_cpu), InnoDB's counters (server_status)."""

    waits: dict[str, tuple[int, int]] | None
    cores: tuple[float, float]
    server_processes: dict[int, float]
    status: dict[str, int] | None

    @classmethod
    def take(cls, conn: Any, dialect: Dialect) -> MachineReading:
        return cls(
            server_waits(conn, dialect), cores_busy(), server_processes_cpu(), server_status(conn, dialect)
        )

    def until(self, after: MachineReading, jobs: int) -> tuple[float, dict[str, Any]]:
        """The whole server's CPU µs a job from this reading to `after`, and the result's keys of the
        machine's: cores_idle, server_waits and server_status (where the server has them), load_average."""
        return server_cpu_between(self.server_processes, after.server_processes) / jobs * 1e6, {
            "cores_idle": _share(self.cores, after.cores),
            **waits_per_job(self.waits, after.waits, jobs),
            **status_per_job(self.status, after.status, jobs),
            "load_average": list(psutil.getloadavg()),
        }


# MariaDB's counters of the work InnoDB did, read a job: the pages it looked at (every page a statement or
# the purge visited: a global counter cannot tell whose), the rows the SQL layer asked it for by key and next
# in an index, wrote and deleted; and its purge's backlog, a level read at both ends of the window.
STATUS_COUNTERS: Final = (
    "Innodb_buffer_pool_read_requests",
    "Handler_read_key",
    "Handler_read_next",
    "Handler_write",
    "Handler_delete",
    "Innodb_row_lock_waits",
)
STATUS_LEVELS: Final = ("Innodb_history_list_length",)


def server_status(conn: Any, dialect: Dialect) -> dict[str, int] | None:
    """MariaDB's global STATUS_COUNTERS and STATUS_LEVELS now (every session's, live), or None on
    PostgreSQL (whose statistics reach pg_stat_database up to a second late, too late for a window)."""
    if dialect != "mysql":
        return None
    names = ", ".join(f"'{name}'" for name in (*STATUS_COUNTERS, *STATUS_LEVELS))
    cursor = conn.cursor()
    cursor.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({names})")
    found = {str(name): int(value) for name, value in cursor.fetchall()}
    missing = {*STATUS_COUNTERS, *STATUS_LEVELS} - found.keys()
    if missing:
        raise RuntimeError(f"the server has no status variable {sorted(missing)}")
    return found


def status_per_job(before: dict[str, int] | None, after: dict[str, int] | None, jobs: int) -> dict[str, Any]:
    """{"server_status": each of STATUS_COUNTERS a job between two server_status readings, each of
    STATUS_LEVELS as [before, after]}, or nothing where the server gave none."""
    if before is None or after is None:
        return {}
    return {
        "server_status": {
            **{name: (after[name] - before[name]) / jobs for name in STATUS_COUNTERS},
            **{name: [before[name], after[name]] for name in STATUS_LEVELS},
        }
    }


def _share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share of the cores' time between two cores_busy() readings that was idle (or waiting on I/O)."""
    return share_of(after[0] - before[0], after[1] - before[1])


# The waits a result keeps: the server's instruments with the most time a job.
TOP_WAITS: Final = 5


def server_waits(conn: Any, dialect: Dialect) -> dict[str, tuple[int, int]] | None:
    """MariaDB's performance_schema wait instruments so far, the whole server's (name: count, picoseconds),
    or None where there is none to read: PostgreSQL, or performance_schema off (it is a server start
    option). Only the instruments enabled count (InnoDB's latches need
    `performance_schema_instrument='wait/synch/%=ON'`)."""
    if dialect != "mysql":
        return None
    cursor = conn.cursor()
    cursor.execute("SELECT @@performance_schema")
    (enabled,) = cursor.fetchone()
    if not int(enabled):
        return None
    cursor.execute(
        "SELECT EVENT_NAME, COUNT_STAR, SUM_TIMER_WAIT "
        "FROM performance_schema.events_waits_summary_global_by_event_name WHERE COUNT_STAR > 0"
    )
    return {str(name): (int(count), int(picoseconds)) for name, count, picoseconds in cursor.fetchall()}


def waits_per_job(
    before: dict[str, tuple[int, int]] | None, after: dict[str, tuple[int, int]] | None, jobs: int
) -> dict[str, Any]:
    """{"server_waits": the TOP_WAITS instruments by time a job between two server_waits readings, each
    with its count and µs a job}, or nothing where the server gave none. `idle` (a connection waiting for
    its client) is left out: it is the states' to say."""
    if before is None or after is None:
        return {}
    spent = {
        name: (count - before.get(name, (0, 0))[0], picoseconds - before.get(name, (0, 0))[1])
        for name, (count, picoseconds) in after.items()
        if name != "idle"
    }
    top = sorted(spent.items(), key=lambda item: -item[1][1])[:TOP_WAITS]
    return {
        "server_waits": {
            name: {"per_job": count / jobs, "us_per_job": picoseconds / 1e6 / jobs}
            for name, (count, picoseconds) in top
        }
    }


# What the limit's mariadb-slap is told to expect (it runs a fixed number of calls, not for a time): about
# what a 2-core machine's MariaDB reaches at one job a commit, more with more a commit.
_SLAP_JOBS_PER_S: Final = 1_500.0


def probe_limit(
    dsn: str, point: tuple[int, int, int], seconds: int, preload: int, suffix: str = "_limitprobe"
) -> dict[str, Any]:
    """The server's limit at the point (benchmarks.server_limit's, with its client's and server's CPU a
    job), and the machine's idle share and the whole server's CPU over its run."""
    processes, threads, batch = point
    spec = BackendSpec(f"conformance.builtin:{_dialect_factory(dsn)}", {"dsn": dsn})
    harness = open_harness(spec, "probe", suffix)
    _, dialect = require_sql(harness)
    try:
        QueueFiller(harness, preload).top_up()
        with contextlib.ExitStack() as cleanup:
            claim_pages = ClaimPages(harness, dialect, batch)
            cleanup.callback(claim_pages.stop)
            conn = cleanup.enter_context(contextlib.closing(_connect(harness, dialect)))
            machine0 = MachineReading.take(conn, dialect)
            claim_pages.start()
            result = limit_rate(harness, processes * threads, batch, seconds, _SLAP_JOBS_PER_S * batch**0.67)
            claim_pages.stop()
            machine1 = MachineReading.take(conn, dialect)
    finally:
        harness.close()
    jobs = result["jobs"]
    if result["ran_dry"] or jobs <= 0:
        raise RuntimeError(f"the queue of {preload} jobs ran dry under the limit: a larger --preload")
    per_job = result["per_job"]
    server = per_job.get("server_cpu_us", math.nan)
    # pgbench's backends began and ended within the run: server_cpu_between leaves them to limit_rate's
    # reading; MariaDB's threads are its one process's.
    ended = server if dialect == "postgresql" else 0.0
    server_all_cpu, machine = machine0.until(machine1, jobs)
    return {
        "point": list(point),
        "factory": "limit",
        "dialect": dialect,
        "jobs": jobs,
        "jobs_per_s": result["jobs_per_s"],
        "per_job_us": {
            "client_cpu": per_job["client_cpu_us"],
            "server_cpu": server,
            "server_all_cpu": server_all_cpu + ended,
        },
        "kernel_share": result.get("kernel_share", {}),
        **claim_pages.result(),
        **machine,
    }


def _by_point_and_drain(
    results: list[dict[str, Any]], keep: Callable[[dict[str, Any]], bool]
) -> dict[tuple[tuple[int, ...], str], list[dict[str, Any]]]:
    """The readings `keep` keeps, by (point, drain), each group in the rounds' order: a table's rows."""
    groups: dict[tuple[tuple[int, ...], str], list[dict[str, Any]]] = collections.defaultdict(list)
    for result in results:
        if keep(result):
            groups[(tuple(result["point"]), result["factory"])].append(result)
    return groups


def _row(point: tuple[int, ...], factory: str, cells: list[str]) -> str:
    """A table's markdown row: the point, the drain, then `cells`."""
    return "| " + " | ".join(["x".join(str(n) for n in point), factory, *cells]) + " |"


def table(results: list[dict[str, Any]]) -> str:
    """The probe's markdown table: medians over the rounds of each (point, drain), and each of library
    jobs/s over the same round's limit. Readings that have the cores' idle share and the whole server's
    CPU (this probe's since they were added) get those columns too."""
    groups = _by_point_and_drain(results, lambda _: True)
    wide = all("cores_idle" in r for r in results)
    # Readings since the kernel's share was kept (the limit's never has it).
    split = all("kernel_share" in r for r in results if r["factory"] != "limit")
    costs = _COSTS + (("server_all_cpu",) if wide else ())
    lines = [
        "| processes x threads x jobs/commit | drain | jobs/s | of limit | client CPU µs/job | "
        "client run queue µs/job | server CPU µs/job | server run queue µs/job | "
        + ("whole server CPU µs/job | cores idle | " if wide else "")
        + ("client CPU in the kernel | server CPU in the kernel | " if split else "")
        + "backends waiting on the client | on a lock | empty claims |",
        "|---|---|---|---|---|---|---|---|---|---|---|"
        + ("---|---|" if wide else "")
        + ("---|---|" if split else ""),
    ]
    for (point, factory), runs in groups.items():
        limits = [r for r in results if tuple(r["point"]) == point and r["factory"] == "limit"]
        ratios = [run["jobs_per_s"] / lim["jobs_per_s"] for run, lim in zip(runs, limits, strict=False)]
        per_job = {k: statistics.median(r["per_job_us"].get(k, math.nan) for r in runs) for k in costs}
        states = [r.get("backend_states") or {} for r in runs]
        client = statistics.median(sum(v for k, v in s.items() if waiting_on_client(k)) for s in states)
        locked = statistics.median(sum(v for k, v in s.items() if waiting_on_lock(k)) for s in states)
        polls = [r["polls"] for r in runs if r.get("polls")]
        empty = f"{sum(p.get('empty', 0) for p in polls)} of {sum(sum(p.values()) for p in polls)}"
        cells = [
            f"{statistics.median(r['jobs_per_s'] for r in runs):,.0f}",
            "-" if factory == "limit" else f"{statistics.median(ratios):.2f}",
            *("-" if math.isnan(per_job[k]) else f"{per_job[k]:,.0f}" for k in costs),
            *([f"{statistics.median(r['cores_idle'] for r in runs):.2f}"] if wide else []),
            *(_kernel_cells(runs) if split else []),
            "-" if factory == "limit" else f"{client:.2f}",
            "-" if factory == "limit" else f"{locked:.3f}",
            empty if polls else "-",
        ]
        lines.append(_row(point, factory, cells))
    return "\n".join(lines)


def _kernel_cells(runs: list[dict[str, Any]]) -> list[str]:
    """The medians of the client's and the server's kernel shares over `runs` ("-" where a side's is not
    read: the limit's before it was, a server on another host's)."""
    shares = [r.get("kernel_share", {}) for r in runs]
    return [
        f"{statistics.median(s[side] for s in shares):.2f}" if all(side in s for s in shares) else "-"
        for side in ("client", "server")
    ]


def status_table(results: list[dict[str, Any]]) -> str | None:
    """The table of the readings' server_status (MariaDB's): medians over the rounds of each (point,
    drain), each counter a job and the purge backlog at the window's end; None where none has them."""
    groups = _by_point_and_drain(results, lambda r: "server_status" in r)
    if not groups:
        return None
    lines = [
        "| processes x threads x jobs/commit | drain | "
        + " | ".join(f"{_STATUS_HEADINGS[name]} a job" for name in STATUS_COUNTERS)
        + " | purge backlog at the end |",
        "|---|---|" + "---|" * (len(STATUS_COUNTERS) + 1),
    ]
    for (point, factory), runs in groups.items():
        status = [r["server_status"] for r in runs]
        cells = [
            *(f"{statistics.median(s[name] for s in status):,.1f}" for name in STATUS_COUNTERS),
            f"{statistics.median(s['Innodb_history_list_length'][1] for s in status):,.0f}",
        ]
        lines.append(_row(point, factory, cells))
    return "\n".join(lines)


def claims_table(results: list[dict[str, Any]]) -> str | None:
    """The table of the readings' sampled claims (ClaimPages): medians over the rounds of each (point,
    drain) of the claims' medians; None where no reading has them."""
    groups = _by_point_and_drain(results, lambda r: bool(r.get("claims", {}).get("samples")))
    if not groups:
        return None
    lines = [
        "| processes x threads x jobs/commit | drain | claims sampled | pages a claim | rows a claim | "
        "pages a row claimed |",
        "|---|---|---|---|---|---|",
    ]
    for (point, factory), runs in groups.items():
        claims = [r["claims"] for r in runs]
        cells = [
            str(sum(c["samples"] for c in claims)),
            *(
                f"{statistics.median(c[key] for c in claims):,.1f}"
                for key in ("pages", "rows", "pages_per_row")
            ),
        ]
        lines.append(_row(point, factory, cells))
    return "\n".join(lines)


_STATUS_HEADINGS: Final = {
    "Innodb_buffer_pool_read_requests": "pages read",
    "Handler_read_key": "index reads by key",
    "Handler_read_next": "index reads next",
    "Handler_write": "rows written",
    "Handler_delete": "rows deleted",
    "Innodb_row_lock_waits": "row lock waits",
}


def top_states(
    results: list[dict[str, Any]], point: list[int], drain: str, most: int = 4
) -> list[tuple[str, float]]:
    """The states sampled most often serving `drain` at `point`, each its mean share over the rounds."""
    runs = [r for r in results if r["point"] == point and r["factory"] == drain and r.get("backend_states")]
    shares: collections.Counter[str] = collections.Counter()
    for run in runs:
        for state, share in run["backend_states"].items():
            shares[state] += share / len(runs)
    return [(state, round(share, 3)) for state, share in shares.most_common(most)]


_COSTS: Final = ("client_cpu", "client_runqueue", "server_cpu", "server_runqueue")


def _probe_one(
    dsn: str, drain: str, point: tuple[int, int, int], window: float, preload: int
) -> dict[str, Any]:
    if drain == "limit":
        return probe_limit(dsn, point, max(1, round(window)), preload)
    return probe(dsn, drain, point, window, preload)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limit_probe", description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--table", type=Path, help="print the table of a probe's JSON and exit")
    parser.add_argument(
        "--factory", default="postgresql", help="drains, comma-separated: limit, FACTORY or FACTORY:MODE"
    )
    parser.add_argument("--point", action="append", help="PxT or PxTxN; repeatable")
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--preload", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.table:
        results = load(args.table)
        print(table(results))
        for more in (status_table(results), claims_table(results)):
            if more is not None:
                print()
                print(more)
        return
    if not args.dsn or not args.point:
        parser.error("--dsn and --point are needed to probe")
    drains = args.factory.split(",")
    for drain in drains:
        if drain != "limit":
            try:
                parse_drain(drain)
            except ValueError as error:
                parser.error(str(error))
    # Read before the first drain: the load average at the start is the machine's, not the probe's.
    meta = describe([BackendSpec(f"conformance.builtin:{_dialect_factory(args.dsn)}", {"dsn": args.dsn})])
    results = []
    for _ in range(args.rounds):
        for text in args.point:
            parts = [int(p) for p in text.split("x")]
            point = (parts[0], parts[1], parts[2] if len(parts) > 2 else 1)
            for drain in drains:
                result = _probe_one(args.dsn, drain, point, args.window, args.preload)
                print(json.dumps(result), flush=True)
                results.append(result)
    if args.out:
        save(args.out, meta, results)


def save(path: Path, meta: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """Write a probe's JSON (what load reads): its `meta` with the machine at its end, and its readings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta["machine_at_end"] = machine()
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n", encoding="utf-8")


def load(path: Path) -> list[dict[str, Any]]:
    """A probe's readings from its JSON: {"meta", "results"}, or the bare list probes wrote before they
    named their machine and commit."""
    document = json.loads(path.read_text(encoding="utf-8"))
    return cast(list[dict[str, Any]], document["results"] if isinstance(document, dict) else document)


def _dialect_factory(dsn: str) -> str:
    """The conformance.builtin factory of the DSN's database: its limit and its server's version."""
    return "postgresql" if dsn.startswith("postgres") else "mysql"


if __name__ == "__main__":
    main()
