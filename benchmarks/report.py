"""Writes a run's results.json, results.md (the README snippet) and PNG charts (matplotlib, Agg)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

# The Agg backend must be chosen before pyplot loads, so no display is ever needed.
import matplotlib.pyplot as plt

from benchmarks.common import DUE_APART
from benchmarks.serializer import table as serializer_table

POLL_CHART = "poll_latency.png"
THROUGHPUT_CHART = "throughput.png"
PEERS_CHART = "peers.png"


def _num(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "pass" if value else "FAIL"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_num(c) for c in row) + " |" for row in rows]
    return lines


def _entries(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = results.get("benchmarks", {}).get(name, [])
    return entries


def _problem(entry: dict[str, Any]) -> str | None:
    if "error" in entry:
        return f"{entry.get('backend', entry.get('factory'))}: error: {entry['error']}"
    if "skipped" in entry and "rows" not in entry and "cells" not in entry:
        return f"{entry.get('backend', entry.get('factory'))}: skipped: {entry['skipped']}"
    return None


def markdown(results: dict[str, Any]) -> str:
    """The Markdown snippet: one table per benchmark, the machine named at the top."""
    meta = results.get("meta", {})
    m = meta.get("machine", {})
    v = meta.get("versions", {})
    git = meta.get("git", {})
    out = [
        f"Benchmark run ({results.get('settings', {}).get('mode', '?')} mode), "
        f"{m.get('cpu_model', '?')}, {m.get('logical_cores', '?')} cores, {m.get('ram_gib', '?')} GiB RAM; "
        f"Python {v.get('python')}, psycopg {v.get('psycopg')}, PyMySQL {v.get('PyMySQL')}; "
        f"git {str(git.get('commit') or '?')[:10]}{' (dirty)' if git.get('dirty') else ''}; "
        f"load average at start {m.get('load_average')}.",
        "",
    ]
    for factory, version in meta.get("servers", {}).items():
        out.append(f"- `{factory}`: {version}")
    out.append("")
    out += summary(results)
    out += _poll_section(results)
    out += _throughput_section(results)
    out += _enqueue_section(results)
    out += _latency_section(results)
    out += _memory_section(results)
    out += _locust_section(results)
    out += _peers_section(results)
    out += _long_handlers_section(results)
    out += _serializer_section(results)
    out += _profile_section(results)
    return "\n".join(out).rstrip() + "\n"


def _notes(entries: list[dict[str, Any]]) -> list[str]:
    notes = [p for p in map(_problem, entries) if p]
    return [*(f"- {n}" for n in notes), ""] if notes else []


def _poll_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "poll_latency")
    if not entries:
        return []
    out = ["### Poll latency against table depth", ""]
    out.append(
        "The claim (`get_next_job` in a transaction, rolled back) on a job table of N rows: half in other "
        "queues, 49% not yet due, 1% due. Milliseconds."
    )
    out.append("")
    rows: list[list[Any]] = []
    for e in entries:
        for c in e.get("cells", []):
            index = {True: "yes", False: "**no**", None: "as installed"}[c["indexed"]]
            rows.append(
                [
                    e["backend"],
                    c["depth"],
                    index,
                    c["p50_ms"],
                    c["p95_ms"],
                    c["p99_ms"],
                    c["n"],
                    c.get("plan_summary", "-"),
                ]
            )
    out += _table(["backend", "rows", "index", "p50", "p95", "p99", "samples", "plan"], rows)
    out.append("")
    checks: list[list[Any]] = []
    for e in entries:
        for label, key in (
            ("with index", "indexed"),
            ("without index", "no_index"),
            ("as installed", "as_installed"),
        ):
            c = e.get("index_check", {}).get(key)
            if c:
                checks.append(
                    [
                        e["backend"],
                        label,
                        f"{c['from_depth']:,} -> {c['to_depth']:,}",
                        c["p99_from_ms"],
                        c["p99_to_ms"],
                        c["ratio"],
                        c.get("p50_ratio"),
                        c["pass"] if key != "no_index" else ("within 2x" if c["pass"] else "grows"),
                    ]
                )
    if checks:
        out.append("p99 at the deepest table over p99 at the shallowest (target with the index: at most 2x):")
        out.append("")
        out += _table(
            ["backend", "", "rows", "p99 from", "p99 to", "p99 ratio", "p50 ratio", "verdict"], checks
        )
        out.append("")
    return out + _notes(entries)


def _server_cores_lines(entries: list[dict[str, Any]]) -> list[str]:
    """What a run with --server-cores says of where its clients and server ran (server_cores.py)."""
    out: list[str] = []
    for e in entries:
        cores = e.get("server_cores")
        if cores is None:
            continue
        out.append(
            f"{e['backend']}: the database on cores of its own (`--server-cores`): the clients (drains, "
            f"pgbench, mariadb-slap) on CPU {_cpus(cores['client_cpus'])}, the server side of their "
            f"connections on CPU {_cpus(cores['server_cpus'])} ({cores['pinned']} backends or server threads "
            f"moved, the pinning thread's own CPU {cores['pinner_cpu_s']:.2f} s"
            + (f"; failures: {'; '.join(cores['failures'])}" if cores["failures"] else "")
            + ")."
        )
        out.append("")
    return out


def _layout_lines(entries: list[dict[str, Any]]) -> list[str]:
    """What a run with --due-apart-ms other than the default says of its queue's layout."""
    out: list[str] = []
    for e in entries:
        apart = e.get("due_apart_ms")
        if apart is None or apart == DUE_APART / timedelta(milliseconds=1):
            continue
        out += [
            f"{e['backend']}: the queue's due jobs loaded {apart:g} ms apart in process_at "
            "(`--due-apart-ms`).",
            "",
        ]
    return out


