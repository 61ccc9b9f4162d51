"""Smoke test of the benchmark machinery on tiny sizes: outputs exist and are well formed, never timings."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fix_db import table_suffix

# The bench extra (locust, matplotlib, psutil, rich); without it there is nothing to smoke-test, and
# the benchmarks package would not import, hence the imports after this check. locust is only looked
# up, never imported: importing it monkey-patches the whole process with gevent (the benchmarks run it
# in a subprocess).
for _module in ("locust", "matplotlib", "psutil", "rich"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"needs the bench extra ({_module}): pip install -e '.[bench]'", allow_module_level=True)

from benchmarks import instructions, peer_aio, peers, serializer, versus  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402
from benchmarks.common import (  # noqa: E402
    BackendSpec,
    BenchmarkFailure,
    bulk_load,
    closing_harness,
    count_rows,
    open_harness,
    percentile,
    require_sql,
    run_sql,
    summarize_ms,
)
from benchmarks.enqueue_rate import library_enqueue, library_enqueue_many  # noqa: E402
from benchmarks.load_test import verify  # noqa: E402
from benchmarks.poll_latency import index_check  # noqa: E402
from benchmarks.progress import Progress  # noqa: E402
from benchmarks.raw import raw_enqueue, raw_enqueue_batched  # noqa: E402
from benchmarks.report import summary  # noqa: E402
from benchmarks.runner import failures, run_all  # noqa: E402
from benchmarks.server_ceiling import pgbench_rate, pgbench_skip_reason, script  # noqa: E402
from benchmarks.server_limit import limit_rate, limit_skip_reason  # noqa: E402
from benchmarks.settings import ALL_BENCHMARKS, TINY  # noqa: E402
from benchmarks.throughput import QueueFiller  # noqa: E402
from conformance.harness import SqlHarness  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The scenarios with smoke tests of their own below; the machinery tests run the rest.
OWN_TESTS = ("peers", "long_handlers")
MACHINERY = tuple(b for b in ALL_BENCHMARKS if b not in OWN_TESTS)


def _run(spec: BackendSpec, out: Path, benchmarks: tuple[str, ...] = MACHINERY) -> dict[str, Any]:
    settings = TINY.with_(table_suffix=f"_smoke_{table_suffix()}", benchmarks=benchmarks)
    return run_all([spec], settings, out, Progress())


def _check_outputs(out: Path, backend: str, sql: bool) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    meta = results["meta"]
    assert meta["machine"]["cpu_model"] and meta["machine"]["logical_cores"] >= 1
    assert meta["machine"]["ram_gib"] > 0
    assert meta["versions"]["python"] and "psycopg" in meta["versions"] and "PyMySQL" in meta["versions"]
    assert "commit" in meta["git"]
    assert results["failures"] == []
    assert set(results["benchmarks"]) == set(MACHINERY)
    for name, entries in results["benchmarks"].items():
        assert len(entries) == 1, name
        assert "error" not in entries[0], entries[0].get("traceback")

    _check_poll_and_throughput(results, out, backend, sql)
    _check_the_rest(results, sql)
    _check_serializer(results)
    _check_files(out, backend)
    return results


def _check_poll_and_throughput(results: dict[str, Any], out: Path, backend: str, sql: bool) -> None:
    poll = results["benchmarks"]["poll_latency"][0]
    assert poll["backend"] == backend
    assert len(poll["cells"]) == len(TINY.depths) * (2 if sql else 1)
    for cell in poll["cells"]:
        assert cell["n"] >= 5 and cell["p50_ms"] <= cell["p99_ms"]
        if sql:
            assert cell["plan"] and cell["plan_summary"]
    check = poll["index_check"]["indexed" if sql else "as_installed"]
    assert isinstance(check["pass"], bool) and check["ratio"] > 0

    throughput = results["benchmarks"]["throughput"][0]
    assert [(r["processes"], r["threads"], r.get("batch_size", 1)) for r in throughput["rows"]] == [
        *((1, t, 1) for t in TINY.thread_counts),
        *((p, t, 1) for p, t in TINY.process_configs),
        *((p, t, TINY.batch_size) for p, t in TINY.batch_configs),
    ]
    for row in throughput["rows"]:
        if "skipped" in row:
            assert not sql
            continue
        assert row["library_jobs_per_s"] > 0
        if sql:
            assert row["raw_jobs_per_s"] > 0 and row["ratio"] > 0
        if sql and row.get("batch_size", 1) == 1:
            # The library again on its compact statement plan, beside the plain plan and the raw loop.
            assert row["compact_jobs_per_s"] > 0 and row["compact_ratio"] > 0
            assert len(row["compact_rounds"]) == TINY.throughput_rounds
        else:
            assert "compact_rounds" not in row
        if sql and (row["processes"], row["threads"], row.get("batch_size", 1)) in TINY.limit_points:
            # The server's limit at the row's jobs a commit, in every round, and each mode's ratio to it.
            assert [r["per_commit"] for r in row["limit_rounds"]] == [row.get("batch_size", 1)] * len(
                row["limit_rounds"]
            )
            assert len(row["limit_rounds"]) == TINY.throughput_rounds
            assert row["limit_jobs_per_s"] > 0 and row["library_ratio_limit"] > 0
            assert row["raw_ratio_limit"] > 0
            assert ("compact_ratio_limit" in row) == (row.get("batch_size", 1) == 1)
            # The limit's costs a job beside the drains': its tool's CPU, the server's, a round trip a call.
            assert row["limit_client_cpu_us_per_job"] > 0 and row["limit_server_cpu_us_per_job"] > 0
            assert row["limit_round_trips_per_job"] > 0
        else:
            assert "limit_rounds" not in row
        if sql:
            # What a job costs: the client's CPU always, round trips in one process, server CPU on both
            # databases.
            # (Present; the kernel counts CPU in clock ticks, so a tiny window may read none.)
            assert row["library_client_cpu_us_per_job"] >= 0
            assert ("library_round_trips_per_job" in row) == (row["processes"] == 1)
            assert "library_server_cpu_us_per_job" in row
    if sql:
        assert "limit_skipped" not in throughput
        printed = (out / "results.md").read_text(encoding="utf-8")
        assert "| library of limit |" in printed
        assert f"| {backend} | {TINY.limit_points[0][0]} x {TINY.limit_points[0][1]} | limit |" in printed
        profile = throughput["profile"]
        assert profile["library"]["us_per_job"] > 0 and profile["raw"]["us_per_job"] > 0
        assert (out / f"profile_{backend}.txt").read_text(encoding="utf-8").startswith("===== library")
    else:
        assert "raw_skipped" in throughput
        assert "limit_skipped" in throughput


def _check_the_rest(results: dict[str, Any], sql: bool) -> None:
    enqueue_rows = results["benchmarks"]["enqueue_rate"][0]["rows"]
    assert [r["jobs_per_transaction"] for r in enqueue_rows] == [1, TINY.enqueue_batch]
    assert all(r["library_jobs_per_s"] > 0 for r in enqueue_rows)
    many = results["benchmarks"]["enqueue_rate"][0]["many"]
    assert many["jobs_per_transaction"] == TINY.enqueue_many_batch and many["library_many_jobs_per_s"] > 0
    assert ("raw_batched_jobs_per_s" in many) == sql

    latency = results["benchmarks"]["latency"][0]
    assert latency["enqueue_to_start"]["started"] == TINY.latency_jobs
    assert latency["idle"]["client_polls_per_s"] > 0
    assert bool(latency["idle"]["server_per_s"]) is sql

    memory = results["benchmarks"]["memory"][0]
    assert memory["finished"] and memory["rss_start_mib"] > 0 and isinstance(memory["flat"], bool)
    assert memory["separate_process"] is sql

    locust = results["benchmarks"]["locust"][0]
    if sql:
        assert locust["verification"]["ok"], locust["verification"]
        assert locust["enqueue"]["requests"] > 0 and locust["enqueue"]["p50_ms"] > 0
    else:
        assert "skipped" in locust


def _check_serializer(results: dict[str, Any]) -> None:
    # Every payload of benchmarks/serializer.py timed by the version under test, which refuses none.
    timed = results["benchmarks"]["serializer"][0]["payloads"]
    assert list(timed) == [name for name, _, _ in serializer.payloads()]
    assert all(row[op] > 0 for row in timed.values() for op in serializer.OPERATIONS)


def _check_files(out: Path, backend: str) -> None:
    markdown = (out / "results.md").read_text(encoding="utf-8")
    for heading in (
        "### Poll latency",
        "### Throughput",
        "### Enqueue rate",
        "### Worker memory",
        "### Serializer",
    ):
        assert heading in markdown
    assert "| compact jobs/s | compact / library |" in markdown
    assert f"| {backend} |" in markdown
    for chart in ("poll_latency.png", "throughput.png"):
        data = (out / chart).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000


@pytest.mark.postgresql
def test_quick_machinery_postgresql(pg_dsn: str, tmp_path: Path) -> None:
    _run(BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn}), tmp_path)
    _check_outputs(tmp_path, "postgresql", sql=True)


@pytest.mark.mysql
def test_quick_machinery_mysql(mysql_dsn: str, tmp_path: Path) -> None:
    _run(BackendSpec("conformance.builtin:mysql", {"dsn": mysql_dsn}), tmp_path)
    _check_outputs(tmp_path, "mysql", sql=True)


def test_quick_machinery_memory(tmp_path: Path) -> None:
    _run(BackendSpec("conformance.builtin:memory"), tmp_path)
    _check_outputs(tmp_path, "memory", sql=False)


def test_report_command_rerenders(tmp_path: Path) -> None:
    _run(BackendSpec("conformance.builtin:memory"), tmp_path / "run")
    for produced in ("results.md", "poll_latency.png", "throughput.png"):
        (tmp_path / "run" / produced).unlink()
    assert main(["report", str(tmp_path / "run" / "results.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "results.md").read_text(encoding="utf-8").startswith("Benchmark run")
    assert (tmp_path / "again" / "poll_latency.png").read_bytes().startswith(PNG_MAGIC)


def test_cli_rejects_unknown_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--tiny", "--backends", "conformance.builtin:memory", "--only", "nope"]) == 2
    assert "unknown benchmarks" in capsys.readouterr().err


def test_a_failed_benchmark_fails_the_run_after_writing_results(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkFailure, match="no_such_module"):
        run_all(
            [BackendSpec("no_such_module:factory")], TINY.with_(benchmarks=("memory",)), tmp_path, Progress()
        )
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert results["failures"] and "error" in results["benchmarks"]["memory"][0]


def test_verification_reports_lost_doubled_and_unknown_jobs(tmp_path: Path) -> None:
    """The locust verifier against a harness whose archive disagrees with what was committed."""
    from collections import Counter
    from uuid import uuid4

    from conformance.builtin import memory as memory_harness
    from proletarian_ref import enqueue

    harness = memory_harness("proletarian.v_job", "proletarian.v_archived")
    conn = harness.connect()
    archived_id = enqueue(conn, "bench/job", 1, queue="bench/q", job_table=harness.job_table)
    conn.commit()
    harness.memory.tables[harness.archived_job_table] = {
        archived_id: _archived(harness.jobs()[0]),
        "x": _archived(harness.jobs()[0], job_id=uuid4()),
    }
    lost = str(uuid4())
    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps({"committed": [str(archived_id), lost], "pending": []}), encoding="utf-8")
    result = verify(harness, ids_file, Counter({str(archived_id): 2}))
    text = " ".join(result["problems"])
    assert not result["ok"]
    assert "never archived" in text and "nobody enqueued" in text and "not handled exactly once" in text
    assert "still in the job table" in text
    assert failures({"benchmarks": {"locust": [{"backend": "memory", "verification": result}]}})


def _archived(job: Any, job_id: Any = None) -> Any:
    from proletarian_ref.backend import ArchivedJobRecord

    return ArchivedJobRecord(
        job_id=job.job_id if job_id is None else job_id,
        queue=job.queue,
        job_type=job.job_type,
        payload=job.payload,
        attempts=1,
        status=":success",
        enqueued_at=job.enqueued_at,
        process_at=job.process_at,
        finished_at=job.process_at,
    )


def test_each_paired_ratio_is_of_two_drains_back_to_back_in_every_round() -> None:
    # The compact plan once drained between the library and the raw loop, so library / raw paired drains
    # two places apart; every pair a ratio is taken of must be neighbours, both ways round.
    from benchmarks.throughput import drain_order

    for round_ in range(4):
        order = drain_order(["compact", "library", "raw"], round_)
        assert {order[0], order[2]} == {"compact", "raw"} and order[1] == "library"
        assert drain_order(["library", "raw"], round_) == (
            ["library", "raw"] if round_ % 2 == 0 else ["raw", "library"]
        )


def test_statistics_helpers() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    summary = summarize_ms([0.001, 0.002, 0.003])
    assert summary["n"] == 3 and summary["p50_ms"] == pytest.approx(2.0)
    cells = [
        {"depth": 1_000, "indexed": True, "p50_ms": 1.0, "p99_ms": 2.0},
        {"depth": 1_000_000, "indexed": True, "p50_ms": 1.1, "p99_ms": 3.0},
        {"depth": 1_000, "indexed": False, "p50_ms": 1.0, "p99_ms": 2.0},
        {"depth": 1_000_000, "indexed": False, "p50_ms": 500.0, "p99_ms": 900.0},
    ]
    check = index_check(cells)
    assert check["indexed"]["pass"] is True and check["indexed"]["ratio"] == pytest.approx(1.5)
    assert check["no_index"]["pass"] is False


@pytest.mark.postgresql
@pytest.mark.mysql
@pytest.mark.parametrize("mode", ["library", "raw"])
def test_instruction_count_children_run_and_archive_their_jobs(
    pg_dsn: str, mysql_dsn: str, mode: str
) -> None:
    # What valgrind counts is these runs; the count itself is too slow for the suite (python starts
    # at a fiftieth of its speed under valgrind).
    for factory, dsn in (
        ("conformance.builtin:postgresql", pg_dsn),
        ("conformance.builtin:mysql", mysql_dsn),
    ):
        instructions.run_jobs(BackendSpec(factory, {"dsn": dsn}), mode, 5, suffix=f"_smoke_{table_suffix()}")


def test_instruction_count_says_when_valgrind_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert instructions.main([]) == 2
    assert "valgrind is not installed" in capsys.readouterr().out


def test_instruction_count_children_use_the_tables_of_their_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent counts (one per helper) must not share, and so truncate, each other's tables."""
    children: list[dict[str, Any]] = []

    class _Done:
        returncode = 0
        stderr = "==1== Collected : 1000"

    def run(command: list[str], **_: Any) -> _Done:
        children.append(json.loads(command[command.index("--child") + 1]))
        return _Done()

    monkeypatch.setattr("subprocess.run", run)
    instructions.per_job(BackendSpec("conformance.builtin:postgresql"), "raw", 10, "_me")
    assert [child["suffix"] for child in children] == ["_me", "_me"]


