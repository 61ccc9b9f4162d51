"""The benchmarks' tools for issue 31's limit runs: --limit-points, round trips, benchmarks.limit_probe."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from fix_db import table_suffix

# The bench extra (psutil among it): without it the benchmarks package would not import.
for _module in ("matplotlib", "psutil", "rich"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"needs the bench extra ({_module}): pip install -e '.[bench]'", allow_module_level=True)

from benchmarks.settings import TINY  # noqa: E402


def test_limit_points_drain_only_the_rows_named_each_with_its_limit_drain() -> None:
    from benchmarks.__main__ import limit_points_settings

    settings = limit_points_settings(TINY.with_(batch_size=10), "1x4, 4x4,1x4x10,2x2x10")
    assert settings.limit_points == ((1, 4, 1), (4, 4, 1), (1, 4, 10), (2, 2, 10))
    assert settings.thread_counts == (4,)
    assert settings.process_configs == ((4, 4),)
    assert settings.batch_configs == ((1, 4), (2, 2))


@pytest.mark.parametrize("text", ["1x4x3", "4", "0x4", "1xfour", ""])
def test_limit_points_refuse_what_is_not_a_row_naming_it(text: str) -> None:
    from benchmarks.__main__ import limit_points_settings

    with pytest.raises(ValueError, match=f"^{text!r}"):
        limit_points_settings(TINY.with_(batch_size=10), text)


@pytest.mark.postgresql
def test_round_trips_count_psycopgs_begin_apart_from_the_statement_it_opens(pg_dsn: str) -> None:
    import psycopg

    from benchmarks.costs import RoundTrips

    trips = RoundTrips()
    with (
        psycopg.connect(pg_dsn) as conn,
        psycopg.connect(pg_dsn, autocommit=True) as auto,
        trips.installed(),
    ):
        conn.execute("SELECT 1")  # BEGIN, then the SELECT: two round trips in one wait
        conn.execute("SELECT 2")
        conn.commit()
        in_transaction = trips.count
        auto.execute("SELECT 3")  # no BEGIN sent, none counted
        autocommit = trips.count - in_transaction
    assert (in_transaction, autocommit) == (4, 1)


@pytest.mark.postgresql
def test_round_trips_count_a_pipelines_exchanges_not_its_statements(pg_dsn: str) -> None:
    import psycopg

    from benchmarks.costs import RoundTrips

    trips = RoundTrips()
    with psycopg.connect(pg_dsn) as conn, conn.pipeline() as pipeline:
        cursor = conn.cursor()
        # The transaction's first statement: psycopg queues its BEGIN and syncs at once, an exchange of
        # its own; then every statement runs in that transaction.
        with trips.installed():
            cursor.execute("SELECT 0")
            begun = trips.count
        pipeline.sync()
        trips = RoundTrips()
        with trips.installed():
            for n in range(3):
                cursor.execute("SELECT %s::int", (n,))
            assert cursor.fetchone() == (2,)  # one flush request: the three statements' results come back
            flushed = trips.count
            cursor.execute("SELECT 3")
            cursor.execute("SELECT 4")
            pipeline.sync()  # one Sync, both results with it
            synced = trips.count - flushed
    assert (begun, flushed, synced) == (1, 1, 1)


@pytest.mark.postgresql
def test_round_trips_count_each_exchange_of_asyncpg_on_the_asyncio_loop(pg_dsn: str) -> None:
    import asyncio

    import asyncpg

    from benchmarks.costs import RoundTrips

    trips = RoundTrips()

    async def exchanges() -> tuple[int, int]:
        conn = await asyncpg.connect(pg_dsn)
        try:
            connecting = trips.count
            await conn.execute("SELECT 1")
            alone = trips.count - connecting
            transaction = conn.transaction()
            await transaction.start()  # BEGIN
            await conn.execute("SELECT 2")
            await transaction.commit()  # COMMIT
            return alone, trips.count - alone - connecting
        finally:
            await conn.close()

    with trips.installed():
        counted = asyncio.run(exchanges())
    assert counted == (1, 3)


@pytest.mark.postgresql
def test_round_trips_count_psycopgs_async_connection_as_its_threaded_one(pg_dsn: str) -> None:
    import asyncio

    import psycopg

    from benchmarks.costs import RoundTrips

    trips = RoundTrips()

    async def exchanges() -> tuple[int, int]:
        conn = await psycopg.AsyncConnection.connect(pg_dsn)
        try:
            await conn.execute("SELECT 1")  # BEGIN, then the SELECT
            await conn.commit()
            plain = trips.count
            async with conn.pipeline() as pipeline:
                cursor = conn.cursor()
                await cursor.execute("SELECT 0")  # BEGIN's own sync
                await pipeline.sync()
                for n in range(3):
                    await cursor.execute("SELECT %s::int", (n,))
                assert await cursor.fetchone() == (2,)  # one flush request
                await conn.commit()  # COMMIT and a Sync
                pipelined = trips.count - plain
            return plain, pipelined
        finally:
            await conn.close()

    with trips.installed():
        counted = asyncio.run(exchanges())
    assert counted == (3, 4)


@pytest.mark.postgresql
@pytest.mark.parametrize("uvloop", [False, True])
def test_the_asyncio_chain_drain_takes_one_exchange_a_job_on_either_event_loop(
    pg_dsn: str, uvloop: bool
) -> None:
    import asyncio
    import time

    from benchmarks.async_drain import AsyncDrainer
    from benchmarks.common import BackendSpec, analyze, bulk_load, open_harness
    from benchmarks.costs import RoundTrips

    spec = BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn})
    harness = open_harness(spec, "achx", f"_ac{table_suffix()}")
    jobs = 600
    done: list[None] = []
    loops: set[str] = set()

    def on_job() -> None:
        # Called in the handler, on the drain's running loop.
        loops.add(type(asyncio.get_running_loop()).__module__.split(".")[0])
        done.append(None)

    trips = RoundTrips()
    try:
        bulk_load(harness, 0, jobs, "due")
        analyze(harness)
        with trips.installed():
            drainer = AsyncDrainer(harness, 1, 50.0, on_job, chain=True, uvloop=uvloop)
            drainer.start()
            try:
                deadline = time.monotonic() + 60
                while len(done) < jobs and time.monotonic() < deadline:
                    time.sleep(0.01)
                counted = trips.count
            finally:
                drainer.stop()
    finally:
        harness.clear()
        harness.close()
    assert len(done) == jobs
    assert loops == {"uvloop" if uvloop else "asyncio"}
    # The worker's first poll, the listener's and connections' setup aside: one exchange a job, counted
    # at psycopg's own waits whichever loop runs them.
    assert jobs <= counted < jobs * 1.1


def test_the_asyncio_chain_drains_on_uvloop_only_where_it_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from benchmarks.async_drain import uvloop_skip_reason
    from benchmarks.throughput import _limit_drain_points

    settings = TINY.with_(throughput_async=True, limit_points=((1, 2, 1),))
    points = _limit_drain_points(settings, None, None, chain=True, pipeline=False, uvloop_reason=None)
    assert points["async_chain_uvloop"] == points["async_chain"] == {(1, 2, 1)}
    monkeypatch.setitem(sys.modules, "uvloop", None)  # find_spec finds nothing
    reason = uvloop_skip_reason()
    assert reason is not None and "pip install 'proletarian-ref[uvloop]'" in reason
    points = _limit_drain_points(settings, None, None, chain=True, pipeline=False, uvloop_reason=reason)
    assert points["async_chain_uvloop"] == set() and points["async_chain"] == {(1, 2, 1)}


def test_the_asyncio_chain_on_uvloop_drains_right_after_the_one_on_asyncios_loop() -> None:
    from benchmarks.throughput import _row_modes, drain_order

    modes = _row_modes(
        ["library", "raw"], compact=True, chain=True, asyncio=True, async_chain=True, async_chain_uvloop=True
    )
    # Back to back in both directions, so their paired ratio (uvloop_ratio) is of neighbouring drains.
    for round_ in (0, 1):
        order = drain_order(modes, round_)
        assert abs(order.index("async_chain_uvloop") - order.index("async_chain")) == 1


_PER_JOB: Final = {"client_cpu", "client_runqueue", "server_cpu", "server_runqueue", "server_all_cpu"}


@pytest.mark.postgresql
def test_the_limit_probe_reads_a_drains_costs_states_and_polls(pg_dsn: str) -> None:
    from benchmarks import limit_probe

    result = limit_probe.probe(pg_dsn, "postgresql", (1, 1, 10), 1.0, 20_000, f"_lp{table_suffix()}")
    assert result["jobs"] > 0
    assert set(result["per_job_us"]) == _PER_JOB
    assert result["polls"]["claims"] > 0
    assert abs(sum(result["backend_states"].values()) - 1) < 0.01
    assert 0 <= result["cores_idle"] <= 1
    assert_kernel_shares(result)
    # A claim sampled as the server accounts for it: EXPLAIN (ANALYZE, BUFFERS)'s blocks, its rows at most
    # the batch's ten.
    assert_claims_sampled(result["claims"], batch=10)


def test_the_limit_probe_reads_a_threads_kernel_time_apart_from_its_own() -> None:
    from benchmarks.limit_probe import _schedstat, kernel_seconds

    def share_of(work: Callable[[], object]) -> float:
        found: list[float] = []

        def run() -> None:
            path = f"/proc/{os.getpid()}/task/{threading.get_native_id()}"
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                work()
            found.append(kernel_seconds(path) / _schedstat(path)[0])

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return found[0]

    # 64 KiB the kernel writes at every call, and arithmetic that never leaves Python.
    zeros = os.open("/dev/zero", os.O_RDONLY)
    try:
        assert share_of(lambda: os.read(zeros, 1 << 16)) > 0.5
    finally:
        os.close(zeros)
    assert share_of(lambda: sum(range(100))) < 0.2


def test_the_limit_probe_reads_stime_after_a_command_name_with_parentheses(tmp_path: Path) -> None:
    from benchmarks.limit_probe import kernel_seconds

    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    (tmp_path / "stat").write_text("42 (a) b (c) S 1 42 42 0 -1 4194304 10 0 0 0 700 250 0 0 20 0 1 0\n")
    assert kernel_seconds(str(tmp_path)) == 250 / os.sysconf("SC_CLK_TCK")
    assert kernel_seconds(str(tmp_path / "gone")) == 0.0


def assert_claims_sampled(claims: dict[str, Any], batch: int) -> None:
    assert claims["samples"] > 0, claims
    assert 0 < claims["rows"] <= batch and claims["pages"] > 0
    # Each sample's pages a row is at least its pages over the batch, so the medians are too (to the float).
    assert claims["pages_per_row"] >= claims["pages"] / batch * (1 - 1e-9)


@pytest.mark.postgresql
def test_the_limit_probe_drains_on_the_asyncio_worker_and_leaves_a_chains_claims_uncounted(
    pg_dsn: str,
) -> None:
    from benchmarks import limit_probe

    result = limit_probe.probe(
        pg_dsn, "postgresql:async_chain", (1, 2, 1), 1.0, 20_000, f"_la{table_suffix()}"
    )
    assert result["jobs"] > 0
    # A chained claim is made inside run_next_job's call: counting the calls would count no claim.
    assert result["polls"] is None
    # The two tasks' connections and the worker's listener's, not the probe's own (which would be "active"
    # in every sample).
    assert result["connections"] == 3
    assert abs(sum(result["backend_states"].values()) - 1) < 0.01


def _performance_schema_on(mysql_dsn: str) -> bool:
    import pymysql

    from proletarian_ref.backends.dsn import mysql_connect_kwargs

    conn = pymysql.connect(**mysql_connect_kwargs(mysql_dsn))
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT @@performance_schema")
        (enabled,) = cursor.fetchone()
        return bool(int(enabled))
    finally:
        conn.close()


def test_the_limit_probe_keeps_the_instruments_with_the_most_time_a_job_idle_aside() -> None:
    from benchmarks.limit_probe import TOP_WAITS, waits_per_job

    before = {"idle": (1, 10**9), "a": (10, 10**6), "b": (0, 0)}
    after = {"idle": (9, 9 * 10**9), "a": (30, 5 * 10**6), "b": (4, 8 * 10**6), "new": (2, 10**6)}
    after |= {f"small{i}": (1, i) for i in range(TOP_WAITS)}
    waits = waits_per_job(before, after, jobs=2)["server_waits"]
    assert list(waits)[:3] == ["b", "a", "new"] and len(waits) == TOP_WAITS
    assert waits["b"] == {"per_job": 2.0, "us_per_job": 4.0}
    assert waits["a"] == {"per_job": 10.0, "us_per_job": 2.0}
    assert waits_per_job(None, after, jobs=2) == {} == waits_per_job(before, None, jobs=2)


@pytest.mark.mysql
def test_the_limit_probe_samples_only_a_mariadb_drains_own_connections(mysql_dsn: str) -> None:
    from benchmarks import limit_probe

    result = limit_probe.probe(mysql_dsn, "mysql", (1, 2, 10), 1.0, 20_000, f"_lm{table_suffix()}")
    assert result["jobs"] > 0 and result["connections"] == 2
    assert set(result["per_job_us"]) == _PER_JOB
    assert result["per_job_us"]["server_cpu"] > 0
    # The probe's own connection, reading PROCESSLIST, would sample as "Filling schema table".
    assert not [state for state in result["backend_states"] if "schema table" in state]
    assert result["polls"]["claims"] > 0
    # The server's wait instruments where performance_schema is on (a server start option), else none.
    assert ("server_waits" in result) == _performance_schema_on(mysql_dsn)
    # MariaDB's ANALYZE FORMAT=JSON's pages a table read (r_engine_stats).
    assert_claims_sampled(result["claims"], batch=10)
    # InnoDB's counters a job, always: each job deletes its row (other sessions' deletes only add).
    status = result["server_status"]
    assert status["Handler_delete"] >= 0.8 and status["Innodb_buffer_pool_read_requests"] > 0
    assert [type(n) for n in status["Innodb_history_list_length"]] == [int, int]


@pytest.mark.mysql
def test_the_sampled_claim_runs_at_the_isolation_level_of_the_workers_own_claims(mysql_dsn: str) -> None:
    from benchmarks.common import BackendSpec, open_harness
    from benchmarks.limit_probe import ClaimPages

    harness = open_harness(
        BackendSpec("conformance.builtin:mysql", {"dsn": mysql_dsn}), "iso", f"_ci{table_suffix()}"
    )
    claim = ClaimPages(harness, "mysql", 10)
    try:
        cursor = claim._conn.cursor()
        cursor.execute("SELECT @@SESSION.tx_isolation")
        assert cursor.fetchone() == ("READ-COMMITTED",)
    finally:
        claim.stop()
        claim.stop()  # a second stop does nothing
        harness.close()


@pytest.mark.mysql
def test_the_limit_probes_limit_on_mariadb_counts_the_whole_servers_cpu(mysql_dsn: str) -> None:
    from benchmarks import limit_probe

    result = limit_probe.probe_limit(mysql_dsn, (1, 2, 10), 1, 20_000, f"_ll{table_suffix()}")
    costs = result["per_job_us"]
    assert result["jobs"] > 0 and costs["server_cpu"] > 0
    # The whole server is its connections' threads and its background threads, in one process.
    assert costs["server_all_cpu"] >= costs["server_cpu"] * 0.95
    assert 0 <= result["cores_idle"] <= 1
    assert result["server_status"]["Handler_delete"] >= 0.8
    assert_claims_sampled(result["claims"], batch=10)
    assert_kernel_shares(result, tool=True)


def assert_kernel_shares(result: dict[str, Any], *, tool: bool = False) -> None:
    """The client (a drain, or the limit's tool) and its connections' server side send and read every
    claim through system calls: both spend some of their CPU in the kernel. A drain's are read from /proc
    (stat's ticks are samples of schedstat's exact time, so a share may overshoot 1), the tool's from its
    exit (wait4's system time, split from its user time by the same ticks: a tool that ran a few
    milliseconds of CPU may have had every tick land in user time, a share of 0)."""
    shares = result["kernel_share"]
    assert set(shares) == {"client", "server"}, shares
    assert 0 < shares["server"] < 1.5, shares
    lowest = 0.0 if tool else 1e-9  # a drain's share is never 0; a short-lived tool's may be
    assert lowest <= shares["client"] < 1.5, shares


@pytest.mark.postgresql
def test_the_limit_probes_limit_on_postgresql_keeps_the_cpu_of_pgbenchs_ended_backends(pg_dsn: str) -> None:
    from benchmarks import limit_probe

    result = limit_probe.probe_limit(pg_dsn, (1, 2, 1), 1, 20_000, f"_ll{table_suffix()}")
    costs = result["per_job_us"]
    assert result["jobs"] > 0 and costs["server_cpu"] > 0
    assert costs["server_all_cpu"] >= costs["server_cpu"]
    assert_claims_sampled(result["claims"], batch=1)
    assert_kernel_shares(result, tool=True)
    # PostgreSQL's statistics reach its views up to a second late: none is read for a window.
    assert "server_status" not in result and "server_waits" not in result


def test_the_limit_probe_sums_the_pages_of_every_table_mariadbs_analyze_names() -> None:
    from benchmarks.limit_probe import _tables, claims_table

    document = {
        "query_block": {
            "nested_loop": [
                {"table": {"table_name": "job", "r_rows": 10, "r_engine_stats": {"pages_accessed": 22}}},
                {"block": {"table": {"table_name": "other", "r_engine_stats": {"pages_accessed": 3}}}},
            ]
        }
    }
    assert [t["table_name"] for t in _tables(document)] == ["job", "other"]
    rounds = [
        {
            "point": [1, 1, 10],
            "factory": "mysql",
            "claims": {"samples": n, "pages": p, "rows": 10, "pages_per_row": p / 10},
        }
        for n, p in ((30, 20.0), (40, 50.0), (20, 30.0))
    ]
    printed = claims_table([*rounds, {"point": [1, 1, 10], "factory": "limit", "claims": {"samples": 0}}])
    assert printed is not None
    assert printed.splitlines()[2] == "| 1x1x10 | mysql | 90 | 30.0 | 10.0 | 3.0 |"
    assert claims_table([{"point": [1, 1, 1], "factory": "limit"}]) is None


def test_the_limit_probe_reads_innodbs_counters_a_job_and_its_purge_backlog_at_both_ends() -> None:
    from benchmarks.limit_probe import STATUS_COUNTERS, status_per_job, status_table

    before = dict.fromkeys(STATUS_COUNTERS, 100) | {"Innodb_history_list_length": 7}
    after = dict.fromkeys(STATUS_COUNTERS, 160) | {"Innodb_history_list_length": 90}
    status = status_per_job(before, after, jobs=20)["server_status"]
    assert status == dict.fromkeys(STATUS_COUNTERS, 3.0) | {"Innodb_history_list_length": [7, 90]}
    assert status_per_job(None, after, jobs=20) == {} == status_per_job(before, None, jobs=20)
    rounds = [
        {"point": [4, 4, 10], "factory": drain, "server_status": status | {"Handler_delete": deletes}}
        for drain, deletes in (("limit", 1.0), ("mysql", 1.5), ("limit", 2.0), ("mysql", 0.5), ("mysql", 1.2))
    ]
    printed = status_table([*rounds, {"point": [1, 1, 1], "factory": "postgresql"}])
    assert printed is not None
    header, _, limit, mysql = printed.splitlines()
    assert "| pages read a job |" in header and header.endswith("| purge backlog at the end |")
    # Medians over the rounds of each drain: rows deleted a job 1.5 (limit), 1.2 (mysql).
    assert limit == "| 4x4x10 | limit | 3.0 | 3.0 | 3.0 | 3.0 | 1.5 | 3.0 | 90 |"
    assert mysql == "| 4x4x10 | mysql | 3.0 | 3.0 | 3.0 | 3.0 | 1.2 | 3.0 | 90 |"
    assert status_table([{"point": [1, 1, 1], "factory": "postgresql"}]) is None


@pytest.mark.parametrize("text", ["", ":async", "postgresql:raw", "postgresql:threads"])
def test_the_limit_probe_refuses_a_drain_it_cannot_run_naming_it(text: str) -> None:
    from benchmarks.limit_probe import parse_drain

    with pytest.raises(ValueError, match=f"^{text!r} is not a drain"):
        parse_drain(text)


def test_the_limit_probe_reads_its_named_files_and_the_bare_lists_before_them(tmp_path: Path) -> None:
    from benchmarks.limit_probe import load

    rows = [{"point": [1, 1, 1], "factory": "limit"}]
    (tmp_path / "old.json").write_text(json.dumps(rows), encoding="utf-8")
    (tmp_path / "new.json").write_text(json.dumps({"meta": {"git": {}}, "results": rows}), encoding="utf-8")
    assert load(tmp_path / "old.json") == load(tmp_path / "new.json") == rows


def _mysql_drain_server_cpu(mysql_dsn: str) -> tuple[float, str | None]:
    """Server CPU seconds a one-process MariaDB drain of 2 threads took for 1,500 jobs, and the reason."""
    import time

    from benchmarks.common import BackendSpec, analyze, bulk_load, open_harness
    from benchmarks.costs import ServerCpu
    from benchmarks.workers import DrainRun

    spec = BackendSpec("conformance.builtin:mysql", {"dsn": mysql_dsn})
    harness = open_harness(spec, "cpu", f"_sc{table_suffix()}")
    try:
        bulk_load(harness, 0, 2_000, "due")
        analyze(harness)
        run = DrainRun(harness, spec, "library", 1, 2, 100.0)
        run.start()
        try:
            while run.count == 0:
                time.sleep(0.01)
            server = ServerCpu(harness, run.pids)
            before = server.seconds()
            while run.count < 1_500:
                time.sleep(0.01)
            return server.seconds() - before, server.reason
        finally:
            run.stop()
    finally:
        harness.close()


@pytest.mark.mysql
def test_a_mariadb_drains_server_cpu_is_read_from_its_connections_threads(mysql_dsn: str) -> None:
    seconds, reason = _mysql_drain_server_cpu(mysql_dsn)
    assert reason is None
    assert seconds > 0


@pytest.mark.mysql
def test_mariadb_server_cpu_says_why_when_no_column_names_a_connections_thread(
    mysql_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import costs
    from benchmarks.common import BackendSpec
    from benchmarks.costs import server_cpu_reason

    harness = BackendSpec("conformance.builtin:mysql", {"dsn": mysql_dsn}).load("t", "a")
    # As on MySQL 8 with performance_schema off: neither TID nor THREAD_OS_ID to read.
    monkeypatch.setattr(
        costs, "_MYSQL_THREAD_QUERIES", ("SELECT NO_SUCH_TID FROM information_schema.PROCESSLIST",)
    )
    reason = server_cpu_reason(harness)
    assert reason is not None and "THREAD_OS_ID" in reason
    assert costs.ServerCpu(harness, [os.getpid()]).reason == reason


@pytest.mark.mysql
def test_mariadb_server_cpu_says_why_when_the_server_is_not_a_local_process(
    mysql_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import costs

    monkeypatch.setattr(costs, "_SERVER_NAMES", ())
    seconds, reason = _mysql_drain_server_cpu(mysql_dsn)
    assert reason is not None and "not this machine's" in reason
    assert seconds == 0


@pytest.mark.parametrize(
    ("factory", "dsn_fixture"),
    [
        pytest.param("postgresql", "pg_dsn", marks=pytest.mark.postgresql),
        pytest.param("mysql", "mysql_dsn", marks=pytest.mark.mysql),
    ],
)
def test_the_asyncio_worker_drains_each_limit_point_with_its_ratio_and_costs(
    factory: str, dsn_fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from benchmarks.__main__ import limit_points_settings
    from benchmarks.async_drain import ASYNC_CHAIN_BACKENDS
    from benchmarks.common import BackendSpec
    from benchmarks.progress import Progress
    from benchmarks.runner import run_all

    dsn = request.getfixturevalue(dsn_fixture)
    settings = limit_points_settings(
        TINY.with_(
            benchmarks=("throughput",),
            profile=False,
            throughput_async=True,
            table_suffix=f"_aio{table_suffix()}",
        ),
        f"1x2,1x2x{TINY.batch_size}",
    )
    results = run_all(
        [BackendSpec(f"conformance.builtin:{factory}", {"dsn": dsn})], settings, tmp_path, Progress()
    )
    (throughput,) = results["benchmarks"]["throughput"]
    assert "error" not in throughput, throughput.get("traceback")
    assert "async_skipped" not in throughput and "server_cpu_skipped" not in throughput
    for row in throughput["rows"]:
        # Each round drains with the asyncio worker too, in batch mode on the batch row.
        assert len(row["async_rounds"]) == TINY.throughput_rounds
        assert row["async_jobs_per_s"] > 0 and row["async_ratio_limit"] > 0
        assert row["async_client_cpu_us_per_job"] >= 0 and "async_server_cpu_us_per_job" in row
        # aiomysql's and asyncpg's exchanges are counted too, as the threaded drivers' are.
        assert row["async_round_trips_per_job"] > 0
        # Chained claims drain every limit point, one job a commit and batch mode's chained batches, on
        # either database, threaded and asyncio.
        # The asyncio chain again on uvloop's loop (the test extra installs it), beside asyncio's.
        for mode in ("chain", "async_chain", "async_chain_uvloop"):
            assert len(row[f"{mode}_rounds"]) == TINY.throughput_rounds
            assert row[f"{mode}_ratio_limit"] > 0 and f"{mode}_client_cpu_us_per_job" in row
        assert row["uvloop_ratio"] > 0
    assert "uvloop_skipped" not in throughput
    printed = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "| async of limit |" in printed and "| async batch |" in printed
    assert "| batch chain |" in printed and "| async batch chain |" in printed
    assert "| async chain uvloop of limit |" in printed and "| async batch chain uvloop |" in printed
    assert "async chain uvloop / async chain" in printed
    assert throughput["async_chain_backend"] == ASYNC_CHAIN_BACKENDS[factory]
    if factory == "postgresql":
        # Proletarian's exact plan pipelined drains the point of one job a commit, against pgbench too.
        (single,) = [row for row in throughput["rows"] if row.get("batch_size", 1) == 1]
        assert len(single["pipeline_rounds"]) == TINY.throughput_rounds
        assert single["pipeline_ratio_pgbench"] > 0 and single["pipeline_round_trips_per_job"] > 0
        assert "| pipeline of pgbench |" in printed and "| pipeline |" in printed
        # And on the asyncio worker, the backend's own exchanges: three a job, as the threaded one's.
        assert len(single["async_pipeline_rounds"]) == TINY.throughput_rounds
        assert single["async_pipeline_ratio_pgbench"] > 0
        assert 2.5 < single["async_pipeline_round_trips_per_job"] < 3.5
        assert 2.5 < single["pipeline_round_trips_per_job"] < 3.5
        assert throughput["async_pipeline_backend"] == "AsyncPostgresBackend(pipeline=True)"
        assert "| async pipeline of pgbench |" in printed and "| async pipeline |" in printed
        # Both chains drain pipelined, one exchange a job, the asyncio one on psycopg, and the report says so.
        assert throughput["chain_factory"] == "conformance.builtin:postgresql_pipeline_chain"
        assert "asyncio worker (psycopg's AsyncConnection)" in printed
        assert "Both chains are pipelined" in printed
    else:
        # One multi-statement query a job, the asyncio one on aiomysql, and the report says so.
        assert throughput["chain_factory"] == "conformance.builtin:mysql_chain"
        assert "pipeline_rounds" not in throughput["rows"][0] and "pipeline of pgbench" not in printed
        assert "async_pipeline_rounds" not in throughput["rows"][0]
        assert "async_pipeline_backend" not in throughput
        assert "both on MySQL too" in printed
        assert "the asyncio worker's on aiomysql" in printed


def test_quick_mode_leaves_the_asyncio_drain_out_and_full_mode_runs_it() -> None:
    from benchmarks.settings import FULL, QUICK

    assert (QUICK.throughput_async, FULL.throughput_async) == (False, True)


def test_a_runs_git_record_names_the_paths_its_tree_changed(tmp_path: Path) -> None:
    import subprocess

    from benchmarks.machine import git_revision

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    for name in ("lib.py", "test_lib.py"):
        (tmp_path / name).write_text("x = 1\n", encoding="utf-8")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    assert git_revision(tmp_path)["changed"] == [] and git_revision(tmp_path)["dirty"] is False
    (tmp_path / "test_lib.py").write_text("x = 2\n", encoding="utf-8")
    (tmp_path / "new.py").write_text("", encoding="utf-8")  # untracked: not the run's code
    record = git_revision(tmp_path)
    assert record["dirty"] is True and record["changed"] == ["test_lib.py"]


@pytest.mark.mysql
def test_a_claim_at_read_committed_reads_two_pages_for_each_delete_marked_entry_ahead(mysql_dsn: str) -> None:
    from benchmarks.delete_marked import LEVELS, measure, table

    results = measure(mysql_dsn, [0, 500], 3_000, 10, 2, f"_dm{table_suffix()}")
    pages = {(r["marked"], r["claim"], r["isolation"]): r["pages"] for r in results}
    committed, repeatable = LEVELS
    assert all(r["rows"] == 10 for r in results), results

    def added(claim: str, level: str) -> float:
        return float(pages[500, claim, level] - pages[0, claim, level]) / 500

    # The worker's level pays for every entry the purge has not removed; the server's default does not,
    # and neither does the library's bounded claim at the worker's level.
    assert added("classic", committed) >= 1.5, pages
    assert added("classic", repeatable) < 0.1, pages
    assert added("bounded", committed) < 0.1, pages
    assert "| 500 |" in table(results) and "pages an entry added, bounded claim, READ COMMITTED" in table(
        results
    )


@pytest.mark.mysql
def test_within_one_second_the_bounded_claim_passes_delete_marked_entries_as_proletarians_does(
    mysql_dsn: str,
) -> None:
    # Proletarian's TIMESTAMP keeps whole seconds: jobs a millisecond apart share theirs, the bound is that
    # second, and the entries deleted within it lie inside the bound (docs/mysql.md, "The bounded claim").
    from benchmarks.delete_marked import LEVELS, measure

    results = measure(mysql_dsn, [0, 500], 3_000, 10, 2, f"_dm{table_suffix()}", timedelta(milliseconds=1))
    pages = {(r["marked"], r["claim"], r["isolation"]): r["pages"] for r in results}
    committed = LEVELS[0]
    for claim in ("classic", "bounded"):
        assert (pages[500, claim, committed] - pages[0, claim, committed]) / 500 >= 1.5, pages


def test_the_limits_procedure_claims_with_the_librarys_bounded_claim() -> None:
    from benchmarks.server_limit import procedure_claim
    from proletarian_ref.backends import mysql_claim
    from proletarian_ref.tables import table_name

    job = table_name("proletarian.job")
    claim = procedure_claim(mysql_claim.statement("get_next_jobs", job, "queue"))
    assert claim.startswith("SELECT job_id\nFROM proletarian.job FORCE INDEX (`queue`)"), claim
    assert "%(" not in claim and "UTC_TIMESTAMP()" in claim and "LIMIT n\n" in claim, claim
    assert claim.count("FORCE INDEX (`queue`)") == 2, claim
    with pytest.raises(ValueError, match="does not begin with"):
        procedure_claim("SELECT job_id FROM proletarian.job")


def test_the_delete_marked_measurement_refuses_a_server_without_innodb() -> None:
    from benchmarks.delete_marked import measure

    with pytest.raises(ValueError, match="names no MariaDB or MySQL") as refused:
        measure("postgresql://postgres:secret@127.0.0.1/test", [0], 100, 10, 1)
    assert "secret" not in str(refused.value)


def test_a_saved_probe_reads_back_with_the_machine_at_its_end(tmp_path: Path) -> None:
    from benchmarks.limit_probe import load, save

    readings = [{"point": [1, 1, 1], "factory": "limit", "jobs_per_s": 1.0}]
    meta: dict[str, Any] = {"git": {"commit": "0" * 40}}
    save(tmp_path / "run" / "probe.json", meta, readings)
    assert load(tmp_path / "run" / "probe.json") == readings
    written = json.loads((tmp_path / "run" / "probe.json").read_text(encoding="utf-8"))["meta"]
    assert written["git"] == meta["git"] and written["machine_at_end"]["logical_cores"] >= 1
