"""The server's own ceiling for Proletarian's transaction: pgbench running the very statements, no Python.

The raw loop still pays for a Python client on the same two cores; pgbench (C, prepared statements, one
thread per core) is as little client as PostgreSQL can have. Its rate for claim, archive, delete and
commit at a given number of connections bounds what any client of one-job-a-transaction can reach there,
so the library's default mode is shown against it as well as against the raw loop.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from benchmarks.common import BENCH_QUEUE_TEXT, archived_table_of, job_table_of, sql_dialect
from benchmarks.raw import STATUS_SUCCESS
from conformance.harness import Harness, SqlHarness
from proletarian_ref.sql import render

_TPS = re.compile(r"tps = ([0-9.]+) \(without initial connection time\)")
_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")
# The library binds `now` and `finished_at` as text parameters; pgbench cannot compute a timestamp per
# transaction, so the server's clock stands in: the same plan, the same rows, one parameter fewer.
_PARAMETERS = {
    "%(queue)s": ":queue",
    "%(now)s": "now()",
    "%(job_id)s": ":job_id",
    "%(status)s": ":status",
    "%(finished_at)s": "now()",
}


def pgbench_skip_reason(harness: Harness) -> str | None:
    if sql_dialect(harness) != "postgresql":
        return "pgbench runs against PostgreSQL only"
    if pgbench_path() is None:
        return "pgbench is not installed (Debian: postgresql-client or postgresql)"
    return None


def pgbench_path() -> str | None:
    found = shutil.which("pgbench")
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True)
    return str(candidates[0]) if candidates else None


def pgbench_env(harness: SqlHarness) -> dict[str, str]:
    """The environment that points pgbench (libpq) at the harness's database."""
    conn = harness.connect()
    try:
        info = conn.info
        return dict(
            os.environ,
            PGHOST=info.host,
            PGPORT=str(info.port),
            PGUSER=info.user,
            PGDATABASE=info.dbname,
            PGPASSWORD=info.password or "",
        )
    finally:
        conn.close()


def script(harness: SqlHarness) -> str:
    """Proletarian's transaction for pgbench: sql/postgresql/queries.sql's statements, variables bound."""
    job, archived = job_table_of(harness), archived_table_of(harness)
    claim = render("postgresql", "get_next_job", job)
    archive = render("postgresql", "archive_job", job, archived)
    delete = render("postgresql", "delete_job", job)
    statements = []
    for statement in (claim, archive, delete):
        bound = statement
        for placeholder, variable in _PARAMETERS.items():
            bound = bound.replace(placeholder, variable)
        if "%(" in bound:
            raise ValueError(f"a parameter pgbench has no value for is left in {bound!r}")
        statements.append(" ".join(bound.split()))
    claim_line, archive_line, delete_line = statements
    # \gset stores the claimed row's columns as variables (job_id among them) for the next statements.
    return f"BEGIN;\n{claim_line} \\gset\n{archive_line};\n{delete_line};\nCOMMIT;\n"


class _Finished(Protocol):
    """What run_pgbench reads of a finished run: subprocess's CompletedProcess, or costs.ToolRun."""

    @property
    def returncode(self) -> int: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...


_Run = TypeVar("_Run", bound=_Finished)


def pgbench_rate(harness: SqlHarness, clients: int, seconds: int) -> dict[str, Any]:
    """Jobs per second of `clients` pgbench connections draining the harness's queue for `seconds`.

    The queue must hold enough due jobs for the whole run: a claim that finds none aborts its client.
    """

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            check=False,
            env=pgbench_env(harness),
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )

    _done, processed, tps = run_pgbench(script(harness), clients, seconds, run)
    return {"jobs": processed, "seconds": seconds, "jobs_per_s": tps}


def run_pgbench(
    script_text: str, clients: int, seconds: int, run: Callable[[list[str]], _Run]
) -> tuple[_Run, int, float]:
    """pgbench running `script_text` on `clients` connections for `seconds`, prepared, with the bench
    queue's and the success status's variables, through `run` (its command line in, the finished run out):
    that run, the transactions it processed and their rate. Raises naming pgbench's own error when it
    failed or printed no rate."""
    executable = pgbench_path()
    if executable is None:
        raise RuntimeError("pgbench is not installed")
    with tempfile.NamedTemporaryFile("w", suffix=".sql", encoding="utf-8") as file:
        file.write(script_text)
        file.flush()
        done = run(
            [
                executable,
                "--no-vacuum",
                "--protocol=prepared",
                f"--client={clients}",
                f"--jobs={min(clients, os.cpu_count() or 1)}",
                f"--time={seconds}",
                f"--define=queue={BENCH_QUEUE_TEXT}",
                f"--define=status={STATUS_SUCCESS}",
                f"--file={file.name}",
            ]
        )
    tps, processed = _TPS.search(done.stdout), _PROCESSED.search(done.stdout)
    if done.returncode != 0 or tps is None or processed is None:
        raise RuntimeError(
            f"pgbench failed (exit {done.returncode}): {done.stderr.strip()[-500:] or done.stdout[-500:]}"
        )
    return done, int(processed.group(1)), float(tps.group(1))