def _png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_MAGIC) and len(data) > 5_000


def _check_peers(results: dict[str, Any], out: Path, expected: list[str]) -> dict[str, Any]:
    assert results["failures"] == []
    entry: dict[str, Any] = results["benchmarks"]["peers"][0]
    assert "error" not in entry, entry.get("traceback")
    assert [s["name"] for s in entry["systems"]] == expected
    for system in entry["systems"]:
        assert system["verification"] == {"ok": True, "problems": []}, system["name"]
        assert len(system["rounds"]) == TINY.peers_rounds
        assert all(r["jobs"] == TINY.peers_jobs and r["jobs_per_s"] > 0 for r in system["rounds"])
        assert system["enqueue_jobs_per_s"] > 0 and system["promise"] and system["config"]
        assert system["latency"]["n"] == TINY.peers_latency_jobs
    markdown_text = (out / "results.md").read_text(encoding="utf-8")
    assert "### Beside pgqueuer and procrastinate" in markdown_text
    assert all(f"| {name} |" in markdown_text for name in expected)
    assert _png(out / "peers.png")
    return entry


@pytest.mark.postgresql
def test_peers_drain_every_job_exactly_once_on_each_system(pg_dsn: str, tmp_path: Path) -> None:
    results = _run(BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn}), tmp_path, ("peers",))
    missing = peers.missing_peers()
    ours = [
        "proletarian-ref",
        f"proletarian-ref batch {TINY.batch_size}",
        "proletarian-ref async (psycopg)",
        f"proletarian-ref async batch {TINY.batch_size} (psycopg)",
    ]
    assert TINY.peers_async_drivers == ("psycopg",)
    others = [m.NAME for m in peers.PEERS if m.PACKAGE not in missing]
    entry = _check_peers(results, tmp_path, ours + others)
    summary = (tmp_path / "results.md").read_text(encoding="utf-8").split("### Beside")[0]
    for name in ours[1:] + others:
        assert f"| {name} / proletarian-ref |" in summary
    for batch in (ours[1], ours[3]):
        for name in others:
            assert f"| {batch} / {name} |" in summary
    assert ("peers_missing" in entry) is bool(missing)


