"""Pytest plugin: a Patroni cluster (etcd, a primary and a synchronous standby, HAProxy) on loopback ports.

Everything runs from Debian's packages (`patroni`, `etcd-server`, `haproxy`) in one temporary directory
named `scale_patroni_*`, on free ports of 127.0.0.1. Patroni and PostgreSQL refuse root, so as root they
run as `postgres`, like fix_throwaway's servers. Patroni's agents, etcd and HAProxy get a parent-death
signal (setpriv), but the PostgreSQL servers an agent starts do not: a killed test run would leave them
behind. So the directory holds its owner's process id, and every new cluster first sweeps the
directories whose owner is gone, killing the processes that run from them.

One HAProxy does two jobs. Its `postgres` section is how users reach the leader: a TCP proxy whose
health check asks each agent's REST API for `/primary`. Its `etcd_nodeN` sections are each agent's only
way to etcd (Patroni's `use_proxies`, so it never learns etcd's own address), which lets a test cut one
agent off etcd, as a network partition would, through HAProxy's runtime API.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Final

import pytest
from fix_cluster import MissingTool, _hand_over, _require, _server_user
from fix_throwaway import ServerError, ThrowawayServer, _pg_bindir, _run, free_port

PREFIX: Final = "scale_patroni_"
SCOPE: Final = "proletarian"
# Small, so a failover fits a CI test; Patroni wants loop_wait + 2 * retry_timeout <= ttl.
TTL_S: Final = 10
LOOP_WAIT_S: Final = 1
RETRY_TIMEOUT_S: Final = 4
# Patroni's watchdog resets a node whose agent has not kicked it for ttl - safety_margin (5 s by default).
WATCHDOG_S: Final = TTL_S - 5
# HAProxy's health check: every CHECK_INTER_MS, a server is down after CHECK_FALL failures.
CHECK_INTER_MS: Final = 1000
CHECK_FALL: Final = 2
SETTINGS: Final = {
    "ttl": TTL_S,
    "loop_wait": LOOP_WAIT_S,
    "retry_timeout": RETRY_TIMEOUT_S,
    "synchronous_mode": True,
    "use_pg_rewind": True,
    "haproxy_check": f"GET /primary every {CHECK_INTER_MS} ms, down after {CHECK_FALL}",
}
HEALTHY_TIMEOUT_S: Final = 90.0


def _http_json(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    """GET `url`: (status, decoded JSON body or None). Patroni answers 503 with a body too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


class Etcd(ThrowawayServer):
    """A one-member etcd cluster."""

    dialect: ClassVar[str] = "etcd"

    def __init__(self, root: Path, port: int, binary: str) -> None:
        super().__init__(root, port)
        self.binary = binary
        self.peer_port = free_port()

    @property
    def dsn(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary,
            "--name=scale",
            f"--data-dir={self.root / 'data'}",
            f"--listen-client-urls={self.dsn}",
            f"--advertise-client-urls={self.dsn}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=scale={peer}",
            "--initial-cluster-state=new",
            "--log-level=warn",
        ]

    def _ping(self) -> None:
        status, body = _http_json(f"{self.dsn}/health")
        if status != 200 or not body or body.get("health") != "true":
            raise RuntimeError(f"etcd health: {status} {body}")

    def _signal(self, mode: str) -> signal.Signals:
        return {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}[mode]


