"""Pytest plugin: throwaway PostgreSQL and MariaDB/MySQL servers, for tests that restart or break one.

Each server gets its own data directory in a temporary directory, its own free port on 127.0.0.1 and
its socket in that directory, so breaking it touches nothing another test (or engineer) uses. A server
is started once per test session (per xdist worker) and torn down at the end; the function fixtures
`throwaway_pg` and `throwaway_mysql` start it again if a test left it stopped.

Binaries are found in $PROLETARIAN_TEST_PG_BINDIR (initdb, postgres) and $PROLETARIAN_TEST_MYSQLD
(mariadbd or mysqld), else in the usual Debian places and on PATH. Without them the tests skip, or fail
in CI (CI or PROLETARIAN_TEST_REQUIRE_DATABASES set). PostgreSQL refuses to run as root, so as root it
runs as the `postgres` user. Servers are started with a parent-death signal where `setpriv` can set
one, so a killed test run does not leave them behind.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Final

import pytest
from fix_db import databases_required, selected_backends

from conformance import builtin
from conformance.harness import SqlHarness

START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 30.0
_FIXTURE_BACKENDS: Final = {
    "throwaway_pg": "postgresql",
    "throwaway_mysql": "mysql",
    "throwaway_mysql_tls": "mysql",
}
# The temporary directory of the TLS server; a run sweeps the ones an earlier, killed run left.
TLS_PREFIX: Final = "proletarian-tls-mysql-"
LEFTOVER_AGE_S: Final = 600.0
# The TLS server's users: `tls` must use TLS, `certified` must also show a client certificate.
TLS_PASSWORD: Final = "tls-pa55"


class ServerError(RuntimeError):
    """A throwaway server did not install, start or stop; the message ends with its log."""


# Ports handed out by this process: a server's ports are picked before it starts listening (a Galera
# node's IST port only when it joins), so a port free now may already be promised.
_PROMISED: Final[set[int]] = set()
_PROMISED_LOCK: Final = threading.Lock()
# The lowest port free_port hands out; below it lie the well-known services (PostgreSQL 5432 and others).
PORT_FLOOR: Final = 10000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux; IANA's range elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def port_window() -> range:
    """The ports this process may hand out: outside the ephemeral range, a slice of its own per xdist worker.

    A port the kernel picked with bind(0) lies in the ephemeral range, where every outgoing connection
    on the machine may take it as its local port before the server binds it: a Galera joiner was refused
    its IST port that way ('Address already in use') and the cluster never formed. Outside that range only
    an explicit bind takes a port, and each xdist worker picks from a slice no other worker picks from.
    """
    low, high = ephemeral_range()
    below, above = range(PORT_FLOOR, low), range(high + 1, 65536)
    window = below if len(below) >= len(above) else above
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    size = len(window) // max(workers, 1)
    return window[index * size : (index + 1) * size] if size else window


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, nor is promised to another server of this run."""
    window = port_window()
    with _PROMISED_LOCK:
        for _ in range(200):
            port = window[random.randrange(len(window))] if window else 0
            if port in _PROMISED:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                picked: int = sock.getsockname()[1]
            _PROMISED.add(picked)
            return picked
    raise ServerError(f"no free port in {window} after 200 tries")


def _missing(what: str) -> None:
    message = f"throwaway-server tests need {what}"
    if databases_required():
        pytest.fail(f"{message} (CI requires every database)", pytrace=False)
    pytest.skip(message)


def _run(args: list[str], *, user: str | None, what: str, timeout: float = 120.0) -> None:
    result = subprocess.run(
        args, user=user, capture_output=True, text=True, timeout=timeout, check=False, **_groups(user)
    )
    if result.returncode != 0:
        raise ServerError(
            f"{what} failed ({result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}"
        )