@pytest.mark.postgresql
def test_peers_without_their_packages_runs_ours_alone_and_says_so(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers, "missing_peers", lambda: ["pgqueuer", "procrastinate"])
    results = _run(BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn}), tmp_path, ("peers",))
    entry = _check_peers(
        results,
        tmp_path,
        [
            "proletarian-ref",
            f"proletarian-ref batch {TINY.batch_size}",
            "proletarian-ref async (psycopg)",
            f"proletarian-ref async batch {TINY.batch_size} (psycopg)",
        ],
    )
    assert "pgqueuer, procrastinate not installed" in entry["peers_missing"]
    assert "not installed" in (tmp_path / "results.md").read_text(encoding="utf-8").split("### Beside")[0]


def test_peers_and_long_handlers_skip_a_backend_without_sql(tmp_path: Path) -> None:
    results = _run(BackendSpec("conformance.builtin:memory"), tmp_path, OWN_TESTS)
    assert results["failures"] == []
    assert "PostgreSQL only" in results["benchmarks"]["peers"][0]["skipped"]
    assert "built-in SQL dialect" in results["benchmarks"]["long_handlers"][0]["skipped"]
    assert not (tmp_path / "peers.png").exists()


def test_peers_verification_names_lost_doubled_and_failed_jobs() -> None:
    assert peers.check(10, 10, (10, 10, 0), 0) == {"ok": True, "problems": []}
    problems = " ".join(peers.check(10, 11, (11, 9, 1), 1)["problems"])
    for what in ("handler calls: 11", "completion records: 11", "distinct jobs completed: 9"):
        assert what in problems
    assert "records not a plain success: 1" in problems and "jobs left in the queue: 1" in problems


