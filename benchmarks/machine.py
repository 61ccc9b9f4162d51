"""The machine, versions and git revision of a run, so figures are never read out of context."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import BackendSpec, require_sql, run_sql, sql_dialect
from conformance.harness import Harness

PACKAGES = (
    "proletarian-ref",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "PyMySQL",
    "mysqlclient",
    "asyncpg",
    "aiomysql",
    "uvloop",
    "transit-python",
    "locust",
    "gevent",
    "matplotlib",
    "rich",
    "psutil",
    "pgqueuer",
    "procrastinate",
)
REPO = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision(repo: Path = REPO) -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()

    try:
        # The changed paths beside the flag: a run whose tree differed from its commit in tests only can
        # then be told apart from one that measured uncommitted library code.
        changed = sorted(git("diff", "--name-only", "HEAD").split())
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed), "changed": changed}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def server_version(harness: Harness) -> str | None:
    if sql_dialect(harness) is None:
        return None
    sql_harness, _ = require_sql(harness)
    return str(run_sql(sql_harness, "SELECT version()")[0][0])


def machine() -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def describe(backends: list[BackendSpec]) -> dict[str, Any]:
    """Everything but the figures: machine, versions, git revision, each backend's server version."""
    servers: dict[str, str | None] = {}
    for spec in backends:
        try:
            harness = spec.load("proletarian.bench_probe", "proletarian.bench_probe_archive")
            try:
                servers[spec.factory] = server_version(harness)
            finally:
                harness.close()
        except Exception as exc:
            servers[spec.factory] = f"unknown ({type(exc).__name__}: {exc})"
    return {"machine": machine(), "versions": package_versions(), "servers": servers, "git": git_revision()}
