"""The server's limit for a whole job's work: claim, archive and delete done inside the server, no client.

Proletarian's plan (and the raw loop, and pgbench running its statements) sends the claim, the archive,
the delete and the commit from a client. Here the server does all of it in one call: on PostgreSQL one
statement (a CTE claiming with FOR UPDATE SKIP LOCKED, deleting and archiving what it claimed) driven by
pgbench; on MariaDB/MySQL a stored procedure, created in a throwaway database and dropped after, driven by
mariadb-slap (or mysqlslap). Both run on the benchmark's own tables, `per_commit` jobs a transaction, so
any client of the queue, however fast, stays under this rate: the ratio of a drain to it says how much of
the database's capacity the client leaves unused.

These statements are the benchmark's own yardstick, not the library's: they are built here from the
validated table names, as server_ceiling.py builds pgbench's script from queries.sql.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BENCH_QUEUE_TEXT,
    archived_table_of,
    batch_claim,
    count_rows,
    job_table_of,
    require_sql,
    sql_dialect,
)
from benchmarks.costs import ToolRun, run_tool, share_of
from benchmarks.raw import STATUS_SUCCESS
from benchmarks.server_ceiling import pgbench_env, pgbench_path, run_pgbench
from conformance.harness import Harness, SqlHarness

_SLAP_SECONDS = re.compile(r"Average number of seconds to run all queries: ([0-9.]+) seconds")
_COLUMNS = "job_id, queue, job_type, payload, attempts, enqueued_at, process_at"
_ARCHIVED = "job_id, queue, job_type, payload, attempts, status, enqueued_at, process_at, finished_at"
_CLAIM_HEAD = f"SELECT {_COLUMNS}\nFROM"


def _dsn_password(harness: SqlHarness) -> str:
    from urllib.parse import unquote, urlsplit

    from benchmarks.async_drain import harness_dsn

    password = urlsplit(harness_dsn(harness)).password
    return unquote(password) if password else ""


def _text(value: Any) -> str:
    """PyMySQL keeps the user and password as bytes."""
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _slap() -> str | None:
    return shutil.which("mariadb-slap") or shutil.which("mysqlslap")


def limit_skip_reason(harness: Harness) -> str | None:
    dialect = sql_dialect(harness)
    if dialect is None:
        return f"{harness.name} is not a built-in SQL dialect, so the server's limit is not measured"
    if dialect == "postgresql" and pgbench_path() is None:
        return "pgbench is not installed (Debian: postgresql-client or postgresql)"
    if dialect == "mysql" and _slap() is None:
        return "neither mariadb-slap nor mysqlslap is installed (Debian: mariadb-client)"
    return None


def pg_statement(harness: SqlHarness, per_commit: int) -> str:
    """The whole job's work as one PostgreSQL statement, for pgbench (its :queue and :status variables)."""
    job, archived = job_table_of(harness), archived_table_of(harness)
    return (
        f"WITH claimed AS (SELECT job_id FROM {job} WHERE queue = :queue AND process_at <= now() "
        f"ORDER BY process_at ASC LIMIT {int(per_commit)} FOR UPDATE SKIP LOCKED), "
        f"moved AS (DELETE FROM {job} j USING claimed c WHERE j.job_id = c.job_id "
        f"RETURNING j.job_id, j.queue, j.job_type, j.payload, j.attempts, j.enqueued_at, j.process_at) "
        f"INSERT INTO {archived} ({_ARCHIVED}) SELECT job_id, queue, job_type, payload, attempts + 1, "
        f":status, enqueued_at, process_at, now() FROM moved;\n"
    )


def procedure_claim(claim: str) -> str:
    """Batch mode's claim `claim` (common.batch_claim's text) as the procedure runs it: the ids alone, the
    bench queue and the procedure's n written in, the server's clock for the worker's."""
    if not claim.startswith(_CLAIM_HEAD):
        raise ValueError(f"the claim does not begin with {_CLAIM_HEAD!r}: {claim!r}")
    queue = "'" + BENCH_QUEUE_TEXT.replace("'", "''") + "'"
    ids = "SELECT job_id\nFROM" + claim[len(_CLAIM_HEAD) :]
    return ids % {"queue": queue, "now": "UTC_TIMESTAMP()", "limit": "n"}


def mysql_procedure(harness: SqlHarness, name: str) -> str:
    """The whole job's work as a MariaDB/MySQL procedure `name`(n): n jobs a transaction, claimed with batch
    mode's claim as the library sends it (common.batch_claim)."""
    job, archived = job_table_of(harness), archived_table_of(harness)
    status = STATUS_SUCCESS.replace("'", "''")
    # The worker's sessions read committed (backend set-up); the claim is the library's own, so the limit
    # does the work a drain does, its bounded scan included. The claimed ids go through a session's
    # temporary table, so the archive and the delete join on them without a round trip.
    return f"""
CREATE PROCEDURE {name}(IN n INT)
BEGIN
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;
  CREATE TEMPORARY TABLE IF NOT EXISTS limit_claimed (job_id BINARY(16) PRIMARY KEY) ENGINE=MEMORY;
  START TRANSACTION;
  INSERT INTO limit_claimed (job_id)
{procedure_claim(batch_claim(harness))};
  INSERT INTO {archived} ({_ARCHIVED})
    SELECT j.job_id, j.queue, j.job_type, j.payload, j.attempts + 1, '{status}', j.enqueued_at,
           j.process_at, UTC_TIMESTAMP()
    FROM {job} j JOIN limit_claimed c ON j.job_id = c.job_id;
  DELETE j FROM {job} j JOIN limit_claimed c ON j.job_id = c.job_id;
  DELETE FROM limit_claimed;
  COMMIT;
END
"""