def _check_long_handlers(results: dict[str, Any], out: Path, server_keys: tuple[str, ...]) -> None:
    assert results["failures"] == []
    entry = results["benchmarks"]["long_handlers"][0]
    assert "error" not in entry, entry.get("traceback")
    phases = [s["phase"] for s in entry["samples"]]
    assert phases[0] == "before" and "during" in phases
    assert phases == sorted(phases, key=["before", "during", "after"].index)
    assert entry["hold_s_observed"] is not None
    assert entry["handled_short"] > 0 and entry["phases"]["during"]["short_jobs_per_s"] > 0
    for sample in entry["samples"]:
        assert sample["poll_ms"] > 0 and all(sample[k] is not None for k in server_keys)
    assert "### What long handlers cost" in (out / "results.md").read_text(encoding="utf-8")
    assert _png(out / f"long_handlers_{entry['backend']}.png")


@pytest.mark.postgresql
def test_long_handlers_sample_dead_tuples_and_the_xmin_horizon(pg_dsn: str, tmp_path: Path) -> None:
    results = _run(
        BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn}), tmp_path, ("long_handlers",)
    )
    _check_long_handlers(results, tmp_path, ("dead_tuples", "xmin_age"))
    # A claim held open holds the horizon: some sample while a handler ran saw an xmin older than zero.
    during = [s for s in results["benchmarks"]["long_handlers"][0]["samples"] if s["phase"] == "during"]
    assert max(s["xmin_age"] for s in during) > 0


