"""Pytest plugin: engines around the throwaway servers (PgBouncer, a Galera cluster, a PostgreSQL standby).

Like fix_throwaway, every process gets its own directory in a temporary directory and free ports on
127.0.0.1, and is stopped when the fixture ends. A tool the machine lacks makes the tests skip with the
reason, or fail in CI (PROLETARIAN_TEST_REQUIRE_DATABASES or CI set), never pass silently.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from fix_db import selected_backends
from fix_throwaway import (
    START_TIMEOUT_S,
    ServerError,
    ThrowawayMySQL,
    ThrowawayPostgres,
    ThrowawayServer,
    _missing,
    _mysql_binaries,
    _pg_bindir,
    _run,
    free_port,
    running_server,
)

PGBOUNCER_POOL_SIZE = 4
GALERA_PROVIDER = "/usr/lib/galera/libgalera_smm.so"
GALERA_NODES = 3


class MissingTool(RuntimeError):
    """The machine lacks what an engine needs; the message names it and how to get it."""


def _require(missing: str | None) -> None:
    if missing is not None:
        _missing(missing)


def _server_user(name: str) -> str | None:
    """The user a server runs as: `name` when the tests run as root (servers refuse root), else ours."""
    return name if os.geteuid() == 0 else None


def _hand_over(user: str | None, *paths: Path) -> None:
    """Give `paths` to the server's user, who must reach and write them."""
    if user is None:
        return
    entry = pwd.getpwnam(user)
    for path in paths:
        os.chown(path, entry.pw_uid, entry.pw_gid)


class PgBouncer(ThrowawayServer):
    """PgBouncer in transaction mode in front of one PostgreSQL, with trust authentication.

    PgBouncer refuses to run as root, so as root it runs as `postgres`, like the server.
    """

    dialect: ClassVar[str] = "postgresql"

    def __init__(self, root: Path, port: int, server: ThrowawayPostgres, binary: str) -> None:
        super().__init__(root, port)
        self.binary = binary
        self.server = server
        self.ini = root / "pgbouncer.ini"
        _hand_over(self._user(), root)
        (root / "userlist.txt").write_text('"postgres" ""\n', encoding="utf-8")
        self.ini.write_text(
            "[databases]\n"
            f"postgres = host=127.0.0.1 port={server.port} dbname=postgres\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {root / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {PGBOUNCER_POOL_SIZE}\n"
            "max_client_conn = 100\n"
            f"pidfile = {root / 'pgbouncer.pid'}\n",
            encoding="utf-8",
        )

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _user(self) -> str | None:
        return _server_user("postgres")

    def _command(self) -> list[str]:
        return [self.binary, str(self.ini)]

    def _ping(self) -> None:
        import psycopg

        psycopg.connect(self.dsn, connect_timeout=2).close()

    def _signal(self, mode: str) -> signal.Signals:
        # SIGINT waits for the clients' transactions to end; SIGTERM drops them at once.
        return {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}[mode]


