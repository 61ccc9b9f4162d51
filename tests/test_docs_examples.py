"""Every fenced code block in README.md and docs/*.md runs as written, or its Markdown says why not.

How a block is run depends on the fence's language:

- ```python: the block is a script, run by this interpreter in a subprocess.
- ```sh, ```bash: the block runs in `bash -e -o pipefail`; ```console: its `$ ` lines do, the rest is
  output and is not checked.
- ```json: the block must parse as JSON.
- ```text (synopses, sample output), ```sql, ```clojure, ```edn, ```toml, ```ini, ```yaml: not run.
- A fence with no language fails: say what the block is.

Every block must exit 0 within 60 s, in a fresh temporary directory that holds `app/jobs.py` (with
`handle(job_type, payload)`, the handler the examples name), with the checkout first on PYTHONPATH and
this interpreter's bin directory first on PATH (so `python` and `proletarian-ref` are the ones under
test). The examples' databases are the CI servers: PostgreSQL `postgresql://localhost/app` (PGUSER and
PGPASSWORD come from PROLETARIAN_TEST_PG_DSN) and MySQL/MariaDB `app` on localhost as root, and
PROLETARIAN_DSN names the PostgreSQL one, as a user who set it would. Before each Markdown file the
default tables (proletarian.job, proletarian.archived_job) are dropped and installed afresh in both, and
its blocks run in order, one file at a time on this machine (a lock file), since they share those tables.

A block that cannot run as written says so in an HTML comment on the line right before its fence:

    <!-- doc-test: skip (why: e.g. it builds a virtualenv and runs the whole CI) -->
    <!-- doc-test: interrupt-after 5 (why: e.g. a worker runs until Ctrl-C) -->
    <!-- doc-test: enter-after 3 (why: e.g. it works until Enter is pressed) -->
    <!-- doc-test: timeout 300 (why: e.g. it takes minutes) -->
    <!-- doc-test: expect-output (why: e.g. the job is handled, so it was committed) -->

`interrupt-after N`: the block must still be running after N seconds; it then gets SIGINT (Ctrl-C) and
must exit 0. `enter-after N`: the same, but a newline arrives on its stdin instead. `expect-output`:
every line of the ```text block that follows (its sample output) must be a line of what the block
printed, in any order. Options combine with commas (`enter-after 3, expect-output (...)`). The reason in
parentheses is required: a marker without one, with an unknown option, or not followed by a fence fails
the test. docs/README.md says the same for those who write the docs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import psycopg
import pymysql
import pytest

import proletarian_ref
from proletarian_ref import schema

ROOT: Final = Path(__file__).resolve().parent.parent
DOCUMENTS: Final = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN: Final = {"python", "sh", "bash", "console"}
NOT_RUN: Final = {"text", "sql", "clojure", "edn", "toml", "ini", "yaml"}
DEFAULT_TIMEOUT_S: Final = 60.0
EXAMPLES_DATABASE: Final = "app"
LOCK_FILE: Final = Path(tempfile.gettempdir()) / "proletarian-ref-doc-examples.lock"
APP_JOBS: Final = '''"""The application module the examples' `--handler app.jobs:handle` names."""


def handle(job_type, payload):
    print(job_type, payload)