@pytest.mark.mysql
def test_long_handlers_sample_lock_waits_and_undo_history(mysql_dsn: str, tmp_path: Path) -> None:
    results = _run(BackendSpec("conformance.builtin:mysql", {"dsn": mysql_dsn}), tmp_path, ("long_handlers",))
    _check_long_handlers(results, tmp_path, ("lock_waits", "history_length", "open_transactions"))
    assert results["benchmarks"]["long_handlers"][0]["lock_wait_source"] in (
        "performance_schema.data_lock_waits",
        "information_schema.INNODB_LOCK_WAITS",
    )


def test_summary_lists_every_ratio_and_each_peer_against_ours() -> None:
    results: dict[str, Any] = {
        "benchmarks": {
            "throughput": [
                {"backend": "postgresql", "rows": [{"processes": 1, "threads": 4, "ratio": 0.93}]},
                {"backend": "mysql", "rows": [{"processes": 2, "threads": 2, "ratio": 0.88}]},
            ],
            "enqueue_rate": [{"backend": "mysql", "rows": [{"jobs_per_transaction": 100, "ratio": 0.8}]}],
            "peers": [
                {
                    "backend": "postgresql",
                    "jobs": 1_000,
                    "systems": [
                        {"name": "proletarian-ref", "jobs_per_s": 2_000.0},
                        {"name": "pgqueuer", "jobs_per_s": 4_000.0},
                    ],
                }
            ],
        }
    }
    results["benchmarks"]["throughput"][0]["rows"][0]["ratio_pgbench"] = 0.71
    results["benchmarks"]["throughput"][0]["rows"][0]["library_ratio_limit"] = 0.42
    results["benchmarks"]["throughput"][0]["rows"][0]["compact_ratio_limit"] = 0.47
    batch_row = {"processes": 2, "threads": 2, "batch_size": 10, "ratio": 4.0, "library_ratio_limit": 0.61}
    results["benchmarks"]["throughput"][1]["rows"].append(batch_row)
    table = "\n".join(summary(results))
    assert "| postgresql | throughput 1x4 | library / raw | 0.93 |" in table
    assert "| postgresql | throughput 1x4 | library / pgbench | 0.71 |" in table
    assert "| mysql | throughput 2x2 | library / raw | 0.88 |" in table
    assert "| postgresql | throughput 1x4 | library / server limit | 0.42 |" in table
    assert "| postgresql | throughput 1x4 | compact / server limit | 0.47 |" in table
    assert "| mysql | throughput 2x2 batch 10 | batch / server limit | 0.61 |" in table
    assert "| mysql | enqueue 100/txn | library / raw | 0.80 |" in table
    assert "| postgresql | drain 1,000 jobs | pgqueuer / proletarian-ref | 2.00 |" in table


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
@pytest.mark.parametrize("batched", [False, True], ids=["one_by_one", "batched"])
def test_the_raw_enqueue_loops_write_the_rows_the_library_writes(
    request: pytest.FixtureRequest, dialect: str, batched: bool
) -> None:
    # The ceiling must insert what the library inserts for the same jobs, else it compares other work.
    harness: SqlHarness = request.getfixturevalue("pg_db" if dialect == "postgresql" else "mysql_db")
    sql_harness, sql_dialect = require_sql(harness)
    rows: dict[str, list[tuple[str, str, str, int]]] = {}
    for name in ("raw", "library"):
        harness.clear()
        if name == "raw":
            raw_loop = raw_enqueue_batched if batched else raw_enqueue
            count, _ = raw_loop(sql_harness, sql_dialect, 3, 30.0, 3)
        else:
            library_loop = library_enqueue_many if batched else library_enqueue
            count, _ = library_loop(harness, 3, 30.0, 3, None)
        assert count == 3
        rows[name] = sorted((job.queue, job.job_type, job.payload, job.attempts) for job in harness.jobs())
    assert rows["raw"] == rows["library"]


@pytest.mark.postgresql
def test_pgbench_ceiling_runs_proletarians_transaction_and_archives_each_job_it_counts(
    pg_db: SqlHarness,
) -> None:
    # The server's ceiling is only a ceiling if pgbench does the library's work: the same statements
    # (read from sql/postgresql/queries.sql), every claimed job archived once and deleted.
    assert pgbench_skip_reason(pg_db) is None, "pgbench must be installed (postgresql-client)"
    text = script(pg_db)
    assert "%(" not in text and text.startswith("BEGIN;") and text.endswith("COMMIT;\n")
    assert "FOR UPDATE SKIP LOCKED \\gset" in text
    bulk_load(pg_db, 0, 20_000, "due")
    measured = pgbench_rate(pg_db, 2, 1)
    done = measured["jobs"]
    assert done > 0 and measured["jobs_per_s"] > 0
    assert count_rows(pg_db) == 20_000 - done
    archived = pg_db.archived_jobs()
    assert len(archived) == done
    assert {(job.status, job.attempts) for job in archived} == {(":success", 1)}
    assert len({job.job_id for job in archived}) == done


