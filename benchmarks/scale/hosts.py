"""Many worker hosts on one machine: Linux network namespaces, each with its own address, as hosts.

Each host is a namespace joined to the machine by a veth pair: 10.X.i.2 inside, 10.X.i.1 outside,
where the database listens. Worker processes run inside with `ip netns exec`, so the database sees
each host's connections come from its own address. Where namespaces cannot be made (not root, no
`ip`, a container without CAP_NET_ADMIN), `Hosts.make` says why and the run falls back to plain
processes on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.scale.scenario import Outcome, Run, enqueuer
from conformance.harness import SqlHarness
from proletarian_ref import create_serializer

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Host:
    """Where a host's processes run (`prefix` before the command) and the database address it uses."""

    name: str
    prefix: tuple[str, ...]
    server_address: str
    client_address: str


@dataclass
class Hosts:
    hosts: list[Host]
    namespaces: bool
    why_not: str = ""

    @property
    def server_addresses(self) -> list[str]:
        return sorted({host.server_address for host in self.hosts})


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def make_hosts(count: int) -> Iterator[Hosts]:
    """`count` namespaces with addresses, removed at the end; or plain processes, saying why."""
    why_not = _namespaces_unavailable()
    if why_not:
        yield Hosts([Host(f"proc{i}", (), "127.0.0.1", "127.0.0.1") for i in range(count)], False, why_not)
        return
    tag = os.getpid() % 10000
    subnet = 100 + os.getpid() % 150  # apart from other runs on the machine
    made: list[str] = []
    hosts: list[Host] = []
    try:
        for i in range(count):
            name, outside, inside = f"pscale{tag}_{i}", f"ps{tag}o{i}", f"ps{tag}i{i}"
            _ip("netns", "add", name)
            made.append(name)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", name)
            _ip("addr", "add", f"10.{subnet}.{i}.1/24", "dev", outside)
            _ip("link", "set", outside, "up")
            _ip("-n", name, "addr", "add", f"10.{subnet}.{i}.2/24", "dev", inside)
            _ip("-n", name, "link", "set", inside, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            hosts.append(
                Host(name, ("ip", "netns", "exec", name), f"10.{subnet}.{i}.1", f"10.{subnet}.{i}.2")
            )
        yield Hosts(hosts, True)
    finally:
        for name in made:  # deleting the namespace deletes its end of the veth pair, and so the pair
            with suppress(subprocess.SubprocessError):
                _ip("netns", "delete", name)


def _namespaces_unavailable() -> str:
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "not root: making network namespaces needs CAP_NET_ADMIN"
    probe = f"pscale_probe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` failed: {exc.stderr.strip()}"
    _ip("netns", "delete", probe)
    return ""


@dataclass
class HostsOutcome:
    """The tally of a many-host run, on top of the usual one."""

    outcome: Outcome
    hosts: Hosts
    runs_per_host: dict[str, int] = field(default_factory=dict)
    peak_connections_per_host: dict[str, int] = field(default_factory=dict)
    process_problems: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        seconds = self.outcome.seconds or 1.0
        return {
            "hosts": len(self.hosts.hosts),
            "network_namespaces": self.hosts.namespaces,
            "why_no_namespaces": self.hosts.why_not or None,
            "jobs_per_s_per_host": {h: round(n / seconds, 1) for h, n in self.runs_per_host.items()},
            "peak_connections_per_host": self.peak_connections_per_host,
            **self.outcome.figures(),
            "problems": [*self.outcome.problems, *self.process_problems],
        }


def _connections_by_address(server_dsn: str) -> Counter[str]:
    import psycopg

    with psycopg.connect(server_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT host(client_addr), count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND client_addr IS NOT NULL GROUP BY 1"
        ).fetchall()
    return Counter({str(address): int(count) for address, count in rows})


def _watch(
    harness: SqlHarness,
    hosts: Hosts,
    server_dsn: str,
    enqueuers: list[threading.Thread],
    outcome: Outcome,
    start: float,
    deadline: float,
) -> Counter[str]:
    """Until the queue is drained (outcome.drained and .seconds) and every host's connections were seen, or
    the deadline: the most connections seen from each client address."""
    peak: Counter[str] = Counter()
    addresses = {host.client_address for host in hosts.hosts}
    while time.monotonic() < deadline:
        peak |= _connections_by_address(server_dsn)
        if not outcome.drained:
            left = int(harness.select(f"SELECT count(*) FROM {harness.job_table}")[0][0])
            if left == 0 and not any(t.is_alive() for t in enqueuers):
                outcome.drained = True
                outcome.seconds = time.monotonic() - start
        # Sampled on until every host's connections were seen: under load a host's workers may start last
        # and be between two samples for all the jobs they take, yet they go on polling.
        if outcome.drained and addresses <= set(peak):
            break
        time.sleep(0.2)
    if not outcome.drained:
        outcome.seconds = time.monotonic() - start
    return peak


def run_hosts(
    harness: SqlHarness,
    hosts: Hosts,
    *,
    dsn_for: Callable[[Host], str],
    server_dsn: str,
    jobs: int,
    processes: int,
    threads: int,
    enqueue_connects: Sequence[Callable[[], Any]],
    work_dir: Path,
    timeout_s: float = 120.0,
) -> HostsOutcome:
    """`processes` worker processes of `threads` threads on each host, enqueuers here; all checked."""
    outcome = Outcome(jobs)
    stop_file = work_dir / "stop"
    stop_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    started: list[tuple[Host, subprocess.Popen[str]]] = []
    start = time.monotonic()
    deadline = start + timeout_s
    for host in hosts.hosts:
        for _ in range(processes):
            command = [
                *host.prefix, sys.executable, "-m", "benchmarks.scale.host_worker", dsn_for(host),
                harness.job_table, harness.archived_job_table, str(threads), str(stop_file),
            ]  # fmt: skip
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            started.append((host, process))
    lock = threading.Lock()
    shares = [range(i, jobs, len(enqueue_connects)) for i in range(len(enqueue_connects))]
    enqueuers = [
        threading.Thread(target=enqueuer, args=(c, s, 50, harness.job_table, outcome, lock, deadline))
        for c, s in zip(enqueue_connects, shares, strict=True)
    ]
    try:
        for thread in enqueuers:
            thread.start()
        peak = _watch(harness, hosts, server_dsn, enqueuers, outcome, start, deadline)
    finally:
        stop_file.touch()
        for thread in enqueuers:
            thread.join(10)
    runs_per_host: Counter[str] = Counter()
    problems: list[str] = []
    by_address = {host.client_address: host.name for host in hosts.hosts}
    for host, process in started:
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        if process.returncode != 0 or not out.strip():
            problems.append(f"{host.name}: worker exited {process.returncode}: {err[-500:]}")
            continue
        report = json.loads(out.strip().splitlines()[-1])
        runs_per_host[host.name] += len(report["runs"])
        outcome.runs.extend(Run(n, hosts.hosts.index(host)) for n in report["runs"])
        problems.extend(f"{host.name}: {p}" for p in report["problems"])
        if not report["running"]:
            outcome.workers_running = False
    serializer = create_serializer()
    rows = harness.select(f"SELECT payload, status FROM {harness.archived_job_table}")
    outcome.archived = Counter(int(serializer.decode(payload)) for payload, _ in rows)
    outcome.statuses = {status for _, status in rows}
    return HostsOutcome(
        outcome,
        hosts,
        dict(sorted(runs_per_host.items())),
        {by_address.get(address, address): count for address, count in sorted(peak.items())},
        problems,
    )