def _cpus(cpus: list[int]) -> str:
    return ", ".join(str(c) for c in cpus)


def _throughput_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "throughput")
    if not entries:
        return []
    out = ["### Throughput (no-op handler)", ""]
    out.append(
        "Jobs per second, median of rounds; *raw* is the same statements in a plain psycopg/PyMySQL loop at "
        "the same concurrency (the ceiling). Each round drains with the library and with the raw loop back "
        "to back; *ratio* is the median of the rounds' library / raw, and *rounds* lists them. "
        "Target: ratio >= 0.9. Rows marked *batch K* run the worker in batch mode (batch_size K: K jobs "
        "a transaction) against the same raw loop of one job a transaction. *pgbench* (PostgreSQL) is the "
        "server's own ceiling for one job a transaction: pgbench running the same statements at the same "
        "connections, in C with prepared statements, interleaved with the rounds; *of pgbench* is the median "
        "of the rounds' library / pgbench. *compact* is the library on its compact statement plan "
        "(`compact=True`: a job's archive and delete in one round trip), drained in each round next to "
        "the library, on the side away from the raw loop; *compact / library* is the median of the "
        "rounds' compact / library."
    )
    out.append("")
    out += _server_cores_lines(entries)
    out += _layout_lines(entries)
    rows: list[list[Any]] = []
    for e in entries:
        for r in e.get("rows", []):
            if "skipped" in r:
                rows.append([e["backend"], _config(r, " x "), *"----", "skipped", *"----"])
                continue
            rows.append(
                [
                    e["backend"],
                    _config(r, " x "),
                    r.get("library_jobs_per_s"),
                    r.get("raw_jobs_per_s"),
                    r.get("ratio"),
                    " ".join(f"{x:.2f}" for x in r.get("round_ratios", [])) or "-",
                    r.get("pass", "no ceiling"),
                    r.get("pgbench_jobs_per_s", "-"),
                    r.get("ratio_pgbench", "-"),
                    r.get("compact_jobs_per_s", "-"),
                    r.get("compact_ratio", "-"),
                ]
            )
    out += _table(
        [
            "backend",
            "processes x threads",
            "library jobs/s",
            "raw jobs/s",
            "ratio",
            "rounds",
            "verdict",
            "pgbench jobs/s",
            "of pgbench",
            "compact jobs/s",
            "compact / library",
        ],
        rows,
    )
    out.append("")
    out += _limit_section(entries)
    return out + _notes(entries)


# The chained-claim drains (ChainedClaim; the asyncio one PostgreSQL's): columns only in a run that has them,
# so a report of a run before them reads as it did.
_CHAIN_MODES = ("chain", "async_chain")
# The drains whose costs a job the limit section lists, in its order.
_COST_MODES = (
    "limit",
    "library",
    "compact",
    "chain",
    "async",
    "async_chain",
    "async_chain_uvloop",
    "raw",
    "pipeline",
    "async_pipeline",
)