@pytest.mark.mysql
def test_pgbench_ceiling_is_skipped_with_a_reason_off_postgresql(
    mysql_db: SqlHarness,
) -> None:
    assert pgbench_skip_reason(mysql_db) == "pgbench runs against PostgreSQL only"


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_versus_drains_both_versions_in_turns_each_job_once(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str
) -> None:
    dsn = request.getfixturevalue("pg_dsn" if dialect == "postgresql" else "mysql_dsn")
    out = tmp_path / "versus.json"
    dsn_option = "--pg-dsn" if dialect == "postgresql" else "--mysql-dsn"
    arguments = ["HEAD", "--backends", dialect, dsn_option, dsn, "--jobs", "400", "--rounds", "2"]
    arguments += [
        "--threads",
        "2",
        "--compact",
        "--table-suffix",
        f"_smoke_{table_suffix()}",
        "--out",
        str(out),
    ]
    assert versus.main(arguments) == 0
    results = json.loads(out.read_text())
    then, now, compact = results["sides"]
    assert then != now and now.endswith("(now)") and compact.endswith("compact plan")
    assert [sorted(r) for r in results[dialect]["rounds"]] == [sorted([then, now, compact])] * 2
    assert all(rate > 0 for r in results[dialect]["rounds"] for rate in r.values())
    assert results[dialect][compact]["ratio_min"] > 0


# A version whose worker runs the first job's handler twice and archives every job with plain SQL.
_TWICE = """
import psycopg

def connection_factory(dsn):
    return lambda: psycopg.connect(dsn, autocommit=True)

class _Worker:
    def __init__(self, connect, handler, job_table, archived_job_table, **options):
        self.connect, self.handler, self.tables = connect, handler, (job_table, archived_job_table)

    def start(self):
        job, archived = self.tables
        with self.connect() as conn:
            rows = conn.execute(f"SELECT job_type FROM {job}").fetchall()
            conn.execute(
                f"INSERT INTO {archived} (job_id, queue, job_type, payload, attempts, status, enqueued_at, "
                f"process_at, finished_at) SELECT job_id, queue, job_type, payload, attempts + 1, "
                f"':success', enqueued_at, process_at, now() FROM {job}"
            )
            conn.execute(f"DELETE FROM {job}")
        for (job_type,) in rows + rows[:1]:
            self.handler(job_type, None)

    def stop(self):
        pass

def create_queue_worker(connect, handler, **options):
    return _Worker(connect, handler, **options)
"""


def test_versus_fails_when_a_version_runs_a_job_twice(pg_dsn: str, tmp_path: Path) -> None:
    package = tmp_path / "proletarian_ref"
    (package / "backends").mkdir(parents=True)
    (package / "__init__.py").write_text(_TWICE)
    (package / "backends" / "__init__.py").write_text("")
    (package / "backends" / "dsn.py").write_text("from proletarian_ref import connection_factory\n")
    spec = BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn})
    harness = open_harness(spec, "versus", f"_twice_{table_suffix()}")
    with closing_harness(harness), pytest.raises(BenchmarkFailure, match="handlers ran 201 times"):
        versus.drain(harness, pg_dsn, versus.Side("twice", tmp_path), 200, 1, 1)


def test_versus_refuses_a_tree_whose_package_is_not_the_one_imported(pg_dsn: str, tmp_path: Path) -> None:
    spec = BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn})
    harness = open_harness(spec, "versus", f"_empty_{table_suffix()}")
    with closing_harness(harness), pytest.raises(BenchmarkFailure, match="did not start"):
        versus.drain(harness, pg_dsn, versus.Side("empty", tmp_path), 10, 1, 1)


# Stands in for valgrind: runs the worker process, passes its output on, and reports 1,000 instructions
# for each job the process ran (the last line it printed) plus a fixed start-up cost.
_FAKE_CALLGRIND = """
import subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)
last = ""
for line in child.stdout:
    sys.stdout.write(line)
    sys.stdout.flush()
    last = line
child.wait()
print(f"==1== Collected : {int(last) * 1000 + 4321}", file=sys.stderr)
sys.exit(child.returncode)
"""


def test_versus_instruction_count_is_the_difference_of_two_drains_per_job(
    pg_dsn: str, tmp_path: Path
) -> None:
    fake = tmp_path / "fake_callgrind.py"
    fake.write_text(_FAKE_CALLGRIND)
    spec = BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn})
    harness = open_harness(spec, "versus", f"_count_{table_suffix()}")
    with closing_harness(harness):
        now = versus.working_tree()
        assert versus.instructions_per_job(harness, pg_dsn, now, 30, [sys.executable, str(fake)]) == 1000.0


def test_versus_times_the_serializer_of_both_versions_in_turns(tmp_path: Path) -> None:
    out = tmp_path / "versus-serializer.json"
    arguments = ["HEAD", "--serializer", "--rounds", "2", "--seconds", "0.001", "--out", str(out)]
    assert versus.main(arguments) == 0
    results = json.loads(out.read_text())
    then, now = results["sides"]
    summary = results["serializer"]
    assert [sorted(r) for r in summary["rounds"]] == [sorted([then, now])] * 2
    names = [name for name, _, _ in serializer.payloads()]
    for side in (then, now):
        assert list(summary["medians"][side]) == names
        # HEAD reads and writes every payload, however deep, so none is refused.
        assert all(summary["medians"][side][name][op] > 0 for name in names for op in serializer.OPERATIONS)
    assert all(ratio > 0 for row in summary["ratios"][now].values() for ratio in row.values())