class HAProxy(ThrowawayServer):
    """HAProxy in the foreground (-db) with an admin socket for its runtime API."""

    dialect: ClassVar[str] = "haproxy"

    def __init__(self, root: Path, port: int, binary: str, etcd: Etcd, nodes: list[PatroniNode]) -> None:
        super().__init__(root, port)
        self.binary = binary
        self.socket = root / "admin.sock"
        self.config = root / "haproxy.cfg"
        servers = "".join(
            f"    server {node.name} 127.0.0.1:{node.port} check port {node.rest_port}\n" for node in nodes
        )
        etcd_sections = "".join(
            f"listen etcd_{node.name}\n    bind 127.0.0.1:{node.etcd_port}\n"
            f"    server etcd 127.0.0.1:{etcd.port}\n"
            for node in nodes
        )
        self.config.write_text(
            "global\n"
            f"    stats socket {self.socket} mode 600 level admin\n"
            "    maxconn 400\n"
            "defaults\n"
            "    mode tcp\n"
            "    timeout connect 2s\n"
            # A PostgreSQL connection idles between polls: no client or server timeout should end it.
            "    timeout client 30m\n"
            "    timeout server 30m\n"
            "listen postgres\n"
            f"    bind 127.0.0.1:{port}\n"
            "    option httpchk GET /primary\n"
            "    http-check expect status 200\n"
            f"    default-server inter {CHECK_INTER_MS} fall {CHECK_FALL} rise 1"
            " on-marked-down shutdown-sessions\n"
            f"{servers}"
            f"{etcd_sections}",
            encoding="utf-8",
        )

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?connect_timeout=2"

    def _command(self) -> list[str]:
        return [self.binary, "-db", "-f", str(self.config)]

    def _ping(self) -> None:
        self.command("show info")

    def _signal(self, mode: str) -> signal.Signals:
        return {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}[mode]

    def command(self, line: str) -> str:
        """One runtime API command; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def up_servers(self) -> set[str]:
        """The `postgres` section's servers that pass the health check now."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {
            row["svname"]
            for row in rows
            if row.get("pxname") == "postgres" and row.get("svname") not in ("FRONTEND", "BACKEND")
            if row.get("status") == "UP"
        }


class PatroniNode(ThrowawayServer):
    """One Patroni agent and the PostgreSQL it runs; `port` is PostgreSQL's, `rest_port` the agent's."""

    dialect: ClassVar[str] = "patroni"

    def __init__(self, root: Path, name: str, binary: str, bindir: Path) -> None:
        super().__init__(root, free_port())
        self.name = name
        self.binary = binary
        self.bindir = bindir
        self.rest_port = free_port()
        self.etcd_port = free_port()
        self.data = root / "data"
        self.config = root / "patroni.yml"

    def write_config(self) -> None:
        """Patroni's configuration, as JSON (which YAML reads)."""
        trust = [
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        ]
        config = {
            "scope": SCOPE,
            "name": self.name,
            "restapi": {
                "listen": f"127.0.0.1:{self.rest_port}",
                "connect_address": f"127.0.0.1:{self.rest_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"], "use_proxies": True},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_S,
                    "loop_wait": LOOP_WAIT_S,
                    "retry_timeout": RETRY_TIMEOUT_S,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "shared_buffers": "32MB",
                            # Safe while only the server, never the machine, crashes; pg_rewind needs
                            # full_page_writes, which stays on.
                            "fsync": "off",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.data),
                "bin_dir": str(self.bindir),
                "pgpass": str(self.root / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.root)},
                "pg_hba": trust,
            },
            "watchdog": {"mode": "off"},
        }
        self.config.write_text(json.dumps(config, indent=1), encoding="utf-8")

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?connect_timeout=2"

    def _user(self) -> str | None:
        return _server_user("postgres")

    def _command(self) -> list[str]:
        return [self.binary, str(self.config)]

    def _ping(self) -> None:
        status, _ = _http_json(f"http://127.0.0.1:{self.rest_port}/liveness")
        if status != 200:
            raise RuntimeError(f"Patroni's REST API answered {status}")

    def _signal(self, mode: str) -> signal.Signals:
        # SIGTERM: the agent stops its PostgreSQL, then itself. SIGKILL: the agent alone dies.
        return {"fast": signal.SIGTERM, "immediate": signal.SIGKILL}[mode]

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")


