"""How long the conformance recipe takes, as a third party runs it, and how soon it names planted bugs.

`python -m benchmarks.conformance_speed [--out FILE]` lays out the recipe of docs/conformance.md and the
pg8000 backend of docs/backends.md as an author's project, runs pytest on it (one process, the default
`ci` profile) against the backend as printed, against the mysql-connector-python backend of
tests/third_party, and against copies of the pg8000 one with one planted bug each, and prints each run's
wall time, what pytest reported and which clauses failed (the test DSNs name the servers).
tests/third_party/test_recipe.py runs the same layout under xdist.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Final

from conformance.suite import clauses

ROOT: Final = Path(__file__).resolve().parent.parent
DOCS: Final = ROOT / "docs"
THIRD_PARTY: Final = ROOT / "tests" / "third_party"
# Clause families in the order docs/conformance.md lists them, and how much of a failure's line to show.
_CLAUSE_ORDER: Final = "ESADRTKCIZBPMN"
_SAID: Final = 160
PG_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
MYSQL_DSN: Final = "mysql://root@127.0.0.1:3306/test"
_PG8000_CONNECT: Final = f'''
import os
from urllib.parse import urlsplit

import pg8000.dbapi


def connect():
    url = urlsplit(os.environ.get("PROLETARIAN_TEST_PG_DSN", "{PG_DSN}"))
    return pg8000.dbapi.connect(user=url.username, password=url.password, host=url.hostname,
                                port=url.port or 5432, database=url.path.lstrip("/"))
'''
# What each recipe author ships: a Backend class and a zero-argument connect(), from the test DSNs.
MY_PACKAGES: Final = {
    "pg8000": '"""pg8000\'s backend, as docs/backends.md prints it."""\n'
    "from my_pg8000_backend import Pg8000Backend as MyBackend\n" + _PG8000_CONNECT,
    "mysql-connector": f'''"""mysql-connector-python's backend (tests/third_party/mysql_connector_backend)."""
import os
from urllib.parse import urlsplit

import mysql.connector
from mysql_connector_backend import MySQLConnectorBackend as MyBackend


def connect():
    url = urlsplit(os.environ.get("PROLETARIAN_TEST_MYSQL_DSN", "{MYSQL_DSN}"))
    return mysql.connector.connect(user=url.username, password=url.password or "", host=url.hostname,
                                   port=url.port or 3306, database=url.path.lstrip("/"))
''',
    "psycopg2": f'''"""psycopg2's backend (tests/third_party/psycopg2_backend)."""
import os

import psycopg2
from psycopg2_backend import Psycopg2Backend as MyBackend


def connect():
    return psycopg2.connect(os.environ.get("PROLETARIAN_TEST_PG_DSN", "{PG_DSN}"))
''',
}
# Bugs planted in the docs' pg8000 backend, one per copy: a piece of one statement replaced. The kinds a
# backend author meets most: a claim that waits for locked rows, and one that does not lock at all.
PLANTED: Final = {
    "claim without SKIP LOCKED (blocks on another transaction's lock)": (
        "get_next_job",
        "FOR UPDATE SKIP LOCKED",
        "FOR UPDATE",
    ),
    "claim without FOR UPDATE (two transactions claim one job)": (
        "get_next_job",
        "FOR UPDATE SKIP LOCKED",
        "",
    ),
}
_PLANTED_PACKAGE: Final = (
    '''"""The docs' pg8000 backend with one bug planted: {what}."""
from my_pg8000_backend import Pg8000Backend


class MyBackend(Pg8000Backend):
    def _statement(self, name, job_table, archived_job_table=None):
        text, names = super()._statement(name, job_table, archived_job_table)
        if name == {name!r}:
            assert {old!r} in text
            text = text.replace({old!r}, {new!r})
        return text, names
'''
    + _PG8000_CONNECT
)


def _first_words(message: str) -> str:
    """The start of a failure's line, cut at a word."""
    return message if len(message) <= _SAID else message[:_SAID].rsplit(" ", 1)[0] + " ..."


def fenced_python(document: Path, heading: str) -> str:
    """The first Python block under `heading` in `document`."""
    text = document.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    if match is None:
        raise ValueError(f"{document.name} has no Python block under {heading}")
    return match.group(1)