def pgbouncer_binary() -> str | None:
    return (
        os.environ.get("PROLETARIAN_TEST_PGBOUNCER")
        or shutil.which("pgbouncer")
        or ("/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None)
    )


def pgbouncer_missing() -> str | None:
    if pgbouncer_binary() is None:
        return "pgbouncer (apt-get install pgbouncer, as ci/test.sh does), or set PROLETARIAN_TEST_PGBOUNCER"
    return None


@contextmanager
def started_pgbouncer(server: ThrowawayPostgres) -> Iterator[PgBouncer]:
    """A running PgBouncer in front of `server`, removed at the end."""
    binary = pgbouncer_binary()
    if binary is None:
        raise MissingTool(str(pgbouncer_missing()))
    root = Path(tempfile.mkdtemp(prefix="scale_pgbouncer_"))
    with running_server(lambda: PgBouncer(root, free_port(), server, binary)) as bouncer:
        yield bouncer


@pytest.fixture(scope="session")
def _pgbouncer_session(_throwaway_pg_session: ThrowawayPostgres) -> Iterator[PgBouncer]:
    _require(pgbouncer_missing())
    with started_pgbouncer(_throwaway_pg_session) as bouncer:
        yield bouncer


@pytest.fixture
def pgbouncer(throwaway_pg: ThrowawayPostgres, _pgbouncer_session: PgBouncer) -> PgBouncer:
    """PgBouncer (transaction mode) in front of this session's throwaway PostgreSQL, both running."""
    _pgbouncer_session.start()
    return _pgbouncer_session


# -- MariaDB Galera ------------------------------------------------------------------------------------


class GaleraNode(ThrowawayMySQL):
    """One node of a Galera cluster on 127.0.0.1: SQL, group communication, IST and SST ports of its own.

    As root it runs as `mysql`: the rsync SST daemon, started as root, would read and write the data
    directory as `nobody` and be refused.
    """

    def __init__(
        self, root: Path, ports: tuple[int, int, int, int], mysqld: str, install: list[str], peers: str
    ) -> None:
        self.gcomm_port, self.ist_port, self.sst_port = ports[1:]
        self.peers = peers
        self.bootstrap = False
        (root / "server.log").touch()
        (root / "tmp").mkdir()
        _hand_over(_server_user("mysql"), root, root / "server.log", root / "tmp")
        super().__init__(root, ports[0], mysqld, install)

    def _user_args(self) -> list[str]:
        user = _server_user("mysql")
        return [] if user is None else [f"--user={user}"]

    def _command(self) -> list[str]:
        # gcache.recover: a node restarted after a crash asks for the missing writes (IST), not a whole copy.
        provider = (
            f"base_port={self.gcomm_port};ist.recv_addr=127.0.0.1:{self.ist_port};"
            "gcache.size=32M;gcache.recover=yes"
        )
        command = [
            *super()._command(),
            "--wsrep-on=ON",
            f"--wsrep-provider={galera_provider()}",
            "--wsrep-cluster-name=proletarian-scale",
            f"--wsrep-cluster-address=gcomm://{self.peers}",
            f"--wsrep-node-address=127.0.0.1:{self.gcomm_port}",
            f"--wsrep-provider-options={provider}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}",
            "--binlog-format=ROW",
            "--innodb-autoinc-lock-mode=2",
            # --no-defaults leaves MariaDB's compiled-in latin1, which cannot hold every payload.
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
        ]
        if self.bootstrap:
            command.append("--wsrep-new-cluster")
        return command

    def _ping(self) -> None:
        """Accepting connections is not enough: the node must be synced with the primary component."""
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2)
        try:
            with conn.cursor() as cursor:
                cursor.execute("SHOW STATUS LIKE 'wsrep_local_state_comment'")
                row = cursor.fetchone()
        finally:
            conn.close()
        if row is None or row[1] != "Synced":
            raise RuntimeError(f"node on port {self.port} is {row[1] if row else 'not in a cluster'}")


class GaleraCluster:
    """Three Galera nodes: the first bootstraps the cluster, the others join it by rsync SST."""

    def __init__(self, root: Path, mysqld: str, install: list[str], size: int = GALERA_NODES) -> None:
        self.root = root
        _hand_over(_server_user("mysql"), root)
        ports = [(free_port(), free_port(), free_port(), free_port()) for _ in range(size)]
        peers = ",".join(f"127.0.0.1:{p[1]}" for p in ports)
        self.nodes: list[GaleraNode] = []
        for i in range(size):
            (root / f"node{i}").mkdir(parents=True)
            self.nodes.append(GaleraNode(root / f"node{i}", ports[i], mysqld, install, peers))

    def start(self) -> None:
        """Start the nodes that are down; the first bootstraps only if no node is running."""
        alive = any(node.running for node in self.nodes)
        for node in self.nodes:
            if node.running:
                continue
            node.bootstrap = not alive
            node.start(timeout=START_TIMEOUT_S * 2)
            node.bootstrap = False
            alive = True

    def destroy(self) -> None:
        for node in self.nodes:
            node.destroy()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def dsns(self) -> list[str]:
        return [node.dsn for node in self.nodes]


