"""MySQL DSN options for a managed server: TLS (verified or not, with a client certificate) and charset,
on PyMySQL (mysql://) and on mysqlclient (mysql+mysqlclient://) alike.

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

import MySQLdb
import pymysql
import pytest
from cli_support import run
from fix_throwaway import TLS_PASSWORD, TLS_PREFIX, ThrowawayTlsMySQL, sweep_leftovers

from proletarian_ref import process_next_job
from proletarian_ref.backends.dsn import connection_factory, mysql_connect_kwargs, mysqlclient_connect_kwargs
from proletarian_ref.cli.errors import ExitCode
from proletarian_ref.errors import ConfigurationError

pytestmark = pytest.mark.mysql


@pytest.fixture
def server(throwaway_mysql_tls: ThrowawayTlsMySQL) -> ThrowawayTlsMySQL:
    throwaway_mysql_tls.start()
    return throwaway_mysql_tls


@pytest.fixture(params=["mysql", "mysql+mysqlclient"])
def scheme(request: pytest.FixtureRequest) -> str:
    """The DSN's scheme: PyMySQL's, or mysqlclient's, which takes the same options to the same effect."""
    return str(request.param)


# How each driver refuses a connection, and its words for a certificate it does not trust.
REFUSED: tuple[type[Exception], ...] = (pymysql.err.OperationalError, MySQLdb.OperationalError)
UNTRUSTED = "CERTIFICATE_VERIFY_FAILED|certificate verify failed|self-signed certificate|TLS/SSL error"


def _client_library() -> str:
    """The version of the client library mysqlclient was built on (3.x: MariaDB's Connector/C)."""
    client_info: Any = MySQLdb.get_client_info  # untyped in its stubs
    return str(client_info())


def _other_name(scheme: str) -> str:
    """A name for 127.0.0.1 that its certificate does not carry. On mysqlclient not localhost, which to
    libmysqlclient means the default Unix socket (another server); 127.1 is read as a name there."""
    return "127.1" if "mysqlclient" in scheme else "localhost"


def _dsn(
    server: ThrowawayTlsMySQL, scheme: str, user: str = "tls", host: str = "127.0.0.1", **options: Any
) -> str:
    query = "&".join(f"{key}={quote(str(value), safe='/')}" for key, value in options.items())
    return f"{scheme}://{user}:{TLS_PASSWORD}@{host}:{server.port}/app" + (f"?{query}" if query else "")


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


def test_verify_identity_connects_over_tls_to_the_server_the_ca_signed(
    server: ThrowawayTlsMySQL, scheme: str
) -> None:
    session = _session(_dsn(server, scheme, ssl_mode="VERIFY_IDENTITY", ssl_ca=server.tls.ca))
    assert session["tls"].startswith("TLS")
    assert session["charset"] == "utf8mb4"


def test_a_ca_alone_verifies_the_server_certificate(server: ThrowawayTlsMySQL, scheme: str) -> None:
    assert _session(_dsn(server, scheme, ssl_ca=server.tls.ca))["tls"].startswith("TLS")
    # PyMySQL given only ssl_ca would encrypt and accept any certificate; the DSN verifies it.
    with pytest.raises(REFUSED, match=UNTRUSTED):
        _session(_dsn(server, scheme, ssl_ca=server.tls.other_ca))


def test_verify_identity_refuses_a_name_the_certificate_does_not_carry(
    server: ThrowawayTlsMySQL, scheme: str
) -> None:
    # The certificate names 127.0.0.1, not the other name: verify_ca accepts it, verify_identity does not.
    # But mysqlclient built on MariaDB's Connector/C (major version 3, as here) checks the name for
    # verify_ca too (docs/mysql.md).
    verify_ca = _dsn(server, scheme, host=_other_name(scheme), ssl_mode="verify_ca", ssl_ca=server.tls.ca)
    if "mysqlclient" in scheme and _client_library().startswith("3."):
        with pytest.raises(REFUSED, match="Validation of SSL server certificate failed"):
            _session(verify_ca)
    else:
        assert _session(verify_ca)["tls"]
    with pytest.raises(REFUSED, match=UNTRUSTED):
        _session(
            _dsn(server, scheme, host=_other_name(scheme), ssl_mode="verify_identity", ssl_ca=server.tls.ca)
        )