def write_recipe(project: Path, package: str, heading: str = "## Recipe") -> Path:
    """The recipe under `heading` of docs/conformance.md, `package` as my_package and the docs' pg8000
    backend laid out in `project`; the test file's folder."""
    code = fenced_python(DOCS / "conformance.md", heading)
    first_line = code.splitlines()[0]
    if not first_line.startswith("# tests/"):
        raise ValueError("the recipe must name the file it goes in on its first line")
    test_file = project / first_line.removeprefix("# ").strip()
    test_file.parent.mkdir(parents=True)
    test_file.write_text(code, encoding="utf-8")
    (project / "src" / "my_package").mkdir(parents=True)
    (project / "src" / "my_package" / "__init__.py").write_text(package, encoding="utf-8")
    backend = fenced_python(DOCS / "backends.md", "## A whole backend")
    name = backend.splitlines()[0].removeprefix("# ").split(":")[0]
    if name != "my_pg8000_backend.py":
        raise ValueError("docs/backends.md's backend must name its file on its first line")
    (project / "src" / name).write_text(backend, encoding="utf-8")
    return test_file.parent


@dataclass(frozen=True, slots=True)
class RecipeRun:
    """One pytest run of the recipe."""

    returncode: int
    seconds: float
    output: str

    @property
    def summary(self) -> str:
        """pytest's closing line, without its time."""
        lines = [line for line in self.output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
        return re.sub(r"\s*in [\d.]+s.*$", "", lines[-1].strip("= ")) if lines else "(no summary)"

    @property
    def failures(self) -> dict[str, str]:
        """Clause id -> the first line of its failure, from pytest's short summary (-rf)."""
        by_test = {test: clause for clause, (test, _) in clauses().items()}
        found: dict[str, str] = {}
        for test, message in re.findall(r"^FAILED \S+::(test_\w+)(?: - (.*))?$", self.output, re.M):
            found[by_test.get(test, test)] = message.strip()
        return dict(sorted(found.items(), key=lambda item: _CLAUSE_ORDER.find(item[0][0])))


def run_recipe(
    project: Path,
    package: str,
    *options: str,
    table_tag: str,
    timeout: float = 1200,
    heading: str = "## Recipe",
) -> RecipeRun:
    """pytest on the recipe with `package` as my_package, with this interpreter, in a subprocess.

    Without xdist the recipe names its tables after PYTEST_XDIST_WORKER, set here to `table_tag` (and the
    test table prefix), so that runs on one server stay apart.
    """
    tests = write_recipe(project, package, heading)
    path = [str(project / "src"), str(THIRD_PARTY), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")])}
    env["PYTEST_XDIST_WORKER"] = os.environ.get("PROLETARIAN_TEST_TABLE_PREFIX", "") + table_tag
    # Wide enough that pytest's short summary keeps each failure's message (it cuts to the terminal's width).
    env["COLUMNS"] = "400"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *options],
        cwd=tests.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return RecipeRun(result.returncode, time.monotonic() - started, result.stdout + result.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.conformance_speed", description=__doc__)
    parser.add_argument("--out", type=Path, help="also write the printed report to this file")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.conformance_speed" + (f" --out {args.out}" if args.out else "")
    profile = os.environ.get("PROLETARIAN_HYPOTHESIS_PROFILE") or "ci"
    lines = [
        f"$ {command}",
        f"profile {profile}, pytest -p no:xdist (one process), load average at the start "
        + " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "",
        "| backend | wall s | pytest | failed |",
        "|---|---:|---|---|",
    ]
    ok = True
    said: list[str] = []
    # The backends as written, which must pass, then the planted bugs, which must fail.
    runs = {
        "pg8000 (PostgreSQL), as docs/backends.md prints it": MY_PACKAGES["pg8000"],
        "mysql-connector-python (MySQL), tests/third_party": MY_PACKAGES["mysql-connector"],
    }
    for what, (name, old, new) in PLANTED.items():
        runs[what] = _PLANTED_PACKAGE.format(what=what, name=name, old=old, new=new)
    for index, (what, package) in enumerate(runs.items()):
        with TemporaryDirectory(prefix="proletarian-conformance-speed-") as tmp:
            run = run_recipe(Path(tmp), package, "-p", "no:xdist", table_tag=f"speed{index}")
        failures = run.failures
        lines.append(f"| {what} | {run.seconds:.0f} | {run.summary} | {', '.join(failures) or 'none'} |")
        print(lines[-1], flush=True)
        said.extend(f"- {what}, {clause}: {_first_words(message)}" for clause, message in failures.items())
        ok = ok and (run.returncode == 0) == (index < len(runs) - len(PLANTED))
    lines.append("load average at the end " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    report = "\n".join([*lines, "", "What each failure said first:", "", *said])
    print("\n" + report)
    if args.out is not None:
        args.out.write_text(report + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