def galera_provider() -> str:
    return os.environ.get("PROLETARIAN_TEST_GALERA_PROVIDER", GALERA_PROVIDER)


def galera_missing() -> str | None:
    binaries = _mysql_binaries()
    if binaries is None or binaries[1][0] == binaries[0]:  # MySQL's own server has no Galera
        return "MariaDB server binaries (mariadbd + mariadb-install-db) for Galera"
    if not os.path.exists(galera_provider()):
        return f"the Galera provider {galera_provider()} (apt-get install galera-4)"
    if shutil.which("rsync") is None or shutil.which("wsrep_sst_rsync") is None:
        return "rsync and wsrep_sst_rsync for Galera's state transfer (apt-get install rsync)"
    return None


@contextmanager
def started_galera(size: int = GALERA_NODES) -> Iterator[GaleraCluster]:
    """A running Galera cluster of `size` nodes, removed at the end."""
    reason = galera_missing()
    binaries = _mysql_binaries()
    if reason is not None or binaries is None:
        raise MissingTool(str(reason))
    root = Path(tempfile.mkdtemp(prefix="scale_galera_"))
    with running_server(lambda: GaleraCluster(root, *binaries, size=size)) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def _galera_session() -> Iterator[GaleraCluster]:
    _require(galera_missing())
    with started_galera() as cluster:
        yield cluster


@pytest.fixture
def galera(_galera_session: GaleraCluster) -> GaleraCluster:
    """This session's three-node Galera cluster, every node running and synced."""
    _galera_session.start()
    return _galera_session


# -- PostgreSQL primary and streaming standby ----------------------------------------------------------


class PostgresPrimary(ThrowawayPostgres):
    """A throwaway PostgreSQL whose commits wait for a synchronous standby (any one: '*')."""

    def _command(self) -> list[str]:
        settings = {
            "wal_level": "replica",
            "max_wal_senders": "4",
            "synchronous_standby_names": "*",
            "synchronous_commit": "on",
        }
        return [*super()._command(), *(arg for k, v in settings.items() for arg in ("-c", f"{k}={v}"))]


class PostgresStandby(ThrowawayPostgres):
    """A streaming standby made by pg_basebackup -R from `primary`; promote() makes it the primary.

    It has no synchronous standby of its own: after a failover the new primary commits alone until
    another standby is built, as it would in production.
    """

    def __init__(self, root: Path, port: int, bindir: Path, primary: ThrowawayPostgres) -> None:
        ThrowawayServer.__init__(self, root, port)
        self.bindir = bindir
        self.data = root / "data"
        user = self._user()
        _hand_over(user, root)
        basebackup = [str(bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port)]
        _run(
            [*basebackup, "-U", "postgres", "-D", str(self.data), "-R", "-X", "stream", "--no-sync"],
            user=user,
            what="pg_basebackup",
        )

    def _ping(self) -> None:
        import psycopg

        # A standby accepts read-only connections once it has reached a consistent state.
        psycopg.connect(self.dsn, connect_timeout=2).close()

    def promote(self) -> None:
        _run(
            [str(self.bindir / "pg_ctl"), "promote", "-w", "-D", str(self.data)],
            user=self._user(),
            what="promote",
        )