class PatroniCluster:
    """etcd, two Patroni nodes (a leader and its synchronous standby) and HAProxy in front of them."""

    def __init__(self, root: Path, binaries: dict[str, str], bindir: Path) -> None:
        self.root = root
        self.patronictl = binaries["patronictl"]
        self.settings = SETTINGS
        self.watchdog_s = WATCHDOG_S
        user = _server_user("postgres")
        self.nodes: list[PatroniNode] = []
        for i in range(2):
            (root / f"node{i}").mkdir()
            _hand_over(user, root / f"node{i}")
            self.nodes.append(PatroniNode(root / f"node{i}", f"node{i}", binaries["patroni"], bindir))
        for directory in ("etcd", "haproxy"):
            (root / directory).mkdir()
        self.etcd = Etcd(root / "etcd", free_port(), binaries["etcd"])
        self.haproxy = HAProxy(root / "haproxy", free_port(), binaries["haproxy"], self.etcd, self.nodes)
        for node in self.nodes:
            node.write_config()

    @property
    def dsn(self) -> str:
        """What a user of libpq writes: every node, and keep the one that takes writes."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write&connect_timeout=2"

    @property
    def haproxy_dsn(self) -> str:
        return self.haproxy.dsn

    def node(self, name: str) -> PatroniNode:
        (found,) = [node for node in self.nodes if node.name == name]
        return found

    def start(self) -> None:
        self.etcd.start()
        self.haproxy.start()
        # The first node bootstraps the cluster (initdb); the second then copies it (pg_basebackup).
        self.nodes[0].start()
        self._wait(lambda: self.leader() is not None, "node0 to bootstrap and lead")
        self.nodes[1].start()
        self.wait_healthy()

    def destroy(self) -> None:
        # Nothing is kept, so no clean shutdown: the agents are killed, and the sweep their servers.
        for node in self.nodes:
            node.stop("immediate")
        self.haproxy.stop("immediate")
        self.etcd.stop("immediate")
        sweep(self.root)

    # -- state --------------------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (GET /cluster) from the first agent that answers."""
        for node in self.nodes:
            if not node.running:
                continue
            with contextlib.suppress(OSError, ValueError):
                status, body = _http_json(f"http://127.0.0.1:{node.rest_port}/cluster")
                if status == 200 and body is not None:
                    members: list[dict[str, Any]] = body.get("members", [])
                    return members
        return []

    def leader(self) -> str | None:
        """The member that holds the leader key and runs, or None."""
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return str(member["name"])
        return None

    def other(self, name: str) -> str:
        (found,) = [node.name for node in self.nodes if node.name != name]
        return found

    def healthy(self) -> bool:
        """A running leader with a streaming synchronous standby, and HAProxy routing to the leader alone."""
        members = self.members()
        roles = {m.get("role"): m for m in members if m.get("state") in ("running", "streaming")}
        if "leader" not in roles or "sync_standby" not in roles:
            return False
        if self.haproxy.up_servers() != {roles["leader"]["name"]}:
            return False
        import psycopg

        with psycopg.connect(self.node(roles["leader"]["name"]).dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
            ).fetchone()
        return row is not None and row[0] == 1

    def wait_healthy(self, timeout: float = HEALTHY_TIMEOUT_S) -> float:
        """Seconds until healthy(); raises with the agents' logs after `timeout`."""
        return self._wait(self._healthy_now, "a leader with a streaming synchronous standby", timeout)

    def _healthy_now(self) -> bool:
        try:
            return self.healthy()
        except Exception:
            return False

    def wait_leader(self, name: str, timeout: float = HEALTHY_TIMEOUT_S) -> float:
        return self._wait(lambda: self.leader() == name, f"{name} to become the leader", timeout)

    def _wait(self, condition: Any, what: str, timeout: float = HEALTHY_TIMEOUT_S) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            with contextlib.suppress(Exception):
                if condition():
                    return time.monotonic() - start
            time.sleep(0.2)
        logs = "\n".join(f"--- {node.name}:\n{node.log_tail(25)}" for node in self.nodes)
        raise ServerError(f"waited {timeout:g} s for {what}; members {self.members()}\n{logs}")

    # -- faults -------------------------------------------------------------------------------------

    def kill_postmaster(self, name: str) -> None:
        os.kill(self.node(name).postmaster_pid(), signal.SIGKILL)

    def kill_agent(self, name: str) -> None:
        self.node(name).stop("immediate")

    def fence(self, name: str) -> None:
        """What Patroni's watchdog does to a node whose agent stopped: reset it (every process on it dies)."""
        kill_processes_in(self.node(name).root)

    def start_agent(self, name: str) -> None:
        self.node(name).start()

    def cut_off_etcd(self, name: str) -> None:
        """New connections from the agent to etcd are refused, and those open are closed."""
        self.haproxy.command(f"disable frontend etcd_{name}")
        self.haproxy.command(f"shutdown sessions server etcd_{name}/etcd")

    def reconnect_etcd(self, name: str) -> None:
        self.haproxy.command(f"enable frontend etcd_{name}")

    def switchover(self, leader: str, candidate: str) -> None:
        _run(
            [
                self.patronictl,
                "-c",
                str(self.node(leader).config),
                "switchover",
                "--leader",
                leader,
                "--candidate",
                candidate,
                "--force",
            ],
            user=_server_user("postgres"),
            what="patronictl switchover",
            timeout=60,
        )


