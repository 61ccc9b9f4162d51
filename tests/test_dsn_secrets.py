"""A DSN's secrets (user:password@, libpq's ?password= and ?sslpassword=) never reach a message or log.

One function hides them, proletarian_ref.backends.dsn.redact; these tests go through each place a DSN is
printed: the worker's start line, "cannot connect" errors, the MySQL option error.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pytest
from cli_support import (
    Result,
    drop_tables,
    harness_for,
    isolate,
    run,
    run_cli,
    start_cli,
    subprocess_env,
    table_names,
    wait_for,
)
from fix_throwaway import TLS_PASSWORD, ThrowawayTlsMySQL

from proletarian_ref.backends.dsn import asyncpg_connect_args, dialect_of_dsn, redact, scrub
from proletarian_ref.cli.errors import ExitCode
from proletarian_ref.errors import ConfigurationError

SECRET = "pa55word"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("mysql://user:secret@h:3306/db", "mysql://user:***@h:3306/db"),
        (
            "postgresql://u@h/db?password=secret&sslmode=require",
            "postgresql://u@h/db?password=***&sslmode=require",
        ),
        ("postgresql://u:p%40ss@h/db?sslpassword=k3y", "postgresql://u:***@h/db?sslpassword=***"),
        ("postgresql:///db?host=/run/pg&PASSWORD=x", "postgresql:///db?host=/run/pg&PASSWORD=***"),
        ("postgresql://u:pw@h1:5432,h2:5432/db", "postgresql://u:***@h1:5432,h2:5432/db"),
        ("postgresql://u:@h/db?password=", "postgresql://u:@h/db?password="),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_redact_hides_every_secret_and_keeps_the_rest_as_written(dsn: str, shown: str) -> None:
    assert redact(dsn) == shown


def test_scrub_hides_the_secrets_as_written_and_decoded_in_a_drivers_message() -> None:
    dsn = "postgresql://u:p%40ss@h/db?password=a+b%21"
    text = "FATAL: password p@ss or p%40ss or a b! or a+b%21 refused"
    assert scrub(text, dsn) == "FATAL: password *** or *** or *** or *** refused"


def _unreachable(dialect: str) -> str:
    if dialect == "postgresql":
        return f"postgresql://someone@127.0.0.1:1/test?password={SECRET}&sslpassword={SECRET}2"
    return f"mysql://someone:{SECRET}@127.0.0.1:1/test?connect_timeout=2"


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_cannot_connect_errors_hide_the_password(capsys: pytest.CaptureFixture[str], dialect: str) -> None:
    job, archived = table_names("secrets")
    dsn = _unreachable(dialect)
    result = run(capsys, "list", "--dsn", dsn, "--job-table", job, "--archived-job-table", archived)
    assert result.code == ExitCode.CANNOT_CONNECT, result.err
    assert f"cannot connect to {redact(dsn)} (--dsn)" in result.err
    assert SECRET not in result.err and "***" in result.err


def test_the_asyncpg_option_error_hides_the_password() -> None:
    with pytest.raises(ConfigurationError, match="libpq's option 'keepalives'") as caught:
        asyncpg_connect_args(f"postgresql://someone:{SECRET}@127.0.0.1:1/test?password={SECRET}&keepalives=1")
    assert SECRET not in str(caught.value)


def test_the_mysql_option_error_hides_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    for query in (f"password={SECRET}", "sslmode=require"):
        dsn = f"mysql://someone:{SECRET}@127.0.0.1:1/test?{query}"
        result = run(capsys, "list", "--dsn", dsn)
        assert result.code == ExitCode.USAGE_ERROR, result.err
        assert "unsupported MySQL DSN option" in result.err
        assert SECRET not in result.err


def _worker_start_line(dsn: str, *worker_args: str) -> Result:
    """The worker's stderr from its start to a SIGTERM once it has run one job (with `worker_args`, the
    default's threaded worker and honours_stop)."""
    job, archived = table_names("secrets")
    tables = ["--job-table", job, "--archived-job-table", archived]
    env = subprocess_env()
    assert run_cli("schema", "install", "--dsn", dsn, *tables, env=env).code == ExitCode.OK
    marker = Path(env.get("TMPDIR", "/tmp")) / f"proletarian-secrets-{job}"
    marker.unlink(missing_ok=True)
    payload = f'{{"marker": "{marker}", "seconds": 0}}'
    assert run_cli("enqueue", "t/secret", payload, "--dsn", dsn, *tables, env=env).code == ExitCode.OK
    args = worker_args or ("--handler", "cli_handlers:honours_stop")
    process = start_cli("worker", *args, "--dsn", dsn, *tables, env=env)
    try:
        wait_for(marker.exists, timeout=60, what="the worker to run the job", process=process)
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
        marker.unlink(missing_ok=True)
        Path(f"{marker}.finished").unlink(missing_ok=True)  # sleeps_async's
        harness = harness_for(dialect_of_dsn(dsn), dsn, "secrets")
        drop_tables(harness)
        harness.close()
    return Result(process.returncode, out, err)


# The query's password reaches psycopg (threaded) and asyncpg (the asyncio worker on --async-driver).
@pytest.mark.parametrize(
    "worker_args",
    [(), ("--handler", "cli_handlers:sleeps_async", "--async-driver", "asyncpg")],
    ids=["psycopg", "asyncpg"],
)
def test_the_worker_start_line_hides_a_libpq_query_password(
    pg_dsn: str, worker_args: tuple[str, ...]
) -> None:
    parts = urlsplit(pg_dsn)
    # The real password, if the test server has one, moves into the query; else any: the server trusts.
    secret = unquote(parts.password) if parts.password else SECRET
    user = parts.username or "postgres"
    query = "&".join(q for q in (parts.query, f"password={quote(secret, safe='')}") if q)
    dsn = parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}", query=query).geturl()
    result = _worker_start_line(dsn, *worker_args)
    assert result.code == ExitCode.OK, result.err
    assert f"in {redact(dsn)} (--dsn)" in result.err and "password=***" in result.err
    assert secret not in result.err


def test_the_worker_start_line_hides_a_mysql_password(throwaway_mysql_tls: ThrowawayTlsMySQL) -> None:
    throwaway_mysql_tls.start()
    dsn = f"mysql://tls:{TLS_PASSWORD}@127.0.0.1:{throwaway_mysql_tls.port}/app?ssl_mode=required"
    result = _worker_start_line(dsn)
    assert result.code == ExitCode.OK, result.err
    assert f"in {redact(dsn)} (--dsn)" in result.err and "tls:***@" in result.err
    assert TLS_PASSWORD not in result.err