def _limit_section(entries: list[dict[str, Any]]) -> list[str]:
    """The drains against the server's limit for the whole job, and what a job costs each side."""
    rows: list[list[Any]] = []
    costs: list[list[Any]] = []
    chained = any(
        f"{mode}_ratio_limit" in r for e in entries for r in e.get("rows", []) for mode in _CHAIN_MODES
    )
    # The exact plan pipelined beside pgbench (from limit15 on): a column only in a run that has it.
    exact_pipelined = any("pipeline_ratio_pgbench" in r for e in entries for r in e.get("rows", []))
    # And on the asyncio worker (from limit17 on).
    async_exact = any("async_pipeline_ratio_pgbench" in r for e in entries for r in e.get("rows", []))
    # The asyncio chain on uvloop's event loop too (from limit20 on).
    uvloop = any("async_chain_uvloop_ratio_limit" in r for e in entries for r in e.get("rows", []))
    for e in entries:
        for r in e.get("rows", []):
            if "limit_jobs_per_s" in r:
                chain_cells = [r.get(f"{mode}_ratio_limit", "-") for mode in _CHAIN_MODES] if chained else []
                rows.append(
                    [
                        e["backend"],
                        _config(r, " x "),
                        r.get("batch_size", 1),
                        r["limit_jobs_per_s"],
                        r.get("library_jobs_per_s"),
                        r.get("library_ratio_limit", "-"),
                        r.get("compact_ratio_limit", "-"),
                        r.get("async_ratio_limit", "-"),
                        *chain_cells,
                        *([r.get("async_chain_uvloop_ratio_limit", "-")] if uvloop else []),
                        r.get("raw_ratio_limit", "-"),
                        r.get("pgbench_ratio_limit", "-"),
                        r.get("ratio", "-"),
                        r.get("ratio_pgbench", "-"),
                        *([r.get("pipeline_ratio_pgbench", "-")] if exact_pipelined else []),
                        *([r.get("async_pipeline_ratio_pgbench", "-")] if async_exact else []),
                    ]
                )
            for mode in _COST_MODES:
                if f"{mode}_client_cpu_us_per_job" not in r:
                    continue
                label = _drain_label(mode, r)
                costs.append(
                    [
                        e["backend"],
                        _config(r, " x "),
                        label,
                        r[f"{mode}_client_cpu_us_per_job"],
                        r.get(f"{mode}_server_cpu_us_per_job", "-"),
                        r.get(f"{mode}_round_trips_per_job", "-"),
                    ]
                )
    if not rows and not costs:
        return []
    async_pipelined = any("pipeline=True" in str(e.get("async_chain_backend", "")) for e in entries)
    # A run from limit13 on drains MySQL's chain too (one multi-statement query a job, not a pipeline), and
    # from limit15 on the asyncio worker's on aiomysql.
    chain_factories = {str(e.get("chain_factory", "")) for e in entries}
    mysql_chained = any(f.endswith((":mysql_chain", ":mysqlclient_chain")) for f in chain_factories)
    # From limit19 on a run may drain MySQL on mysqlclient too (conformance.builtin:mysqlclient's rows).
    mysqlclient = any(f.endswith(":mysqlclient_chain") for f in chain_factories)
    mysql_async_chained = any(
        str(e.get("async_chain_backend", "")).startswith("AsyncMySQLBackend") for e in entries
    )
    pipelined = "both chains are" if async_pipelined else "the threaded chain is"
    out = ["#### Against the server's limit", ""]
    out.append(
        "*limit*: the whole job's work done inside the server, on the same tables in the same rounds: "
        "PostgreSQL, one statement (claim with FOR UPDATE SKIP LOCKED, delete, archive) under pgbench; "
        "MariaDB/MySQL, a stored procedure under mariadb-slap/mysqlslap; at the row's connections and "
        "*jobs/commit* (1, or batch mode's batch size). *of limit* is the median of the rounds' drain / "
        "limit: *library* (default mode, or batch mode on batch rows), *compact* (the compact plan), *async* "
        "(the asyncio worker, asyncpg or aiomysql on the compact plan, processes x polling tasks, in batch "
        "mode on batch rows), *raw* "
        "(Proletarian's statements on the bare driver), *pgbench* (Proletarian's statements under pgbench). "
        "*of raw* and *of pgbench* repeat the table above."
        + (
            " *chain* and *async chain*: the threaded worker and the asyncio worker "
            + ("(psycopg's AsyncConnection)" if async_pipelined else "(asyncpg)")
            + " on the "
            "compact plan with chained claims (`chain=True`: a finished job's COMMIT goes with the next "
            "BEGIN and the next claim follows in the same block; on batch rows, in batch mode, a finished "
            "batch's), "
            + _where_chained(
                mysql_chained=mysql_chained, mysql_async_chained=mysql_async_chained, mysqlclient=mysqlclient
            )
            + (
                " "
                + (f"On PostgreSQL {pipelined}" if mysql_chained else pipelined[0].upper() + pipelined[1:])
                + " pipelined (`pipeline=True`): a finished job's archive, whose row "
                "count the server checks, goes with that COMMIT, BEGIN and claim in one exchange."
                if any(str(e.get("chain_factory", "")).endswith("_pipeline_chain") for e in entries)
                else ""
            )
            if chained
            else ""
        )
        + (
            " *pipeline of pgbench*: Proletarian's exact plan pipelined (`pipeline=True`, "
            "conformance.builtin:postgresql_pipeline: the same five statements, the archive sent with the "
            "delete, in fewer exchanges a job than pgbench's script, one a "
            "statement), the median of the rounds' pipeline / pgbench; its costs are the *pipeline* rows "
            "below."
            if exact_pipelined
            else ""
        )
        + (
            " *async pipeline of pgbench*: the same plan on the asyncio worker "
            "(`AsyncPostgresBackend(pipeline=True)`, the backend's own exchanges: BEGIN with the claim, the "
            "archive with the delete, COMMIT), the median of the rounds' async pipeline / pgbench; its "
            "costs are the *async pipeline* rows below."
            if async_exact
            else ""
        )
        + (
            " *async chain uvloop*: the asyncio chain again on uvloop's event loop (`uvloop.run`, what "
            "`proletarian-ref worker --loop uvloop` runs) in place of asyncio's own, drained right after it "
            "in each round."
            if uvloop
            else ""
        )
    )
    out.append("")
    out += _table(
        [
            "backend",
            "processes x threads",
            "jobs/commit",
            "limit jobs/s",
            "library jobs/s",
            "library of limit",
            "compact of limit",
            "async of limit",
            *(["chain of limit", "async chain of limit"] if chained else []),
            *(["async chain uvloop of limit"] if uvloop else []),
            "raw of limit",
            "pgbench of limit",
            "library of raw",
            "library of pgbench",
            *(["pipeline of pgbench"] if exact_pipelined else []),
            *(["async pipeline of pgbench"] if async_exact else []),
        ],
        rows,
    )
    out.append("")
    if costs:
        out.append(
            "Per-job costs, median of the rounds' windows: *client CPU* of the drain's processes, *server "
            "CPU* of the PostgreSQL backends or MariaDB/MySQL server threads serving its connections (read "
            "from /proc; the server's background work not counted), *round trips* counted at the driver "
            "(one-process drains only). *limit*: the same for the server's limit over its whole run, *client "
            "CPU* that of pgbench or mariadb-slap/mysqlslap, *server CPU* of the backends or threads serving "
            "their connections, and one round trip a call (one statement, or one CALL, a transaction)."
        )
        out.append("")
        out += _table(
            [
                "backend",
                "processes x threads",
                "drain",
                "client CPU µs/job",
                "server CPU µs/job",
                "round trips/job",
            ],
            costs,
        )
        out.append("")
    return out