def _groups(user: str | None) -> dict[str, Any]:
    # Drop root's supplementary groups along with its uid.
    if user is None:
        return {}
    return {"group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


class ThrowawayServer:
    """One server process over its own data directory; start, stop (fast or crash) and restart it."""

    dialect: ClassVar[str]

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.log_path = root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    # -- to provide ------------------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        raise NotImplementedError

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _user(self) -> str | None:
        return None

    def _ping(self) -> None:
        """Raise unless the server accepts a connection now."""
        raise NotImplementedError

    def _signal(self, mode: str) -> signal.Signals:
        raise NotImplementedError

    # -- given -----------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the server and wait, at most `timeout` seconds, until it accepts connections."""
        if self.running:
            return
        command = self._command()
        setpriv = shutil.which("setpriv")
        # The signal fires when this (main) thread's process dies, so a killed run leaves no server.
        if setpriv is not None and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        self._log_file = self.log_path.open("ab")
        user = self._user()
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            user=user,
            **_groups(user),
        )
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerError(f"{self.dialect} exited with {self._process.returncode}: {self.log_tail()}")
            try:
                self._ping()
                return
            except Exception as exc:
                last = exc
                time.sleep(0.1)
        self.stop("immediate")
        raise ServerError(
            f"{self.dialect} did not accept connections in {timeout:g} s ({last}): {self.log_tail()}"
        )

    def stop(self, mode: str = "fast", timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the server: "fast" shuts it down cleanly, "immediate" crashes it (recovery on start)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(self._signal(mode))
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def harness(self, job_table: str, archived_job_table: str) -> SqlHarness:
        """A harness on this server with freshly created tables."""
        factory = builtin.postgresql if self.dialect == "postgresql" else builtin.mysql
        harness = factory(self.dsn, job_table, archived_job_table)
        harness.install()
        return harness


class ThrowawayPostgres(ThrowawayServer):
    """PostgreSQL from initdb; fsync is off (safe when only the server, not the machine, crashes)."""

    dialect: ClassVar[str] = "postgresql"

    def __init__(self, root: Path, port: int, bindir: Path) -> None:
        super().__init__(root, port)
        self.bindir = bindir
        self.data = root / "data"
        user = self._user()
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        initdb = [str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust"]
        _run(
            [*initdb, "-E", "UTF8", "--no-sync"],
            user=user,
            what="initdb",
        )

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _user(self) -> str | None:
        return "postgres" if os.geteuid() == 0 else None

    def _command(self) -> list[str]:
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
        }
        args = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        return args

    def _ping(self) -> None:
        import psycopg

        psycopg.connect(self.dsn, connect_timeout=2).close()

    def _signal(self, mode: str) -> signal.Signals:
        # SIGKILL of the postmaster would leave its backends holding the shared memory, and the next
        # start would refuse; SIGQUIT ends them all at once without a checkpoint: a crash.
        return {"fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]


class ThrowawayMySQL(ThrowawayServer):
    """MariaDB (or MySQL) from its install script; redo log written, not flushed, at each commit."""

    dialect: ClassVar[str] = "mysql"

    def __init__(self, root: Path, port: int, mysqld: str, install: list[str]) -> None:
        super().__init__(root, port)
        self.mysqld = mysqld
        self.data = root / "data"
        # A temporary directory of its own: in the shared /tmp a bootstrap beside other servers' lost its
        # temporary table (ENOENT, then error 1051 on mysql.tmp_user_sys) in a CI run.
        self.tmp = root / "tmp"
        self.tmp.mkdir(exist_ok=True)
        _run(
            [*install, f"--datadir={self.data}", f"--tmpdir={self.tmp}", *self._user_args()],
            user=None,
            what="install-db",
        )

    @property
    def dsn(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}"

    def _user_args(self) -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def _command(self) -> list[str]:
        return [
            self.mysqld,
            "--no-defaults",
            f"--datadir={self.data}",
            f"--tmpdir={self.tmp}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.root / 'mysqld.sock'}",
            f"--pid-file={self.root / 'mysqld.pid'}",
            f"--log-error={self.log_path}",
            "--innodb-buffer-pool-size=64M",
            "--innodb-flush-log-at-trx-commit=2",
            "--skip-log-bin",
            "--max-connections=200",
            *self._user_args(),
        ]

    def _ping(self) -> None:
        import pymysql

        pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2).close()

    def _signal(self, mode: str) -> signal.Signals:
        return {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}[mode]


class TlsFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed, and a stranger CA."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = directory / "ca.pem"
        self.server_cert, self.server_key = directory / "server.pem", directory / "server.key"
        self.client_cert, self.client_key = directory / "client.pem", directory / "client.key"
        self.other_ca = directory / "other-ca.pem"
        self._make_ca("ca", "proletarian-ref test CA")
        self._make_ca("other-ca", "proletarian-ref stranger CA")
        self._sign("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
        self._sign("client", "proletarian-ref client", "extendedKeyUsage=clientAuth")

    def _openssl(self, *args: str) -> None:
        openssl = shutil.which("openssl")
        if openssl is None:
            _missing("the openssl command (Debian package openssl) to make certificates")
        assert openssl is not None
        _run([openssl, *args], user=None, what="openssl")

    def _make_ca(self, name: str, common_name: str) -> None:
        self._openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(self.dir / f"{name}.key"), "-out", str(self.dir / f"{name}.pem"),
            "-days", "2", "-subj", f"/CN={common_name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip

    def _sign(self, name: str, common_name: str, extensions: str) -> None:
        request, ext = self.dir / f"{name}.csr", self.dir / f"{name}.ext"
        ext.write_text(extensions + "\nbasicConstraints=CA:FALSE\n")
        self._openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(self.dir / f"{name}.key"), "-out", str(request), "-subj", f"/CN={common_name}",
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", str(request), "-CA", str(self.ca), "-CAkey", str(self.dir / "ca.key"),
            "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(self.dir / f"{name}.pem"),
        )  # fmt: skip


class ThrowawayTlsMySQL(ThrowawayMySQL):
    """A MariaDB/MySQL that takes TCP connections over TLS only (require_secure_transport)."""

    def __init__(self, root: Path, port: int, mysqld: str, install: list[str]) -> None:
        super().__init__(root, port, mysqld, install)
        self.tls = TlsFiles(root)

    def _command(self) -> list[str]:
        return [
            *super()._command(),
            f"--ssl-ca={self.tls.ca}",
            f"--ssl-cert={self.tls.server_cert}",
            f"--ssl-key={self.tls.server_key}",
            "--require-secure-transport=ON",
        ]

    def _ping(self) -> None:
        import pymysql

        # The socket counts as secure transport, so the ping needs no certificate.
        pymysql.connect(unix_socket=str(self.root / "mysqld.sock"), user="root", connect_timeout=2).close()

    def admin(self, *statements: str) -> None:
        """Run statements as root over the server's socket."""
        import pymysql

        conn = pymysql.connect(unix_socket=str(self.root / "mysqld.sock"), user="root", autocommit=True)
        try:
            with conn.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
        finally:
            conn.close()


def sweep_leftovers(prefix: str) -> None:
    """Remove the temporary directories of `prefix` whose server is gone (a killed run left them)."""
    for leftover in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        pid_file = leftover / "mysqld.pid"
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
            continue  # Still serving: another run's.
        except (OSError, ValueError):
            # No server yet: a run starting beside this one may still be installing it.
            if not pid_file.exists() and time.time() - leftover.stat().st_mtime < LEFTOVER_AGE_S:
                continue
        shutil.rmtree(leftover, ignore_errors=True)


# -- helpers for the fault tests -----------------------------------------------------------------------


class TrackedConnections:
    """A data source that remembers every connection it opens, so a test can kill exactly those."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._lock = threading.Lock()
        self.opened: list[Any] = []

    def __call__(self) -> Any:
        conn = self._connect()
        with self._lock:
            self.opened.append(conn)
        return conn

    def open_ids(self) -> list[int]:
        """Server-side ids (PostgreSQL backend pid, MySQL connection id) of the connections still open."""
        with self._lock:
            return [server_id(conn) for conn in self.opened if _is_open(conn)]


def _is_open(conn: Any) -> bool:
    return bool(conn.open) if hasattr(conn, "open") else not conn.closed


def server_id(conn: Any) -> int:
    if hasattr(conn, "thread_id"):
        mysql_id: int = conn.thread_id()
        return mysql_id
    pg_pid: int = conn.info.backend_pid
    return pg_pid


def kill_connection(harness: SqlHarness, connection_id: int) -> None:
    """End one server connection from another, as an operator or a failover would."""
    if harness.dialect == "postgresql":
        harness.select("SELECT pg_terminate_backend(%s)", (connection_id,))
    else:
        harness.execute(f"KILL {int(connection_id)}")


def dsn_of(request: pytest.FixtureRequest, harness: SqlHarness) -> str:
    """The DSN of the shared test server behind `harness`."""
    dsn: str = request.getfixturevalue("pg_dsn" if harness.dialect == "postgresql" else "mysql_dsn")
    return dsn


def _pg_bindir() -> Path | None:
    configured = os.environ.get("PROLETARIAN_TEST_PG_BINDIR")
    if configured:
        candidates = [configured]  # a wrong setting must not quietly fall back to another server
    else:
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
        initdb = shutil.which("initdb")
        if initdb is not None:
            candidates.append(str(Path(initdb).parent))
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "postgres").is_file():
            return path
    return None


def _version_key(path: str) -> int:
    version = Path(path).parent.name
    return int(version) if version.isdigit() else 0


def _mysql_binaries() -> tuple[str, list[str]] | None:
    """The server binary and the command that creates a data directory for it."""
    mysqld = os.environ.get("PROLETARIAN_TEST_MYSQLD") or next(
        (
            found
            for name in ("mariadbd", "mysqld")
            for found in (shutil.which(name), f"/usr/sbin/{name}")
            if found and os.access(found, os.X_OK)
        ),
        None,
    )
    if mysqld is None or not os.access(mysqld, os.X_OK):
        return None
    version = subprocess.run([mysqld, "--version"], capture_output=True, text=True, check=False).stdout
    if "mariadb" not in version.lower():
        return mysqld, [mysqld, "--no-defaults", "--initialize-insecure"]
    script = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    if script is None:
        return None
    return mysqld, [script, "--no-defaults", "--auth-root-authentication-method=normal", "--skip-test-db"]


@contextlib.contextmanager
def running_server(make: Any) -> Iterator[Any]:
    """The server `make()` builds, started, and destroyed with its data at the end."""
    server = make()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def _throwaway_pg_session() -> Iterator[ThrowawayPostgres]:
    bindir = _pg_bindir()
    if bindir is None:
        _missing("PostgreSQL server binaries (initdb, postgres): set PROLETARIAN_TEST_PG_BINDIR")
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="fault_pg_"))
    with running_server(lambda: ThrowawayPostgres(root, free_port(), bindir)) as server:
        yield server


@pytest.fixture(scope="session")
def _throwaway_mysql_session() -> Iterator[ThrowawayMySQL]:
    binaries = _mysql_binaries()
    if binaries is None:
        _missing(
            "MariaDB or MySQL server binaries (mariadbd + mariadb-install-db): set PROLETARIAN_TEST_MYSQLD"
        )
    assert binaries is not None
    root = Path(tempfile.mkdtemp(prefix="fault_mysql_"))
    with running_server(lambda: ThrowawayMySQL(root, free_port(), *binaries)) as server:
        yield server


@pytest.fixture(scope="session")
def throwaway_mysql_tls() -> Iterator[ThrowawayTlsMySQL]:
    """A throwaway MariaDB/MySQL that refuses TCP connections without TLS, its certificates, users and
    database `app`."""
    binaries = _mysql_binaries()
    if binaries is None:
        _missing(
            "MariaDB or MySQL server binaries (mariadbd + mariadb-install-db): set PROLETARIAN_TEST_MYSQLD"
        )
    assert binaries is not None
    sweep_leftovers(TLS_PREFIX)
    root = Path(tempfile.mkdtemp(prefix=TLS_PREFIX))
    with running_server(lambda: ThrowawayTlsMySQL(root, free_port(), *binaries)) as server:
        server.admin(
            "CREATE DATABASE app",
            f"CREATE USER 'tls'@'%' IDENTIFIED BY '{TLS_PASSWORD}' REQUIRE SSL",
            f"CREATE USER 'certified'@'%' IDENTIFIED BY '{TLS_PASSWORD}' REQUIRE X509",
            "GRANT ALL ON *.* TO 'tls'@'%'",
            "GRANT ALL ON *.* TO 'certified'@'%'",
        )
        yield server


@pytest.fixture
def throwaway_pg(_throwaway_pg_session: ThrowawayPostgres) -> ThrowawayPostgres:
    """This session's throwaway PostgreSQL, running."""
    _throwaway_pg_session.start()
    return _throwaway_pg_session


@pytest.fixture
def throwaway_mysql(_throwaway_mysql_session: ThrowawayMySQL) -> ThrowawayMySQL:
    """This session's throwaway MariaDB/MySQL, running."""
    _throwaway_mysql_session.start()
    return _throwaway_mysql_session


@pytest.fixture(params=["postgresql", "mysql"])
def throwaway(request: pytest.FixtureRequest) -> ThrowawayServer:
    """Each throwaway server in turn (deselected with its backend by --backends)."""
    server: ThrowawayServer = request.getfixturevalue(
        "throwaway_pg" if request.param == "postgresql" else "throwaway_mysql"
    )
    return server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out throwaway-server tests of a backend that --backends did not choose."""
    chosen = set(selected_backends(config))
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        backends = {backend for name, backend in _FIXTURE_BACKENDS.items() if name in fixtures}
        callspec = getattr(item, "callspec", None)
        if "throwaway" in fixtures and callspec is not None:
            backends.add(callspec.params.get("throwaway", ""))
        (dropped if backends - chosen else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