# -- finding the tools, sweeping leftovers, the fixture ------------------------------------------------

_TOOLS: Final = {
    "patroni": "patroni",
    "patronictl": "patroni",
    "etcd": "etcd-server",
    "haproxy": "haproxy",
}


def patroni_binaries() -> dict[str, str] | None:
    found = {
        name: shutil.which(name) or next((p for p in (f"/usr/sbin/{name}",) if os.access(p, os.X_OK)), None)
        for name in _TOOLS
    }
    if any(path is None for path in found.values()):
        return None
    return {name: str(path) for name, path in found.items()}


def patroni_missing() -> str | None:
    bindir = _pg_bindir()
    if bindir is None or not (bindir / "pg_rewind").is_file():
        return "PostgreSQL server binaries with pg_rewind: set PROLETARIAN_TEST_PG_BINDIR"
    found = {name: shutil.which(name) or os.access(f"/usr/sbin/{name}", os.X_OK) for name in _TOOLS}
    if missing := sorted({package for name, package in _TOOLS.items() if not found[name]}):
        return f"{', '.join(missing)} (apt-get install {' '.join(missing)}, as ci/test.sh does)"
    return None


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(root: Path) -> bool:
    try:
        pid, started = (root / "owner").read_text().split()
    except (OSError, ValueError):
        # No owner file yet: a cluster being made right now, or one killed before it wrote one; only
        # an old one is taken for a leftover.
        return time.time() - root.stat().st_mtime < 60
    return start_time(int(pid)) == started


def sweep(root: Path) -> None:
    """Kill every process that runs from `root` (by its command line or working directory), then remove it."""
    kill_processes_in(root)
    _remove_shared_memory(root)
    shutil.rmtree(root, ignore_errors=True)


def kill_processes_in(root: Path) -> None:
    """SIGKILL every process whose command line names a path in `root` or whose working directory is in it."""
    marker = f"{root}/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if marker in cmdline or f"{cwd}/".startswith(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _remove_shared_memory(root: Path) -> None:
    """The System V segment a killed postmaster leaves (its id is on line 7 of postmaster.pid)."""
    ipcrm = shutil.which("ipcrm")
    for pidfile in root.glob("node*/data/postmaster.pid"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            lines = pidfile.read_text().splitlines()
            shmid = int(lines[6].split()[1])
            if ipcrm is not None:
                subprocess.run([ipcrm, "-m", str(shmid)], capture_output=True, check=False)


def sweep_leftovers() -> list[Path]:
    """Sweep the clusters of runs that died without tearing theirs down; the directories swept."""
    swept = []
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if root.is_dir() and not _owner_alive(root):
            sweep(root)
            swept.append(root)
    return swept


@contextlib.contextmanager
def started_patroni() -> Iterator[PatroniCluster]:
    """A running Patroni cluster, healthy; everything it started is stopped and removed at the end."""
    bindir = _pg_bindir()
    binaries = patroni_binaries()
    if patroni_missing() is not None or bindir is None or binaries is None:
        raise MissingTool(str(patroni_missing()))
    sweep_leftovers()
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    (root / "owner").write_text(f"{os.getpid()} {start_time(os.getpid())}")
    _hand_over(_server_user("postgres"), root)
    try:
        cluster = PatroniCluster(root, binaries, bindir)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.destroy()
    finally:
        sweep(root)


@pytest.fixture(scope="session")
def patroni_cluster() -> Iterator[PatroniCluster]:
    """This session's Patroni cluster; each test that uses it first waits until it is healthy again."""
    _require(patroni_missing())
    with started_patroni() as cluster:
        yield cluster