@dataclass
class PostgresPair:
    primary: PostgresPrimary
    standby: PostgresStandby

    @property
    def dsn(self) -> str:
        """Both servers; libpq connects to the first that takes writes (target_session_attrs)."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write&connect_timeout=2"

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Until the standby is connected and synchronous, so the first commit does not wait for it."""
        import psycopg

        deadline = time.monotonic() + timeout
        with psycopg.connect(self.primary.dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
                if row is not None and row[0] in ("sync", "quorum"):
                    return
                time.sleep(0.1)
        raise ServerError(
            f"the standby did not become synchronous in {timeout:g} s: {self.standby.log_tail()}"
        )

    def destroy(self) -> None:
        self.standby.destroy()
        self.primary.destroy()


def pg_pair_missing() -> str | None:
    bindir = _pg_bindir()
    if bindir is None or not (bindir / "pg_basebackup").is_file():
        return "PostgreSQL server binaries with pg_basebackup: set PROLETARIAN_TEST_PG_BINDIR"
    return None


@contextmanager
def started_pg_pair() -> Iterator[PostgresPair]:
    """A new PostgreSQL primary with a synchronous streaming standby, both running; removed at the end."""
    bindir = _pg_bindir()
    if bindir is None or pg_pair_missing() is not None:
        raise MissingTool(str(pg_pair_missing()))
    root = Path(tempfile.mkdtemp(prefix="scale_pg_pair_"))
    _hand_over(_server_user("postgres"), root)
    for name in ("primary", "standby"):
        (root / name).mkdir()
    primary = PostgresPrimary(root / "primary", free_port(), bindir)
    pair: PostgresPair | None = None
    try:
        primary.start()
        pair = PostgresPair(primary, PostgresStandby(root / "standby", free_port(), bindir, primary))
        pair.standby.start()
        pair.wait_streaming()
        yield pair
    finally:
        if pair is not None:
            pair.standby.destroy()
        primary.destroy()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_pair() -> Iterator[PostgresPair]:
    """A new primary and synchronous standby for this test alone (a failover leaves them apart)."""
    _require(pg_pair_missing())
    with started_pg_pair() as pair:
        yield pair


# -- PostgreSQL reachable from other network namespaces ------------------------------------------------


class NetworkPostgres(ThrowawayPostgres):
    """A throwaway PostgreSQL that also listens on `addresses` and trusts clients from 10.0.0.0/8."""

    def __init__(self, root: Path, port: int, bindir: Path, addresses: list[str]) -> None:
        super().__init__(root, port, bindir)
        self.addresses = addresses
        with (self.data / "pg_hba.conf").open("a", encoding="utf-8") as hba:
            hba.write("host all all 10.0.0.0/8 trust\n")

    def _command(self) -> list[str]:
        listen = ",".join(["127.0.0.1", *self.addresses])
        return [*super()._command(), "-c", f"listen_addresses={listen}", "-c", "max_connections=120"]


@contextmanager
def started_network_pg(addresses: list[str]) -> Iterator[NetworkPostgres]:
    bindir = _pg_bindir()
    if bindir is None:
        raise MissingTool("PostgreSQL server binaries (initdb, postgres): set PROLETARIAN_TEST_PG_BINDIR")
    root = Path(tempfile.mkdtemp(prefix="scale_hosts_pg_"))
    with running_server(lambda: NetworkPostgres(root, free_port(), bindir, addresses)) as server:
        yield server


@pytest.fixture
def pg_server_binaries() -> Path:
    """The PostgreSQL binaries (for tests that start their own servers), or the missing-tool verdict."""
    bindir = _pg_bindir()
    if bindir is None:
        _missing("PostgreSQL server binaries (initdb, postgres): set PROLETARIAN_TEST_PG_BINDIR")
    assert bindir is not None
    return bindir


_FIXTURE_BACKENDS = {"galera": "mysql", "pg_pair": "postgresql", "pg_server_binaries": "postgresql"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the cluster tests of a backend that --backends did not choose."""
    chosen = set(selected_backends(config))
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        backends = {backend for name, backend in _FIXTURE_BACKENDS.items() if name in fixtures}
        (dropped if backends - chosen else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