def _enqueue_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "enqueue_rate")
    if not entries:
        return []
    out = ["### Enqueue rate (one connection)", ""]
    out.append(
        "Jobs per second. *library*: `enqueue(conn, ...)` as an application calls it; *reused backend*: the "
        "same with `backend=` passed once; *raw*: the INSERT on the driver; *with notify*: `notify=True` "
        "(instant wake-up; PostgreSQL only), and *notify cost* the with / without ratio of rounds run side "
        "by side."
    )
    out.append("")
    rows: list[list[Any]] = []
    for e in entries:
        for r in e.get("rows", []):
            rows.append(
                [
                    e["backend"],
                    r["jobs_per_transaction"],
                    r.get("library_jobs_per_s"),
                    r.get("library_backend_reused_jobs_per_s"),
                    r.get("raw_jobs_per_s"),
                    r.get("ratio"),
                    r.get("library_notify_jobs_per_s", "-"),
                    r.get("notify_ratio", "-"),
                ]
            )
    out += _table(
        [
            "backend",
            "jobs/txn",
            "library",
            "reused backend",
            "raw",
            "library / raw",
            "with notify",
            "notify cost",
        ],
        rows,
    )
    out.append("")
    many = [e for e in entries if "many" in e]
    if many:
        out.append(
            "*enqueue_many*: one `enqueue_many(conn, jobs)` per transaction; *raw batched*: the driver's own "
            "batch (PostgreSQL: COPY with `write_row`; MySQL: PyMySQL's multi-row `executemany`); *raw "
            "executemany* (PostgreSQL): psycopg's pipelined `executemany` of the enqueue INSERT."
        )
        out.append("")
        many_rows = [
            [
                e["backend"],
                e["many"]["jobs_per_transaction"],
                e["many"].get("library_many_jobs_per_s"),
                e["many"].get("raw_batched_jobs_per_s"),
                e["many"].get("ratio"),
                e["many"].get("raw_executemany_jobs_per_s", "-"),
                e["many"].get("ratio_executemany", "-"),
                e["many"].get("library_many_notify_jobs_per_s", "-"),
                e["many"].get("notify_ratio", "-"),
            ]
            for e in many
        ]
        out += _table(
            [
                "backend",
                "jobs/txn",
                "enqueue_many",
                "raw batched",
                "enqueue_many / raw",
                "raw executemany",
                "enqueue_many / executemany",
                "with notify",
                "notify cost",
            ],
            many_rows,
        )
        out.append("")
    return out + _notes(entries)


def _latency_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "latency")
    if not entries:
        return []
    out = ["### Enqueue-to-start latency and the idle worker's cost", ""]
    rows: list[list[Any]] = []
    for e in entries:
        if "enqueue_to_start" not in e:
            continue
        configurations = [e, *e.get("wake_up", [])]
        for c in configurations:
            lat, idle = c["enqueue_to_start"], c["idle"]
            server = idle.get("server_per_s", {})
            how = "wake-up" if lat.get("wake_up") else "polling"
            rows.append(
                [
                    e["backend"],
                    f"{how}, {lat['polling_interval_ms']:g} ms",
                    lat["p50_ms"],
                    lat["p95_ms"],
                    lat["p99_ms"],
                    idle["client_polls_per_s"],
                    "; ".join(f"{k} {v:.1f}/s" for k, v in server.items()) or "-",
                    idle["client_cpu_percent"],
                ]
            )
    out += _table(
        [
            "backend",
            "worker, polling interval",
            "latency p50 ms",
            "p95 ms",
            "p99 ms",
            "idle polls/s",
            "server, idle worker",
            "client CPU %",
        ],
        rows,
    )
    out.append("")
    out.append(
        "*polling*: jobs enqueued without notify, found by the next poll: at the default 100 ms interval "
        "the expected latency is about half the interval. *wake-up*: `enqueue(..., notify=True)` to a "
        "worker listening (`wake_on_notify=True`, PostgreSQL), at the default interval and at ten times "
        "it; latency is from the enqueuer's commit() returning, so it can be about zero (the worker may "
        "start the job before the commit returns to the enqueuer). The server's figures are the worker's "
        "alone: scans of its job table (PostgreSQL), its connection's session counters (MySQL); the "
        "listener connection sends no query while it waits."
    )
    out.append("")
    return out + _notes(entries)