def test_the_serializer_table_says_refused_where_a_version_fails() -> None:
    row: dict[str, float | None] = {"encode": None, "decode": 2.0, "decode exact": 3.25}
    assert serializer.table({"deep": row}).splitlines()[-1] == "| deep | refused | 2.0 | 3.2 |"


def test_the_serializer_section_runs_once_whatever_the_backends(tmp_path: Path) -> None:
    backends = [BackendSpec("conformance.builtin:memory"), BackendSpec("no_such_module:factory")]
    results = run_all(backends, TINY.with_(benchmarks=("serializer",)), tmp_path, Progress())
    (entry,) = results["benchmarks"]["serializer"]
    assert entry["factory"] == "conformance.builtin:memory" and "error" not in entry
    assert "### Serializer" in (tmp_path / "results.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("fixture", ["pg_db", "mysql_db"])
def test_rows_loaded_due_are_due_however_far_a_runs_numbering_has_come(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    # A QueueFiller numbers its rows over a whole run: a full run on a fast machine loads millions, and
    # each of them must still be due (limit18's first try loaded rows due only in the future and drained
    # one job a window at its last PostgreSQL point).
    harness: SqlHarness = request.getfixturevalue(fixture)
    bulk_load(harness, 10_000_000, 10_000_100, "due")
    now = datetime.now(UTC)
    assert [job.process_at <= now for job in harness.jobs()] == [True] * 100


@pytest.mark.parametrize("fixture", ["pg_db", "mysql_db"])
def test_the_queue_filler_loads_its_due_rows_as_far_apart_as_asked_and_refuses_rows_due_in_the_future(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    # --due-apart-ms: a second apart, each MySQL job has a second of its own (limit18's first try's layout).
    harness: SqlHarness = request.getfixturevalue(fixture)
    filler = QueueFiller(harness, 20, timedelta(seconds=1))
    filler.top_up()
    times = sorted(job.process_at for job in harness.jobs())
    assert len(times) == 20 and times[-1] <= datetime.now(UTC)
    assert {later - earlier for earlier, later in itertools.pairwise(times)} == {timedelta(seconds=1)}
    # 30 days hold 2,592,000 rows a second apart: the filler says so rather than load rows not yet due.
    far = QueueFiller(harness, 2_592_100, timedelta(seconds=1))
    with pytest.raises(BenchmarkFailure, match="--due-apart-ms"):
        far.top_up()
    assert len(harness.jobs()) == 20


@pytest.mark.parametrize("fixture", ["pg_db", "mysql_db"])
@pytest.mark.parametrize("per_commit", [1, 10])
def test_the_server_limit_does_the_whole_job_archiving_each_job_it_counts_once(
    fixture: str, per_commit: int, request: pytest.FixtureRequest
) -> None:
    # The limit is only the server's limit for *this* work if it claims, archives (attempts + 1, the
    # status) and deletes every job it counts, exactly once, and leaves nothing of its own behind.
    harness: SqlHarness = request.getfixturevalue(fixture)
    assert limit_skip_reason(harness) is None, "pgbench and mariadb-slap (or mysqlslap) must be installed"
    # pgbench runs for a whole second whatever the queue holds: at ten jobs a commit a quiet machine's
    # PostgreSQL drains well past 20,000 in it (seen here), so its queue holds more.
    rows = 100_000 if fixture == "pg_db" and per_commit > 1 else 20_000
    bulk_load(harness, 0, rows, "due")
    started = time.perf_counter()
    measured = limit_rate(harness, 2, per_commit, 1, 2_000)
    wall = time.perf_counter() - started
    done = measured["jobs"]
    assert done > 0 and measured["jobs_per_s"] > 0 and not measured["ran_dry"]
    assert count_rows(harness) == rows - done
    archived = harness.archived_jobs()
    assert len(archived) == done
    assert {(job.status, job.attempts) for job in archived} == {(":success", 1)}
    assert len({job.job_id for job in archived}) == done
    # Measured as a drain is: the tool's own CPU, the server's for the tool's connections (read while
    # they are open: they end with it), and a round trip a call.
    costs = measured["per_job"]
    assert costs["client_cpu_us"] > 0 and costs["server_cpu_us"] > 0
    assert costs["round_trips"] == pytest.approx(1 / per_commit, rel=0.05)
    # Only the tool's own connections: never more than the machine's cores gave over the run.
    assert costs["server_cpu_us"] * done <= 1e6 * (os.cpu_count() or 1) * wall
    if fixture == "mysql_db":
        # Only this run's own database: the other parametrization may hold one of its own at this moment
        # under xdist (a clean-clone CI run saw exactly that).
        assert measured["database"].startswith("bench_limit_")
        leftovers = run_sql(harness, "SHOW DATABASES LIKE %s", (measured["database"],))
        assert leftovers == [], "the throwaway database of the procedure must be dropped"


@pytest.mark.postgresql
def test_sync_commit_drains_every_round_with_the_setting_on_and_off(pg_dsn: str) -> None:
    from benchmarks import sync_commit

    spec = BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn})
    result = sync_commit.drain(spec, 200, 2, 2, f"_sc{table_suffix()}")
    assert [len(result["rounds_jobs_per_s"][k]) for k in ("on", "off")] == [2, 2]
    assert all(rate > 0 for rates in result["rounds_jobs_per_s"].values() for rate in rates)
    assert result["off_over_on"] == result["jobs_per_s"]["off"] / result["jobs_per_s"]["on"]


@pytest.mark.postgresql
def test_sync_commit_drains_with_the_librarys_worker_and_checks_every_job_archived(pg_dsn: str) -> None:
    # Each library drain raises unless every job ran once and was archived once, none left queued.
    from benchmarks import sync_commit

    spec = BackendSpec("conformance.builtin:postgresql", {"dsn": pg_dsn})
    result = sync_commit.drain(spec, 200, 2, 2, f"_scl{table_suffix()}", loop="library")
    assert result["loop"] == "library"
    assert [len(result["rounds_jobs_per_s"][k]) for k in ("on", "off")] == [2, 2]
    assert len(result["off_over_on_rounds"]) == 2


@pytest.mark.postgresql
@pytest.mark.parametrize("driver", sorted(peer_aio.DRIVERS))
def test_the_peers_asyncio_worker_runs_on_each_driver(driver: str, pg_db: SqlHarness, pg_dsn: str) -> None:
    # Every job the latency sample enqueues is started by the asyncio worker on that driver's connections.
    seconds = peer_aio.latency(
        pg_dsn, driver, pg_db.job_table, pg_db.archived_job_table, 1, 3, TINY.latency_gap_ms
    )
    assert len(seconds) == 3
    assert pg_db.jobs() == [] and len(pg_db.archived_jobs()) == 3


@pytest.mark.postgresql
@pytest.mark.parametrize("driver", sorted(peer_aio.DRIVERS))
def test_the_peers_asyncio_enqueue_rate_writes_the_rows_the_threaded_enqueue_writes(
    driver: str, pg_db: SqlHarness, pg_dsn: str
) -> None:
    # The async systems' enqueue column is proletarian_ref.aio.enqueue's, one job a transaction: every job
    # is there, committed, as proletarian_ref.enqueue writes it.
    count, seconds = peer_aio.enqueue_rate(pg_dsn, driver, pg_db.job_table, pg_db.archived_job_table, 5)
    assert count == 5 and seconds > 0
    jobs = pg_db.jobs()
    assert len(jobs) == 5
    assert {(job.queue, job.job_type, job.attempts) for job in jobs} == {(":bench/q", ":bench/job", 0)}
    assert sorted(job.payload for job in jobs) == sorted(f'["^ ","~:i",{i}]' for i in range(5))


def test_the_throughput_chart_is_drawn_when_one_backend_errored(tmp_path: Path) -> None:
    # A backend that raised has an entry with its factory and error and no rows (runner.py): the chart
    # draws the others and leaves it to the tables to say what went wrong.
    from benchmarks.report import throughput_chart

    results = {
        "benchmarks": {
            "throughput": [
                {"factory": "conformance.builtin:mysql", "error": "OperationalError: refused"},
                {
                    "backend": "postgresql",
                    "rows": [
                        {"processes": 1, "threads": 4, "library_jobs_per_s": 100.0, "raw_jobs_per_s": 110.0}
                    ],
                },
            ]
        }
    }
    throughput_chart(results, tmp_path / "throughput.png")
    assert (tmp_path / "throughput.png").stat().st_size > 0


@pytest.mark.postgresql
def test_a_tool_run_past_its_timeout_is_killed_and_the_timeout_raised(pg_db: SqlHarness) -> None:
    import subprocess

    from benchmarks.costs import run_tool

    started = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired):
        run_tool(pg_db, [sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), 0.3, 1)
    assert time.perf_counter() - started < 10