'''

_FENCE: Final = re.compile(r"^(\s*)(```+)\s*([\w+-]*)\s*$")
_MARKER: Final = re.compile(r"^\s*<!--\s*doc-test:(.*?)-->\s*$")
_MARKER_BODY: Final = re.compile(r"^\s*(?P<options>[^()]*?)\s*\((?P<reason>.*\S.*)\)\s*$")
_OPTION: Final = re.compile(
    r"^(?:(skip)|(expect-output)|(interrupt-after|enter-after|timeout)\s+(\d+(?:\.\d+)?))$"
)


@dataclass
class Block:
    """One fenced block and what its marker says."""

    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    skip: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    stop_after_s: float | None = None
    stop_by: str | None = None  # "interrupt" or "enter"
    expect_output: bool = False
    expected: list[str] = field(default_factory=list)  # lines of the ```text block that follows
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _apply_marker(block: Block, body: str) -> None:
    match = _MARKER_BODY.match(body)
    if match is None:
        block.problems.append(f"marker {body.strip()!r} has no reason: write `<!-- doc-test: ... (why) -->`")
        return
    for option in filter(None, (o.strip() for o in match["options"].split(","))):
        parsed = _OPTION.match(option)
        if parsed is None:
            block.problems.append(f"unknown doc-test option {option!r}")
        elif parsed[1]:
            block.skip = True
        elif parsed[2]:
            block.expect_output = True
        elif parsed[3] == "timeout":
            block.timeout_s = float(parsed[4])
        else:
            block.stop_by = parsed[3].removesuffix("-after")
            block.stop_after_s = float(parsed[4])


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with its marker applied and its problems listed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    marker: tuple[int, str] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        marked = _MARKER.match(line)
        if marked:
            if marker is not None:
                blocks.append(_orphan(path, marker[0]))
            marker = (index + 1, marked[1])
        elif fence:
            _indent, ticks, language = fence.groups()
            body: list[str] = []
            index += 1
            while index < len(lines) and lines[index].strip() != ticks:
                body.append(lines[index])
                index += 1
            block = Block(path, index - len(body), language.lower(), textwrap.dedent("\n".join(body)) + "\n")
            if marker is not None:
                _apply_marker(block, marker[1])
                marker = None
            if not block.language:
                block.problems.append("the fence has no language: ```python, ```sh, ```text, ```json ...")
            elif block.language not in RUN | NOT_RUN | {"json"}:
                block.problems.append(f"unknown fence language {block.language!r}")
            blocks.append(block)
        elif marker is not None and line.strip():
            blocks.append(_orphan(path, marker[0]))
            marker = None
        index += 1
    if marker is not None:
        blocks.append(_orphan(path, marker[0]))
    for block, following in zip(blocks, [*blocks[1:], None], strict=False):  # None pairs the last block
        if not block.expect_output:
            continue
        if following is None or following.language != "text":
            block.problems.append("expect-output needs a ```text block (the output) as the next fence")
        else:
            block.expected = [line.strip() for line in following.text.splitlines() if line.strip()]
    return blocks


def _orphan(path: Path, line: int) -> Block:
    block = Block(path, line, "", "")
    block.problems.append("a doc-test marker must come right before a fence (blank lines aside)")
    return block


def _document_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- the databases the examples name ---------------------------------------------------------------


@dataclass(frozen=True)
class Servers:
    pg_dsn: str  # the examples' database on the test server
    env: dict[str, str]


def _mysql(database: str | None = None) -> pymysql.Connection[Any]:
    # Where the examples connect: localhost:3306 as root (the fixture checks the test server is there).
    return pymysql.connect(host="127.0.0.1", port=3306, user="root", database=database)


def _local(host: str | None) -> bool:
    return host in (None, "", "localhost", "127.0.0.1", "::1")


@pytest.fixture(scope="module")
def servers(pg_dsn: str, mysql_dsn: str) -> Servers:
    """The `app` database on both test servers, which must be the local ones the examples connect to."""
    pg, my = urlsplit(pg_dsn), urlsplit(mysql_dsn)
    for name, parts, port in (("PostgreSQL", pg, 5432), ("MySQL", my, 3306)):
        if not _local(parts.hostname) or (parts.port or port) != port:
            pytest.fail(
                f"the doc examples connect to {name} on localhost:{port}, the test server is elsewhere"
            )
    if my.username not in (None, "root") or my.password:
        pytest.fail("the doc examples connect to MySQL as root without a password")
    examples_pg = pg._replace(path=f"/{EXAMPLES_DATABASE}").geturl()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (EXAMPLES_DATABASE,)).fetchone()
        if exists is None:
            # Another xdist worker may create it between the look and the CREATE: then it exists, as wanted.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(f"CREATE DATABASE {EXAMPLES_DATABASE}")
    with _mysql() as server, server.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE IF NOT EXISTS {EXAMPLES_DATABASE}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "PROLETARIAN_DSN"))}
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        PROLETARIAN_DSN=examples_pg,
        PGUSER=unquote(pg.username or "postgres"),
        PYTHONUNBUFFERED="1",
    )
    if pg.password:
        env["PGPASSWORD"] = unquote(pg.password)
    return Servers(examples_pg, env)


def _fresh_default_tables(servers: Servers) -> None:
    with psycopg.connect(servers.pg_dsn) as conn:
        conn.execute("DROP SCHEMA IF EXISTS proletarian CASCADE")
        conn.commit()
        schema.install(conn)
    with _mysql(EXAMPLES_DATABASE) as mysql:
        with mysql.cursor() as cursor:
            # Only the two default tables: the database `proletarian` is the server's, others use it too.
            cursor.execute("DROP TABLE IF EXISTS proletarian.job, proletarian.archived_job")
        schema.install(mysql)


@pytest.fixture
def one_file_at_a_time() -> Iterator[None]:
    LOCK_FILE.touch(exist_ok=True)
    with LOCK_FILE.open("r") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- running one block -----------------------------------------------------------------------------


def _command(block: Block, workdir: Path) -> list[str]:
    if block.language == "python":
        script = workdir / "doc_example.py"
        script.write_text(block.text, encoding="utf-8")
        return [sys.executable, str(script)]
    text = block.text
    if block.language == "console":
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ ")) + "\n"
    script = workdir / "doc_example.sh"
    script.write_text(text, encoding="utf-8")
    return ["bash", "-e", "-o", "pipefail", str(script)]


def run_block(block: Block, env: dict[str, str]) -> str | None:
    """None if the block ran as its marker says, else what went wrong."""
    if block.language == "json":
        try:
            json.loads(block.text)
        except json.JSONDecodeError as exc:
            return f"not JSON: {exc}"
        return None
    with tempfile.TemporaryDirectory(prefix="doc-example-") as tmp:
        workdir = Path(tmp)
        (workdir / "app").mkdir()
        (workdir / "app" / "__init__.py").write_text("", encoding="utf-8")
        (workdir / "app" / "jobs.py").write_text(APP_JOBS, encoding="utf-8")
        output = workdir / "doc_example.out"
        with output.open("w", encoding="utf-8") as sink:
            process = subprocess.Popen(
                _command(block, workdir),
                cwd=workdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # a process group of its own, to interrupt or kill as a whole
            )
            try:
                error = _outcome(block, process)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        printed = output.read_text(encoding="utf-8")
        if error is None:
            lines = {line.strip() for line in printed.splitlines()}
            missing = [line for line in block.expected if line not in lines]
            error = f"did not print {missing}" if missing else None
        return None if error is None else f"{error}:\n{printed}"


def _outcome(block: Block, process: subprocess.Popen[str]) -> str | None:
    assert process.stdin is not None
    if block.stop_after_s is not None:
        try:
            process.wait(timeout=block.stop_after_s)
        except subprocess.TimeoutExpired:
            pass
        else:
            return f"ended (exit {process.returncode}) before the {block.stop_by} at {block.stop_after_s:g} s"
        if block.stop_by == "interrupt":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.stdin.write("\n")
    process.stdin.close()
    try:
        process.wait(timeout=block.timeout_s)
    except subprocess.TimeoutExpired:
        return f"still running after {block.timeout_s:g} s"
    if process.returncode != 0:
        return f"exit {process.returncode}"
    return None


# -- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("document", DOCUMENTS, ids=_document_id)
def test_every_block_says_what_it_is_and_every_marker_gives_a_reason(document: Path) -> None:
    problems = [f"{block.where}: {problem}" for block in blocks_of(document) for problem in block.problems]
    assert problems == []


def _runnable(document: Path) -> list[Block]:
    return [b for b in blocks_of(document) if not b.problems and not b.skip and b.language not in NOT_RUN]


# Only documents with a block to run: one without is covered by the marker test above, not skipped here.
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if _runnable(d)], ids=_document_id)
def test_every_block_runs_as_written(document: Path, servers: Servers, one_file_at_a_time: None) -> None:
    blocks = _runnable(document)
    _fresh_default_tables(servers)
    failures = [
        f"{block.where} ({block.language}): {error}"
        for block in blocks
        if (error := run_block(block, servers.env))
    ]
    assert not failures, "\n\n".join(failures)


# -- what a new user types first -------------------------------------------------------------------

_SUBMODULE_USE: Final = re.compile(r"\b(?:pr|proletarian_ref)\.([a-z_]+)\.[a-z_]")


def _fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)


def submodules_named_in_the_docs() -> list[str]:
    """Submodules the docs use as `pr.<module>.<name>` or `proletarian_ref.<module>.<name>`."""
    package = Path(proletarian_ref.__file__).parent
    named = {m for doc in DOCUMENTS for m in _SUBMODULE_USE.findall(doc.read_text(encoding="utf-8"))}
    return sorted(
        m for m in named if (package / f"{m}.py").exists() or (package / m / "__init__.py").exists()
    )


def test_the_docs_name_submodules() -> None:
    # The schema install is the first thing a new user calls; if this list empties, the test below
    # proves nothing.
    assert "schema" in submodules_named_in_the_docs()


@pytest.mark.parametrize("module", submodules_named_in_the_docs())
def test_every_submodule_the_docs_name_is_an_attribute_after_import_proletarian_ref(module: str) -> None:
    result = _fresh_python(f"import proletarian_ref\nprint(getattr(proletarian_ref, {module!r}).__name__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"proletarian_ref.{module}"


def test_import_proletarian_ref_loads_no_database_driver() -> None:
    probe = (
        "import sys, proletarian_ref\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool', 'pymysql')))"
    )
    result = _fresh_python(probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- the checker itself ----------------------------------------------------------------------------


def _markdown(tmp_path: Path, text: str) -> list[Block]:
    document = tmp_path / "doc.md"
    document.write_text(textwrap.dedent(text), encoding="utf-8")
    return blocks_of(document)


def test_a_marker_without_a_reason_an_unknown_option_or_no_fence_is_a_problem(tmp_path: Path) -> None:
    blocks = _markdown(
        tmp_path,
        """
        <!-- doc-test: skip -->
        ```sh
        true
        ```

        <!-- doc-test: skip-it (why not) -->
        ```sh
        true
        ```

        <!-- doc-test: skip (a marker with no fence after it) -->
        Some prose.

        ```
        untagged
        ```
        """,
    )
    problems = [problem for block in blocks for problem in block.problems]
    assert len(problems) == 4, problems
    assert "has no reason" in problems[0]
    assert "unknown doc-test option 'skip-it'" in problems[1]
    assert "must come right before a fence" in problems[2]
    assert "no language" in problems[3]


def test_a_reason_may_hold_parentheses(tmp_path: Path) -> None:
    (block,) = _markdown(tmp_path, "<!-- doc-test: skip (needs `f()` of yours) -->\n```python\nf()\n```\n")
    assert block.problems == []
    assert block.skip


def test_a_failing_block_a_block_that_ends_too_soon_and_missing_output_are_reported(tmp_path: Path) -> None:
    failing, too_soon, silent, _output = _markdown(
        tmp_path,
        """
        ```python
        raise SystemExit(3)
        ```

        <!-- doc-test: interrupt-after 5 (should run until Ctrl-C) -->
        ```sh
        true
        ```

        <!-- doc-test: expect-output (prints the line below) -->
        ```sh
        echo something else
        ```

        ```text
        the expected line
        ```
        """,
    )
    env = dict(os.environ)
    assert (run_block(failing, env) or "").startswith("exit 3")
    assert (run_block(too_soon, env) or "").startswith("ended (exit 0) before the interrupt at 5 s")
    assert (run_block(silent, env) or "").startswith("did not print ['the expected line']")


def test_a_stopped_block_passes_when_it_exits_cleanly(tmp_path: Path) -> None:
    (block,) = _markdown(
        tmp_path,
        """
        <!-- doc-test: enter-after 1 (waits for Enter) -->
        ```python
        input()
        ```
        """,
    )
    assert run_block(block, dict(os.environ)) is None