def limit_rate(
    harness: Harness, clients: int, per_commit: int, seconds: float, expected_jobs_per_s: float
) -> dict[str, Any]:
    """Jobs per second the server reaches doing the whole job's work itself, `clients` connections,
    `per_commit` jobs a transaction, for about `seconds`. The queue must hold enough due jobs.

    `expected_jobs_per_s` sizes mysqlslap's fixed number of calls (it cannot stop at a time).
    """
    sql_harness, dialect = require_sql(harness)
    before = count_rows(harness, archived=True)
    if dialect == "postgresql":
        result = _pgbench_limit(sql_harness, clients, per_commit, max(1, round(seconds)))
    else:
        calls = max(clients * 10, int(expected_jobs_per_s * seconds / per_commit))
        result = _slap_limit(sql_harness, clients, per_commit, calls)
    jobs = count_rows(harness, archived=True) - before
    # A queue run dry leaves calls that archive nothing, and a rate that is the load's, not the server's.
    result["ran_dry"] = count_rows(harness) == 0
    transactions = result.pop("transactions")
    # Every call archives per_commit jobs while the queue holds them; counted rows are the truth.
    result["jobs"] = jobs
    result["jobs_per_s"] = result["transactions_per_s"] * jobs / transactions if transactions else 0.0
    result["per_commit"] = per_commit
    kernel = {side: result.pop(f"{side}_kernel_s", None) for side in ("client", "server")}
    if jobs:
        # As a drain's (throughput.drain_rate): the tool's CPU, the server's for its connections, and a
        # round trip a call (one statement, or one CALL, a transaction).
        cpu = {"client": result.pop("client_cpu_s"), "server": result.pop("server_cpu_s", None)}
        result["per_job"] = {"client_cpu_us": cpu["client"] / jobs * 1e6, "round_trips": transactions / jobs}
        if cpu["server"] is not None:
            result["per_job"]["server_cpu_us"] = cpu["server"] / jobs * 1e6
        # Of each side's CPU, the share the kernel charged as system time (as limit_probe's drains').
        result["kernel_share"] = {
            side: share_of(k, cpu[side]) for side, k in kernel.items() if k is not None and cpu[side]
        }
    return result


def _pgbench_limit(harness: SqlHarness, clients: int, per_commit: int, seconds: int) -> dict[str, Any]:
    def run(command: list[str]) -> ToolRun:
        return run_tool(harness, command, pgbench_env(harness), seconds + 60, clients)

    done, processed, tps = run_pgbench(pg_statement(harness, per_commit), clients, seconds, run)
    return {
        "tool": "pgbench",
        "seconds": seconds,
        "transactions": processed,
        "transactions_per_s": tps,
        **_costs(done),
    }


def _slap_limit(harness: SqlHarness, clients: int, per_commit: int, calls: int) -> dict[str, Any]:
    executable = _slap()
    if executable is None:
        raise RuntimeError("neither mariadb-slap nor mysqlslap is installed")
    # A throwaway database of our own holds the procedure (and is what mysqlslap runs in), so nothing of
    # anyone else's is created, replaced or dropped.
    database = f"bench_limit_{uuid.uuid4().hex[:12]}"
    procedure = f"{database}.drain"
    conn = harness.connect()
    try:
        cursor = conn.cursor()
        cursor.execute(f"CREATE DATABASE {database}")
        try:
            cursor.execute(mysql_procedure(harness, procedure))
            conn.commit()
            host, port, user = (_text(v) for v in (conn.host, conn.port, conn.user))
            # mysqlclient keeps no password on its connections: the harness's DSN has it.
            password = _text(getattr(conn, "password", None) or _dsn_password(harness))
            command = [
                executable,
                f"--host={host}",
                f"--port={port}",
                f"--user={user}",
                f"--concurrency={clients}",
                "--iterations=1",
                f"--number-of-queries={calls}",
                f"--create-schema={database}",
                "--no-drop",
                f"--query=CALL {procedure}({int(per_commit)})",
            ]
            env = dict(os.environ)
            if password:
                env["MYSQL_PWD"] = password
            started = time.perf_counter()
            done = run_tool(harness, command, env, 600, clients)
            wall = time.perf_counter() - started
        finally:
            cursor.execute(f"DROP DATABASE IF EXISTS {database}")
            conn.commit()
    finally:
        conn.close()
    found = _SLAP_SECONDS.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(
            f"{Path(executable).name} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-500:] or done.stdout[-500:]}"
        )
    seconds = float(found.group(1))
    # mysqlslap gives each client calls // clients calls.
    transactions = calls // clients * clients
    return {
        "tool": Path(executable).name,
        "database": database,
        "seconds": seconds,
        "wall_seconds": round(wall, 3),
        "transactions": transactions,
        "transactions_per_s": transactions / seconds if seconds > 0 else 0.0,
        **_costs(done),
    }


def _costs(done: ToolRun) -> dict[str, Any]:
    """A tool run's CPU, whole-run seconds, for limit_rate to put per job (or why the server's is not)."""
    costs: dict[str, Any] = {"client_cpu_s": done.client_cpu_s, "client_kernel_s": done.client_kernel_s}
    if done.server_cpu_s is None:
        costs["server_cpu_skipped"] = done.server_cpu_reason
    else:
        costs["server_cpu_s"] = done.server_cpu_s
        costs["server_kernel_s"] = done.server_kernel_s
    return costs