def _memory_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "memory")
    if not entries:
        return []
    out = ["### Worker memory over a long drain", ""]
    rows: list[list[Any]] = []
    for e in entries:
        if "rss_start_mib" not in e:
            continue
        rows.append(
            [
                e["backend"],
                e["jobs"],
                e["threads"],
                e["rss_start_mib"],
                e["rss_middle_mib"],
                e["rss_end_mib"],
                e["rss_peak_sampled_mib"],
                e["growth_mib"],
                e["flat"] and e["finished"],
            ]
        )
    out += _table(
        ["backend", "jobs", "threads", "RSS start MiB", "middle", "end", "peak", "growth MiB", "flat"], rows
    )
    out.append("")
    return out + _notes(entries)


def _locust_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "locust")
    if not entries:
        return []
    out = ["### Locust: enqueuers and workers together", ""]
    rows: list[list[Any]] = []
    for e in entries:
        if "verification" not in e:
            continue
        q, ver = e.get("enqueue", {}), e["verification"]
        rows.append(
            [
                e["backend"],
                f"{e['users']} x {e['user_rate_per_s']:g}/s",
                e["worker_threads"],
                q.get("requests"),
                q.get("p50_ms"),
                q.get("p95_ms"),
                e["jobs_per_s"],
                "exactly once" if ver["ok"] else "FAIL: " + "; ".join(ver["problems"]),
            ]
        )
    out += _table(
        [
            "backend",
            "users x rate",
            "worker threads",
            "enqueued",
            "enqueue p50 ms",
            "p95 ms",
            "jobs/s",
            "archived",
        ],
        rows,
    )
    out.append("")
    return out + _notes(entries)


def _where_chained(*, mysql_chained: bool, mysql_async_chained: bool, mysqlclient: bool = False) -> str:
    """Which databases a run's chain drains ran on, as the limit section's notes say it."""
    if not mysql_chained:
        return "PostgreSQL only."
    if mysql_async_chained:
        where = "both on MySQL too"
        aiomysql = "; the asyncio worker's on aiomysql, AsyncMySQLBackend(compact=True, chain=True)"
    else:
        where, aiomysql = "*async chain* on PostgreSQL only; *chain* on MySQL too", ""
    drivers = (
        " The *mysqlclient* rows are the same server and statements with every threaded drain (library, "
        "compact, chain, raw) on mysqlclient (MySQLdb, the C driver) instead of PyMySQL "
        "(conformance.builtin:mysqlclient, mysqlclient_compact, mysqlclient_chain); the asyncio worker, on "
        "aiomysql whichever driver the threaded ones use, is drained on the *mysql* rows only."
        if mysqlclient
        else ""
    )
    return (
        f"{where}, where a finished job's archive and delete, each count checked by the server, its COMMIT "
        f"and the next claim go as one multi-statement query (conformance.builtin:mysql_chain{aiomysql})."
        f"{drivers}"
    )


def _drain_label(mode: str, row: dict[str, Any]) -> str:
    """A drain's name in the tables: on a batch row the library's is "batch", the asyncio worker's "async
    batch", the chained ones "batch chain", "async batch chain" and "async batch chain uvloop";
    "async_chain" is "async chain"."""
    batch = {
        "library": "batch",
        "async": "async batch",
        "chain": "batch chain",
        "async_chain": "async batch chain",
        "async_chain_uvloop": "async batch chain uvloop",
    }
    if row.get("batch_size", 1) > 1 and mode in batch:
        return batch[mode]
    return mode.replace("_", " ")


def _config(row: dict[str, Any], sep: str) -> str:
    """A throughput row's processes x threads, and its batch size when it ran in batch mode."""
    label = f"{row['processes']}{sep}{row['threads']}"
    return f"{label} batch {row['batch_size']}" if row.get("batch_size", 1) > 1 else label


