"""MySQL DSN options for a managed server: TLS (verified or not, with a client certificate) and charset.

Against a throwaway MariaDB that takes TCP connections over TLS only, with certificates the fixture makes
(tests/fix_throwaway.py). docs/mysql.md#tls-and-charset documents the options.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pymysql
import pytest
from cli_support import run
from fix_throwaway import TLS_PASSWORD, TLS_PREFIX, ThrowawayTlsMySQL, sweep_leftovers

from proletarian_ref import process_next_job
from proletarian_ref.backends.dsn import connection_factory, mysql_connect_kwargs
from proletarian_ref.cli.errors import ExitCode
from proletarian_ref.errors import ConfigurationError

pytestmark = pytest.mark.mysql


@pytest.fixture
def server(throwaway_mysql_tls: ThrowawayTlsMySQL) -> ThrowawayTlsMySQL:
    throwaway_mysql_tls.start()
    return throwaway_mysql_tls


def _dsn(server: ThrowawayTlsMySQL, user: str = "tls", host: str = "127.0.0.1", **options: Any) -> str:
    query = "&".join(f"{key}={quote(str(value), safe='/')}" for key, value in options.items())
    return f"mysql://{user}:{TLS_PASSWORD}@{host}:{server.port}/app" + (f"?{query}" if query else "")


def _session(dsn: str) -> dict[str, str]:
    conn = connection_factory(dsn)()
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
            [(_, version)] = cursor.fetchall()
            cursor.execute("SELECT @@character_set_client, @@collation_connection")
            [(charset, collation)] = cursor.fetchall()
        return {"tls": version, "charset": charset, "collation": collation}
    finally:
        conn.close()


def test_verify_identity_connects_over_tls_to_the_server_the_ca_signed(server: ThrowawayTlsMySQL) -> None:
    session = _session(_dsn(server, ssl_mode="VERIFY_IDENTITY", ssl_ca=server.tls.ca))
    assert session["tls"].startswith("TLS")
    assert session["charset"] == "utf8mb4"


def test_a_ca_alone_verifies_the_server_certificate(server: ThrowawayTlsMySQL) -> None:
    assert _session(_dsn(server, ssl_ca=server.tls.ca))["tls"].startswith("TLS")
    # PyMySQL given only ssl_ca would encrypt and accept any certificate; the DSN verifies it.
    with pytest.raises(pymysql.err.OperationalError, match="CERTIFICATE_VERIFY_FAILED"):
        _session(_dsn(server, ssl_ca=server.tls.other_ca))


def test_verify_identity_refuses_a_name_the_certificate_does_not_carry(server: ThrowawayTlsMySQL) -> None:
    # The certificate names 127.0.0.1, not localhost: verify_ca accepts it, verify_identity does not.
    assert _session(_dsn(server, host="localhost", ssl_mode="verify_ca", ssl_ca=server.tls.ca))["tls"]
    with pytest.raises(pymysql.err.OperationalError, match="CERTIFICATE_VERIFY_FAILED"):
        _session(_dsn(server, host="localhost", ssl_mode="verify_identity", ssl_ca=server.tls.ca))


def test_required_encrypts_without_a_ca_and_disabled_is_refused_by_a_tls_only_server(
    server: ThrowawayTlsMySQL,
) -> None:
    assert _session(_dsn(server, ssl_mode="required"))["tls"].startswith("TLS")
    with pytest.raises(pymysql.err.OperationalError):
        _session(_dsn(server, ssl_mode="disabled"))
    with pytest.raises(pymysql.err.OperationalError):
        _session(_dsn(server, ssl_disabled="true"))


def test_a_client_certificate_logs_in_a_user_that_requires_x509(server: ThrowawayTlsMySQL) -> None:
    tls = server.tls
    with pytest.raises(pymysql.err.OperationalError):
        _session(_dsn(server, user="certified", ssl_ca=tls.ca))
    with_cert = _dsn(
        server, user="certified", ssl_ca=tls.ca, ssl_cert=tls.client_cert, ssl_key=tls.client_key
    )
    assert _session(with_cert)["tls"].startswith("TLS")


def test_pymysqls_option_names_work_too(server: ThrowawayTlsMySQL) -> None:
    dsn = _dsn(server, host="localhost", ssl_ca=server.tls.ca, ssl_verify_identity="true")
    with pytest.raises(pymysql.err.OperationalError, match="CERTIFICATE_VERIFY_FAILED"):
        _session(dsn)
    assert _session(_dsn(server, ssl_ca=server.tls.ca, ssl_verify_cert="1"))["tls"].startswith("TLS")


def test_charset_sets_the_sessions_character_set(server: ThrowawayTlsMySQL) -> None:
    session = _session(_dsn(server, ssl_mode="required", charset="latin1"))
    assert session["charset"] == "latin1"


def test_the_library_and_the_cli_run_jobs_over_a_verified_tls_dsn(
    server: ThrowawayTlsMySQL, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = server.tls
    dsn = _dsn(server, ssl_mode="verify_identity", ssl_ca=tls.ca)
    tables = ["--job-table", "app.tls_job", "--archived-job-table", "app.tls_archived_job"]
    assert run(capsys, "schema", "install", "--dsn", dsn, *tables).code == ExitCode.OK
    result = run(capsys, "enqueue", "my.app/over-tls", '{"n": 1}', "--dsn", dsn, *tables)
    assert result.code == ExitCode.OK, result.err
    seen: list[tuple[str, Any]] = []
    assert process_next_job(
        connection_factory(dsn),
        lambda job_type, payload: seen.append((job_type, payload)),
        job_table="app.tls_job",
        archived_job_table="app.tls_archived_job",
        log=lambda event, data: None,
    )
    assert seen == [("my.app/over-tls", {"n": 1})]


def test_tls_options_build_a_verifying_context_and_bad_ones_are_named(tmp_path: Path) -> None:
    kwargs = mysql_connect_kwargs("mysql://u@h/db?ssl_mode=REQUIRED")
    context = kwargs["ssl"]
    assert isinstance(context, ssl.SSLContext)
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_NONE, False)
    assert mysql_connect_kwargs("mysql://u@h/db?ssl_mode=disabled")["ssl_disabled"] is True
    assert "ssl" not in mysql_connect_kwargs("mysql://u@h/db?ssl_mode=preferred")
    assert mysql_connect_kwargs("mysql://u@h/db?charset=utf8mb3")["charset"] == "utf8mb3"
    bad = {
        "ssl_mode=sometimes": "ssl_mode must be one of",
        "ssl_key=/k.pem": "ssl_key needs ssl_cert",
        f"ssl_ca={tmp_path}/absent.pem": "cannot load ssl_ca",
        "ssl_mode=disabled&ssl_verify_cert=true": "contradicts",
        "ssl_verify_cert=maybe": "ssl_verify_cert must be true or false",
        "sslmode=require": "TLS options are ssl_mode",
    }
    for query, message in bad.items():
        with pytest.raises(ConfigurationError, match=message) as caught:
            mysql_connect_kwargs(f"mysql://u:secret@h/db?{query}")
        assert "secret" not in str(caught.value)
    with pytest.raises(ConfigurationError, match="unsupported MySQL DSN option 'password'") as caught:
        mysql_connect_kwargs("mysql://u@h/db?password=secret")
    assert "secret" not in str(caught.value)


def test_a_run_sweeps_the_tls_servers_a_killed_run_left_and_only_those() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = Path(tempfile.mkdtemp(prefix=TLS_PREFIX))
    (left / "mysqld.pid").write_text(f"{dead.pid}\n")
    serving = Path(tempfile.mkdtemp(prefix=TLS_PREFIX))
    (serving / "mysqld.pid").write_text(f"{os.getpid()}\n")
    starting = Path(tempfile.mkdtemp(prefix=TLS_PREFIX))  # no pid file yet: a run installing its server
    try:
        sweep_leftovers(TLS_PREFIX)
        assert (left.exists(), serving.exists(), starting.exists()) == (False, True, True)
    finally:
        for path in (left, serving, starting):
            shutil.rmtree(path, ignore_errors=True)
