"""Pytest plugin: databases under test from DSNs, else testcontainers, else a loud skip (in CI, an error)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance import builtin
from conformance.harness import Harness, SqlHarness, load_harness

ALL_BACKENDS = ("postgresql", "mysql", "memory")
PG_ENV = builtin.PG_ENV
MYSQL_ENV = builtin.MYSQL_ENV


def databases_required() -> bool:
    """In CI a missing database fails the run; elsewhere it skips with the reason."""
    flag = os.environ.get("PROLETARIAN_TEST_REQUIRE_DATABASES") or os.environ.get("CI") or ""
    return flag.lower() not in ("", "0", "false", "no")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backends",
        default=os.environ.get("PROLETARIAN_TEST_BACKENDS", ",".join(ALL_BACKENDS)),
        help="comma-separated backends to test: postgresql, mysql, memory (default: all)",
    )


def selected_backends(config: pytest.Config) -> list[str]:
    names = [n.strip() for n in str(config.getoption("--backends")).split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL_BACKENDS))
    if unknown:
        raise pytest.UsageError(f"unknown backends {unknown}; choose from {', '.join(ALL_BACKENDS)}")
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db" in metafunc.fixturenames:
        backends = selected_backends(metafunc.config)
        if metafunc.definition.get_closest_marker("sql_only"):
            backends = [b for b in backends if b != "memory"]
        metafunc.parametrize("db", backends, indirect=True)


_BACKEND_FIXTURES = {
    "postgresql": (
        *("pg_db", "pg_harness", "pg_dsn", "pg_pipeline_db", "pg_pipeline_harness"),
        *("pg_compact_db", "pg_compact_harness"),
    ),
    "mysql": (
        "mysql_db",
        "mysql_harness",
        "mysql_dsn",
        "mysql_compact_db",
        "mysql_compact_harness",
        "mysql_chain_db",
        "mysqlclient_db",
        "mysqlclient_chain_db",
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out tests tied to a backend that --backends did not choose (tox runs one backend an env)."""
    chosen = set(selected_backends(config))
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        unchosen = [b for b, names in _BACKEND_FIXTURES.items() if b not in chosen and fixtures & set(names)]
        (dropped if unchosen else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _docker_available() -> bool:
    try:
        # Imported by name: docker is optional and ships no type stubs.
        docker = importlib.import_module("docker")
        docker.from_env().ping()
    except Exception:
        return False
    return True


def _unavailable(what: str, env: str) -> None:
    message = (
        f"{what} tests need {env} (a DSN) or a running Docker engine for testcontainers; neither is here"
    )
    if databases_required():
        pytest.fail(f"{message} (CI requires every database)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    dsn = os.environ.get(PG_ENV)
    if dsn:
        yield dsn
        return
    if _docker_available():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver=None) as container:
            yield container.get_connection_url()
        return
    # A fresh machine with neither a server nor Docker still tests PostgreSQL, on the same embedded
    # server the CLI uses (shared by the xdist workers; the last one to release it stops it).
    from proletarian_ref.ops.embedded import EmbeddedServerError, start

    try:
        server = start(Path(tempfile.gettempdir()) / "proletarian-ref-tests-pg")
    except EmbeddedServerError as exc:
        _unavailable("PostgreSQL", f"{PG_ENV} ({exc})")
        return
    try:
        yield server.dsn
    finally:
        server.release()


@pytest.fixture(scope="session")
def mysql_dsn() -> Iterator[str]:
    dsn = os.environ.get(MYSQL_ENV)
    if dsn:
        yield dsn
        return
    if not _docker_available():
        _unavailable("MySQL", MYSQL_ENV)
    from testcontainers.mysql import MySqlContainer

    with MySqlContainer("mysql:8.0", username="root", password="test", dbname="test") as container:
        host, port = container.get_container_host_ip(), container.get_exposed_port(3306)
        yield f"mysql://root:test@{host}:{port}/test"


def table_suffix() -> str:
    # Each xdist worker gets its own tables: lock tests need several connections that see committed
    # rows, so tests cannot be isolated by rolling back.
    # PROLETARIAN_TEST_TABLE_PREFIX keeps concurrent runs on one server (several checkouts) apart too.
    return os.environ.get("PROLETARIAN_TEST_TABLE_PREFIX", "") + os.environ.get("PYTEST_XDIST_WORKER", "main")


def _installed(harness: SqlHarness) -> SqlHarness:
    """Check the server answers, then (re)create this worker's tables, one xdist worker at a time."""
    try:
        harness.connect().close()
    except Exception as exc:
        pytest.fail(f"cannot connect to the {harness.dialect} test database: {exc}", pytrace=False)
    lock = (
        "pg_advisory_lock(4242)"
        if harness.dialect == "postgresql"
        else "GET_LOCK('proletarian_ref_tests', 60)"
    )
    unlock = (
        "pg_advisory_unlock(4242)"
        if harness.dialect == "postgresql"
        else "RELEASE_LOCK('proletarian_ref_tests')"
    )
    # Concurrent CREATE SCHEMA IF NOT EXISTS can still collide on PostgreSQL; a session lock on one
    # connection serialises the installs of all workers.
    guard = harness.connect()
    try:
        cursor = guard.cursor()
        cursor.execute(f"SELECT {lock}")
        cursor.fetchall()
        harness.install()
        cursor.execute(f"SELECT {unlock}")
        cursor.fetchall()
        cursor.close()
    finally:
        guard.close()
    return harness


def _load(factory: str, dsn: str) -> SqlHarness:
    # Through load_harness, so the harness remembers how it was made and a worker process of the
    # conformance suite can build the same one.
    suffix = table_suffix()
    harness = load_harness(
        factory,
        dsn=dsn,
        job_table=f"proletarian.job_{suffix}",
        archived_job_table=f"proletarian.archived_job_{suffix}",
    )
    assert isinstance(harness, SqlHarness)
    return harness


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


@pytest.fixture(scope="session")
def pg_harness(pg_dsn: str) -> SqlHarness:
    # PROLETARIAN_TEST_PG_PIPELINE=1 runs every PostgreSQL test on the pipelined statement plan, and
    # PROLETARIAN_TEST_COMPACT=1 every SQL test on the compact one.
    if _env_flag("PROLETARIAN_TEST_PG_PIPELINE") and _env_flag("PROLETARIAN_TEST_COMPACT"):
        raise pytest.UsageError("PROLETARIAN_TEST_PG_PIPELINE and PROLETARIAN_TEST_COMPACT: choose one plan")
    factory = "conformance.builtin:postgresql"
    if _env_flag("PROLETARIAN_TEST_PG_PIPELINE"):
        factory = "conformance.builtin:postgresql_pipeline"
    elif _env_flag("PROLETARIAN_TEST_COMPACT"):
        factory = "conformance.builtin:postgresql_compact"
    return _installed(_load(factory, pg_dsn))


@pytest.fixture(scope="session")
def pg_pipeline_harness(pg_harness: SqlHarness, pg_dsn: str) -> SqlHarness:
    # The tables pg_harness installed, under the pipelined backend.
    return _load("conformance.builtin:postgresql_pipeline", pg_dsn)


@pytest.fixture(scope="session")
def pg_compact_harness(pg_harness: SqlHarness, pg_dsn: str) -> SqlHarness:
    # The tables pg_harness installed, under the backend on the compact plan.
    return _load("conformance.builtin:postgresql_compact", pg_dsn)


@pytest.fixture(scope="session")
def mysql_harness(mysql_time_zones: str) -> SqlHarness:
    # On a server with its time zone tables: the zone clause (Z1) sets named zones.
    compact = _env_flag("PROLETARIAN_TEST_COMPACT")
    factory = "conformance.builtin:mysql_compact" if compact else "conformance.builtin:mysql"
    return _installed(_load(factory, mysql_time_zones))


@pytest.fixture(scope="session")
def mysql_compact_harness(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    # The tables mysql_harness installed, under the backend on the compact plan.
    return _load("conformance.builtin:mysql_compact", mysql_time_zones)


@pytest.fixture(scope="session")
def mysql_chain_harness(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    # The tables mysql_harness installed, under the backend on the compact plan with chained claims.
    return _load("conformance.builtin:mysql_chain", mysql_time_zones)


@pytest.fixture(scope="session")
def mysqlclient_harness(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    # The tables mysql_harness installed, under the backend on mysqlclient's connections.
    return _load("conformance.builtin:mysqlclient", mysql_time_zones)


@pytest.fixture(scope="session")
def mysqlclient_chain_harness(mysql_harness: SqlHarness, mysql_time_zones: str) -> SqlHarness:
    # The same, with chained claims on the compact plan.
    return _load("conformance.builtin:mysqlclient_chain", mysql_time_zones)


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The backend named by the test's parameter, with empty tables."""
    name = request.param
    harness: Harness
    if name == "memory":
        harness = builtin.memory()
    else:
        harness = request.getfixturevalue("pg_harness" if name == "postgresql" else "mysql_harness")
        harness.clear()
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def pg_db(pg_harness: SqlHarness) -> Iterator[SqlHarness]:
    pg_harness.clear()
    yield pg_harness
    pg_harness.close()


@pytest.fixture
def pg_pipeline_db(pg_pipeline_harness: SqlHarness) -> Iterator[SqlHarness]:
    pg_pipeline_harness.clear()
    yield pg_pipeline_harness
    pg_pipeline_harness.close()


@pytest.fixture
def pg_compact_db(pg_compact_harness: SqlHarness) -> Iterator[SqlHarness]:
    pg_compact_harness.clear()
    yield pg_compact_harness
    pg_compact_harness.close()


@pytest.fixture
def mysql_db(mysql_harness: SqlHarness) -> Iterator[SqlHarness]:
    mysql_harness.clear()
    yield mysql_harness
    mysql_harness.close()


@pytest.fixture
def mysql_compact_db(mysql_compact_harness: SqlHarness) -> Iterator[SqlHarness]:
    mysql_compact_harness.clear()
    yield mysql_compact_harness
    mysql_compact_harness.close()


@pytest.fixture
def mysql_chain_db(mysql_chain_harness: SqlHarness) -> Iterator[SqlHarness]:
    mysql_chain_harness.clear()
    yield mysql_chain_harness
    mysql_chain_harness.close()


@pytest.fixture
def mysqlclient_db(mysqlclient_harness: SqlHarness) -> Iterator[SqlHarness]:
    mysqlclient_harness.clear()
    yield mysqlclient_harness
    mysqlclient_harness.close()


@pytest.fixture
def mysqlclient_chain_db(mysqlclient_chain_harness: SqlHarness) -> Iterator[SqlHarness]:
    mysqlclient_chain_harness.clear()
    yield mysqlclient_chain_harness
    mysqlclient_chain_harness.close()


@pytest.fixture(scope="session")
def mysql_time_zones(mysql_dsn: str) -> str:
    """The MySQL DSN, on a server whose named time zones ('Europe/Oslo') are loaded.

    A fresh server has empty zone tables; tests that set a named session time zone need them. Loaded from
    the system's zoneinfo once per server (under the install lock), over PyMySQL so a container's server
    gets them too.
    """
    import pymysql
    from pymysql.constants import CLIENT

    from proletarian_ref.backends.dsn import mysql_connect_kwargs

    conn = pymysql.connect(**mysql_connect_kwargs(mysql_dsn), client_flag=CLIENT.MULTI_STATEMENTS)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK('proletarian_ref_tests', 300)")
            cursor.execute("SELECT COUNT(*) FROM mysql.time_zone_name")
            ((count,),) = cursor.fetchall()
            if count == 0:
                tool = shutil.which("mariadb-tzinfo-to-sql") or shutil.which("mysql_tzinfo_to_sql")
                if tool is None:
                    pytest.fail("the server has no time zone tables and no mysql_tzinfo_to_sql to load them")
                script = subprocess.run(
                    [tool, "/usr/share/zoneinfo"], check=True, capture_output=True, text=True
                ).stdout
                cursor.execute("USE mysql")
                cursor.execute(script)
                while cursor.nextset():
                    pass
                conn.commit()
            cursor.execute("SELECT RELEASE_LOCK('proletarian_ref_tests')")
    finally:
        conn.close()
    return mysql_dsn