def summary(results: dict[str, Any]) -> list[str]:
    """Every library / raw ratio and every peer's rate beside ours, in one compact table."""
    rows: list[list[Any]] = []
    for e in _entries(results, "throughput"):
        for r in e.get("rows", []):
            if "ratio" in r:
                rows.append([e["backend"], f"throughput {_config(r, 'x')}", "library / raw", r["ratio"]])
            if "ratio_pgbench" in r:
                rows.append(
                    [e["backend"], f"throughput {_config(r, 'x')}", "library / pgbench", r["ratio_pgbench"]]
                )
            for mode in ("pipeline", "async_pipeline"):
                if f"{mode}_ratio_pgbench" in r:
                    ratio = r[f"{mode}_ratio_pgbench"]
                    label = f"{_drain_label(mode, r)} / pgbench"
                    rows.append([e["backend"], f"throughput {_config(r, 'x')}", label, ratio])
            if "compact_ratio" in r:
                rows.append(
                    [e["backend"], f"throughput {_config(r, 'x')}", "compact / library", r["compact_ratio"]]
                )
            if "uvloop_ratio" in r:
                label = f"{_drain_label('async_chain_uvloop', r)} / {_drain_label('async_chain', r)}"
                rows.append([e["backend"], f"throughput {_config(r, 'x')}", label, r["uvloop_ratio"]])
            for mode in ("library", "compact", "chain", "async", "async_chain", "async_chain_uvloop"):
                label = _drain_label(mode, r)
                if f"{mode}_ratio_limit" in r:
                    rows.append(
                        [
                            e["backend"],
                            f"throughput {_config(r, 'x')}",
                            f"{label} / server limit",
                            r[f"{mode}_ratio_limit"],
                        ]
                    )
    for e in _entries(results, "enqueue_rate"):
        for r in e.get("rows", []):
            if "ratio" in r:
                rows.append(
                    [e["backend"], f"enqueue {r['jobs_per_transaction']}/txn", "library / raw", r["ratio"]]
                )
        many = e.get("many", {})
        for key, against in (("ratio", "raw batched"), ("ratio_executemany", "raw executemany")):
            if key in many:
                rows.append(
                    [
                        e["backend"],
                        f"enqueue_many {many['jobs_per_transaction']}/txn",
                        f"library / {against}",
                        many[key],
                    ]
                )
        for r in [*e.get("rows", []), many]:
            if "notify_ratio" in r:
                what = "enqueue_many" if "library_many_jobs_per_s" in r else "enqueue"
                rows.append(
                    [
                        e["backend"],
                        f"{what} {r['jobs_per_transaction']}/txn",
                        "with notify / without",
                        r["notify_ratio"],
                    ]
                )
    for e in _entries(results, "latency"):
        rows += _wake_up_ratios(e)
    for e in _entries(results, "peers"):
        systems = e.get("systems", [])
        ours = next((s["jobs_per_s"] for s in systems if s["name"] == "proletarian-ref"), None)
        for s in systems:
            if s["name"] != "proletarian-ref" and ours:
                rows.append(
                    [
                        e["backend"],
                        f"drain {e['jobs']:,} jobs",
                        f"{s['name']} / proletarian-ref",
                        s["jobs_per_s"] / ours,
                    ]
                )
        # Batch mode against each peer at equal connections: the target is >= 1 beside pgqueuer.
        # The threaded and the asyncio worker's batch modes alike (the asyncio target is >= 2x pgqueuer).
        ours_batch = [
            s for s in systems if s["name"].startswith("proletarian-ref") and " batch " in s["name"]
        ]
        for batch in ours_batch:
            for peer in (s for s in systems if not s["name"].startswith("proletarian-ref")):
                if peer["jobs_per_s"]:
                    rows.append(
                        [
                            e["backend"],
                            f"drain {e['jobs']:,} jobs",
                            f"{batch['name']} / {peer['name']}",
                            batch["jobs_per_s"] / peer["jobs_per_s"],
                        ]
                    )
        if "peers_missing" in e:
            rows.append([e["backend"], "peers", e["peers_missing"], "-"])
    if not rows:
        return []
    return ["### Summary: every ratio", "", *_table(["backend", "what", "ratio of", "value"], rows), ""]


def _wake_up_ratios(entry: dict[str, Any]) -> list[list[Any]]:
    """Wake-up against polling: latency at the same interval, idle scans at the longer interval."""
    rows: list[list[Any]] = []
    polling = entry.get("enqueue_to_start", {})
    idle = entry.get("idle", {}).get("server_per_s", {}).get("job table scans")
    for c in entry.get("wake_up", []):
        lat = c["enqueue_to_start"]
        interval = lat["polling_interval_ms"]
        if interval == polling.get("polling_interval_ms") and polling.get("p50_ms"):
            for p in ("p50_ms", "p99_ms"):
                rows.append(
                    [
                        entry["backend"],
                        f"enqueue-to-start {p[:3]}, {interval:g} ms interval",
                        "wake-up / polling",
                        lat[p] / polling[p],
                    ]
                )
        scans = c["idle"].get("server_per_s", {}).get("job table scans")
        if interval != polling.get("polling_interval_ms") and idle and scans is not None:
            rows.append(
                [
                    entry["backend"],
                    f"idle scans/s, wake-up at {interval:g} ms",
                    f"/ polling at {polling.get('polling_interval_ms', 0):g} ms",
                    scans / idle,
                ]
            )
    return rows


def _peers_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "peers")
    if not entries:
        return []
    out = ["### Beside pgqueuer and procrastinate (no-op jobs, same PostgreSQL)", ""]
    rows: list[list[Any]] = []
    notes: list[str] = []
    for e in entries:
        if "systems" not in e:
            continue
        out.append(
            f"{e['jobs']:,} jobs drained whole by each system in turn, {e['rounds']} interleaved rounds, "
            f"{e['processes']} process(es) x {e['connections_per_process']} consumer connection(s) each; "
            "jobs/s is the median of the rounds (min-max beside it); enqueue is one job per call on one "
            "connection; latency is from an enqueue returning to its handler starting, one idle consumer."
        )
        out.append("")
        for s in e["systems"]:
            lat = s.get("latency", {})
            rows.append(
                [
                    s["name"],
                    s["version"],
                    s["jobs_per_s"],
                    f"{s['jobs_per_s_min']:,.0f}-{s['jobs_per_s_max']:,.0f}",
                    " ".join(f"{r['jobs_per_s']:.0f}" for r in s["rounds"]),
                    s["enqueue_jobs_per_s"],
                    lat.get("p50_ms"),
                    lat.get("p95_ms"),
                    "exactly once"
                    if s["verification"]["ok"]
                    else "FAIL: " + "; ".join(s["verification"]["problems"]),
                ]
            )
            notes.append(f"- **{s['name']}**: {s['promise']}. Configured: {s['config']}.")
        if "peers_missing" in e:
            notes.append(f"- {e['peers_missing']}")
    out += _table(
        [
            "system",
            "version",
            "drain jobs/s",
            "min-max",
            "rounds",
            "enqueue jobs/s",
            "latency p50 ms",
            "p95 ms",
            "done",
        ],
        rows,
    )
    out += ["", *notes, ""]
    return out + _notes(entries)