@pytest.mark.postgresql
def test_a_tool_that_never_connects_has_its_own_cpu_and_no_server_cpu(pg_db: SqlHarness) -> None:
    from benchmarks.costs import run_tool

    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint('ok')"
    run = run_tool(pg_db, [sys.executable, "-c", busy], dict(os.environ), 60, 1)
    assert (run.returncode, run.stdout) == (0, "ok\n")
    assert run.client_cpu_s >= 0.3
    assert run.server_cpu_s is None and run.server_cpu_reason and "no " in run.server_cpu_reason


@pytest.mark.postgresql
def test_the_limits_tool_is_looked_for_on_the_server_only_until_its_connections_are_open(
    pg_db: SqlHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each look is a query on the server being measured and a scan of the tool's sockets: every
    # TOOL_SAMPLE_S all run long, they took a quarter of the limit's rate on a 2-core machine.
    from benchmarks import costs

    looks: list[int] = []
    original = costs._postgresql_backends

    def counted(conn: Any, client_pids: list[int]) -> list[str] | str:
        looks.append(1)
        return original(conn, client_pids)

    monkeypatch.setattr(costs, "_postgresql_backends", counted)
    bulk_load(pg_db, 0, 20_000, "due")
    measured = limit_rate(pg_db, 2, 1, 1, 2_000)
    assert measured["per_job"]["server_cpu_us"] > 0
    # pgbench runs a whole second, fifty reads and more: only its first few look for the connections.
    assert 0 < len(looks) <= 10