def test_required_encrypts_without_a_ca_and_disabled_is_refused_by_a_tls_only_server(
    server: ThrowawayTlsMySQL, scheme: str
) -> None:
    assert _session(_dsn(server, scheme, ssl_mode="required"))["tls"].startswith("TLS")
    with pytest.raises(REFUSED):
        _session(_dsn(server, scheme, ssl_mode="disabled"))
    with pytest.raises(REFUSED):
        _session(_dsn(server, scheme, ssl_disabled="true"))


def test_a_client_certificate_logs_in_a_user_that_requires_x509(
    server: ThrowawayTlsMySQL, scheme: str
) -> None:
    tls = server.tls
    with pytest.raises(REFUSED):
        _session(_dsn(server, scheme, user="certified", ssl_ca=tls.ca))
    with_cert = _dsn(
        server, scheme, user="certified", ssl_ca=tls.ca, ssl_cert=tls.client_cert, ssl_key=tls.client_key
    )
    assert _session(with_cert)["tls"].startswith("TLS")


def test_pymysqls_option_names_work_too(server: ThrowawayTlsMySQL, scheme: str) -> None:
    dsn = _dsn(server, scheme, host=_other_name(scheme), ssl_ca=server.tls.ca, ssl_verify_identity="true")
    with pytest.raises(REFUSED, match=UNTRUSTED):
        _session(dsn)
    assert _session(_dsn(server, scheme, ssl_ca=server.tls.ca, ssl_verify_cert="1"))["tls"].startswith("TLS")


def test_charset_sets_the_sessions_character_set(server: ThrowawayTlsMySQL, scheme: str) -> None:
    session = _session(_dsn(server, scheme, ssl_mode="required", charset="latin1"))
    assert session["charset"] == "latin1"


def test_the_library_and_the_cli_run_jobs_over_a_verified_tls_dsn(
    server: ThrowawayTlsMySQL, scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = server.tls
    dsn = _dsn(server, scheme, ssl_mode="verify_identity", ssl_ca=tls.ca)
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


def test_mysqlclient_gets_the_same_tls_options_as_its_own_arguments(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read here: mysqlclient's library loads it when it connects")
    assert mysqlclient_connect_kwargs("mysql+mysqlclient://u@h/db") == {
        "host": "h",
        "port": 3306,
        "user": "u",
        "password": "",
        "charset": "utf8mb4",
        "database": "db",
        "binary_prefix": True,
    }
    given = {
        "ssl_mode=REQUIRED": {"ssl_mode": "REQUIRED"},
        # A CA verifies, as the mysql client and the PyMySQL context do: required with a CA is verify_ca.
        f"ssl_ca={ca}": {"ssl_mode": "VERIFY_CA", "ssl": {"ca": str(ca)}},
        f"ssl_mode=required&ssl_ca={ca}": {"ssl_mode": "VERIFY_CA", "ssl": {"ca": str(ca)}},
        f"ssl_verify_identity=true&ssl_ca={ca}": {"ssl_mode": "VERIFY_IDENTITY", "ssl": {"ca": str(ca)}},
        f"ssl_cert={ca}&ssl_key={ca}": {"ssl_mode": "REQUIRED", "ssl": {"cert": str(ca), "key": str(ca)}},
        "ssl_disabled=1": {"ssl_mode": "DISABLED"},
        "ssl_mode=preferred": {"ssl_mode": "PREFERRED"},
    }
    for query, expected in given.items():
        kwargs = mysqlclient_connect_kwargs(f"mysql+mysqldb://u@h/db?{query}")
        assert {k: v for k, v in kwargs.items() if k.startswith("ssl")} == expected, query
    for query, message in {
        f"ssl_ca={tmp_path}/absent.pem": "cannot load ssl_ca",
        "ssl_mode=sometimes": "ssl_mode must be one of",
    }.items():
        with pytest.raises(ConfigurationError, match=message) as caught:
            mysqlclient_connect_kwargs(f"mysql+mysqlclient://u:secret@h/db?{query}")
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