def _long_handlers_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "long_handlers")
    if not entries:
        return []
    out = ["### What long handlers cost", ""]
    rows: list[list[Any]] = []
    for e in entries:
        for phase, p in e.get("phases", {}).items():
            if not p:
                continue
            server = (
                f"dead tuples {_num(p.get('dead_tuples_max'))}, xmin age {_num(p.get('xmin_age_max'))}"
                if "dead_tuples_max" in p
                else f"lock waits {_num(p.get('lock_waits_max'))}, "
                f"undo history {_num(p.get('history_length_max'))}"
            )
            rows.append(
                [e["backend"], phase, p["short_jobs_per_s"], p["poll_ms_median"], p["poll_ms_max"], server]
            )
    if rows:
        e0 = next(e for e in entries if "phases" in e)
        out.append(
            f"{e0['long_handlers']} handlers hold their claim {e0['hold_s']:g} s each while short jobs "
            f"arrive at {e0['stream_rate_per_s']:g}/s; sampled every {e0['sample_s']:g} s. Server figures "
            "are the phase's maximum; poll is one claim on the short queue, rolled back."
        )
        out.append("")
    out += _table(["backend", "phase", "short jobs/s", "poll ms median", "poll ms max", "server (max)"], rows)
    out.append("")
    return out + _notes(entries)


def _serializer_section(results: dict[str, Any]) -> list[str]:
    entries = _entries(results, "serializer")
    if not entries:
        return []
    out = ["### Serializer", ""]
    for e in entries:
        if "payloads" not in e:
            continue
        out.append(
            f"Transit encode and decode in this process, µs of CPU a call (best of {e['repeats']} timings "
            f"of at least {e['seconds']} s; `python -m benchmarks.serializer`):"
        )
        out += ["", *serializer_table(e["payloads"]).splitlines()]
    out.append("")
    return out + _notes(entries)


def _profile_section(results: dict[str, Any]) -> list[str]:
    rows: list[list[Any]] = []
    for e in _entries(results, "throughput"):
        p = e.get("profile")
        if not p:
            continue
        top = [
            (k, v)
            for k, v in p["library"]["tottime_us_per_job_by_source"].items()
            if not k.startswith("waiting") and "socket" not in k
        ][:4]
        rows.append(
            [
                e["backend"],
                p["library"]["us_per_job"],
                p["raw"]["us_per_job"],
                p["library"]["cpu_us_per_job"],
                p["raw"]["cpu_us_per_job"],
                p["library_cpu_over_raw_us_per_job"],
                ", ".join(f"{k} {v:.0f}" for k, v in top),
            ]
        )
    if not rows:
        return []
    out = ["### Where a job's time goes (one thread, cProfile)", ""]
    out += _table(
        [
            "backend",
            "library wall µs/job",
            "raw wall µs/job",
            "library CPU µs/job",
            "raw CPU µs/job",
            "CPU difference",
            "library, own time by source (profiled, µs/job)",
        ],
        rows,
    )
    out.append("")
    return out


def poll_chart(results: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    for e in _entries(results, "poll_latency"):
        for indexed, style in ((True, "-o"), (False, "--s"), (None, ":^")):
            cells = sorted(
                (c for c in e.get("cells", []) if c["indexed"] is indexed), key=lambda c: c["depth"]
            )
            if cells:
                label = (
                    f"{e['backend']}, " + {True: "index", False: "no index", None: "as installed"}[indexed]
                )
                ax.plot(
                    [c["depth"] for c in cells], [c["p99_ms"] for c in cells], style, label=f"{label} (p99)"
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows in the job table")
    ax.set_ylabel("claim latency p99 (ms)")
    ax.set_title("Poll (claim) latency against table depth")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def throughput_chart(results: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    labels: list[str] = []
    for e in _entries(results, "throughput"):
        rows = [r for r in e.get("rows", []) if "skipped" not in r]
        if not rows:
            continue  # a backend whose drains all errored or were skipped: its problem is in the tables
        names = [_config(r, "x") for r in rows]
        for name in names:
            if name not in labels:
                labels.append(name)
        xs = [labels.index(n) for n in names]
        ax.plot(xs, [r["library_jobs_per_s"] for r in rows], "-o", label=f"{e['backend']}, proletarian-ref")
        if rows and "raw_jobs_per_s" in rows[0]:
            ax.plot(xs, [r["raw_jobs_per_s"] for r in rows], "--s", label=f"{e['backend']}, raw driver loop")
        compact = [
            (x, r["compact_jobs_per_s"]) for x, r in zip(xs, rows, strict=True) if "compact_jobs_per_s" in r
        ]
        if compact:
            ax.plot(*zip(*compact, strict=True), ":^", label=f"{e['backend']}, compact plan")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("worker processes x threads")
    ax.set_ylabel("jobs per second (no-op handler)")
    ax.set_title("Throughput against workers")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def peers_chart(results: dict[str, Any], path: Path) -> bool:
    """Drain rate (median, min-max, each round), enqueue rate and latency per system; False if no data."""
    entries = [e for e in _entries(results, "peers") if e.get("systems")]
    if not entries:
        return False
    systems = entries[0]["systems"]
    names = [s["name"] for s in systems]
    xs = list(range(len(names)))
    fig, (drain, enq, lat) = plt.subplots(1, 3, figsize=(11, 4.2), dpi=110)
    medians = [s["jobs_per_s"] for s in systems]
    spread = [
        [m - s["jobs_per_s_min"] for m, s in zip(medians, systems, strict=True)],
        [s["jobs_per_s_max"] - m for m, s in zip(medians, systems, strict=True)],
    ]
    drain.bar(xs, medians, yerr=spread, capsize=6, color="#4c72b0", alpha=0.8)
    for x, s in zip(xs, systems, strict=True):
        rates = [r["jobs_per_s"] for r in s["rounds"]]
        drain.plot([x] * len(rates), rates, "k.", alpha=0.6)
    drain.set_title(f"drain of {entries[0]['jobs']:,} no-op jobs")
    drain.set_ylabel("jobs per second (median, min-max, rounds)")
    enq.bar(xs, [s["enqueue_jobs_per_s"] for s in systems], color="#55a868", alpha=0.8)
    enq.set_title("enqueue, one job per call")
    enq.set_ylabel("jobs per second")
    p50 = [s.get("latency", {}).get("p50_ms") or 0.0 for s in systems]
    p95 = [s.get("latency", {}).get("p95_ms") or 0.0 for s in systems]
    lat.bar(
        xs,
        p50,
        yerr=[[0.0] * len(p50), [max(0.0, b - a) for a, b in zip(p50, p95, strict=True)]],
        capsize=6,
        color="#c44e52",
        alpha=0.8,
    )
    lat.set_title("enqueue to handler start (p50, to p95)")
    lat.set_ylabel("milliseconds")
    for ax in (drain, enq, lat):
        ax.set_xticks(xs, names, fontsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
    c = entries[0]
    fig.suptitle(
        f"Same PostgreSQL, {c['processes']} process(es) x {c['connections_per_process']} connection(s) each",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def long_handlers_chart(entry: dict[str, Any], path: Path) -> None:
    """Server-side cost, poll time and the short stream's rate over time; the long holds shaded."""
    samples = entry["samples"]
    t = [s["t_s"] for s in samples]
    fig, (server, poll, rate) = plt.subplots(3, 1, figsize=(7.5, 7.5), dpi=110, sharex=True)
    if "dead_tuples" in samples[0]:
        left, right = (
            ("dead_tuples", "dead tuples (job table)"),
            ("xmin_age", "oldest backend_xmin age (xids)"),
        )
    else:
        left, right = ("history_length", "undo history length"), ("lock_waits", "lock waits")
    server.plot(t, [s.get(left[0]) or 0 for s in samples], "-o", markersize=3, color="#4c72b0", label=left[1])
    server.set_ylabel(left[1], color="#4c72b0")
    twin = server.twinx()
    twin.plot(t, [s.get(right[0]) or 0 for s in samples], "--", color="#c44e52", label=right[1])
    twin.set_ylabel(right[1], color="#c44e52")
    poll.plot(t, [s["poll_ms"] for s in samples], "-o", markersize=3, color="#8172b2")
    poll.set_ylabel("claim on the short queue (ms)")
    rate.plot(t, [s["short_jobs_per_s"] for s in samples], "-o", markersize=3, color="#55a868")
    rate.set_ylabel("short jobs per second")
    rate.set_xlabel("seconds")
    held = entry.get("hold_s_observed")
    for ax in (server, poll, rate):
        if held:
            ax.axvspan(held[0], held[1], color="orange", alpha=0.15)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    twin.set_ylim(bottom=0)
    server.set_title(
        f"{entry['backend']}: {entry['long_handlers']} handlers holding their claim {entry['hold_s']:g} s "
        "(shaded) beside short jobs"
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """results.json, results.md, the charts, and each backend's profile text; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "poll_chart": out_dir / POLL_CHART,
        "throughput_chart": out_dir / THROUGHPUT_CHART,
    }
    for e in _entries(results, "throughput"):
        profile = e.get("profile")
        if profile and "text" in profile:
            text = profile.pop("text")
            path = out_dir / f"profile_{e['backend']}.txt"
            path.write_text(
                "\n".join(f"===== {name}\n{body}" for name, body in text.items()), encoding="utf-8"
            )
            paths[f"profile_{e['backend']}"] = path
    paths["json"].write_text(json.dumps(_jsonable(results), indent=2, default=str) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown(results), encoding="utf-8")
    poll_chart(results, paths["poll_chart"])
    throughput_chart(results, paths["throughput_chart"])
    if peers_chart(results, out_dir / PEERS_CHART):
        paths["peers_chart"] = out_dir / PEERS_CHART
    for e in _entries(results, "long_handlers"):
        if e.get("samples"):
            path = out_dir / f"long_handlers_{e['backend']}.png"
            long_handlers_chart(e, path)
            paths[f"long_handlers_{e['backend']}"] = path
    return paths
