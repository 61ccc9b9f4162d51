"""Faults under a Patroni cluster with load running: `python -m benchmarks.scale patroni` and its tests.

A round is one fault. Two loads run at once on the cluster, each on tables of its own: one reaches the
leader through a libpq multi-host DSN (`target_session_attrs=read-write`), the other through HAProxy's
health-checked proxy. Once 30% of each load's jobs have been handled the fault strikes; the round then
does what the fault needs (start the killed agent again once the other node leads, give etcd back),
waits until the old primary serves as the synchronous standby again, and lets both loads drain.

`cluster` is tests/fix_patroni.py's PatroniCluster (typed loosely: the benchmarks do not import tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from benchmarks.scale.scenario import Load, Outcome

FAULTS: Final = ("postmaster-kill", "switchover", "agent-kill", "etcd-cut")
# Not among the tests' faults: the agent killed with no watchdog to reset its node. It shows what that
# costs (docs/scaling.md), which is Patroni's part, not the library's.
UNFENCED: Final = "agent-kill-unfenced"
FAULT_AFTER: Final = 0.3
WORKERS: Final = 2
THREADS: Final = 2
ENQUEUERS: Final = 2
BATCH: Final = 5
# Enqueuers pause between small batches so that their enqueues go on through the fault and what follows
# it (a new leader after ttl, the old one demoted and rejoining), about 0.7 x ENQUEUE_SPAN_S after it.
ENQUEUE_SPAN_S: Final = 24.0


@dataclass
class Round:
    """One fault: who led before and after, how long the old primary took to serve again, each path's run."""

    fault: str
    old_leader: str
    new_leader: str | None = None
    rejoined_s: float | None = None
    pg_rewind: bool = False
    steps: list[str] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        """Every broken promise, naming the fault and the path."""
        return [
            f"{self.fault}, {path}: {problem}"
            for path, outcome in self.outcomes.items()
            for problem in outcome.problems
        ]

    def figures(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "old_leader": self.old_leader,
            "new_leader": self.new_leader,
            "steps": self.steps,
            "fault_to_sync_standby_again_s": None if self.rejoined_s is None else round(self.rejoined_s, 2),
            "pg_rewind": self.pg_rewind,
            "paths": {path: outcome.figures() for path, outcome in self.outcomes.items()},
        }


def _strike(cluster: Any, fault: str, leader: str, steps: list[str]) -> None:
    """The fault, and what must follow it before the cluster can heal (in this thread)."""
    other = cluster.other(leader)
    if fault == "postmaster-kill":
        cluster.kill_postmaster(leader)
        steps.append(f"kill -9 of {leader}'s postmaster; its agent restarts it (primary_start_timeout)")
    elif fault == "switchover":
        cluster.switchover(leader, other)
        steps.append(f"patronictl switchover --leader {leader} --candidate {other} --force")
    elif fault == "agent-kill":
        cluster.kill_agent(leader)
        time.sleep(cluster.watchdog_s)
        cluster.fence(leader)
        steps.append(
            f"kill -9 of {leader}'s agent; {cluster.watchdog_s} s later its node is reset (watchdog)"
        )
        took = cluster.wait_leader(other)
        steps.append(f"{other} led {took:.1f} s after the reset")
        cluster.start_agent(leader)
        steps.append(f"{leader}'s agent started again (the node is back): it rejoins as a standby")
    elif fault == UNFENCED:
        cluster.kill_agent(leader)
        took = cluster.wait_leader(other)
        steps.append(f"kill -9 of {leader}'s agent, no watchdog; {other} led {took:.1f} s later")
        cluster.start_agent(leader)
        steps.append(f"{leader}'s agent started again: it demotes its PostgreSQL, which kept running")
    elif fault == "etcd-cut":
        cluster.cut_off_etcd(leader)
        took = cluster.wait_leader(other)
        steps.append(f"{leader} cut off etcd; {other} led {took:.1f} s later")
        cluster.reconnect_etcd(leader)
        steps.append(f"{leader} reaches etcd again")
    else:
        raise ValueError(f"unknown fault {fault!r}: one of {', '.join((*FAULTS, UNFENCED))}")


def run_round(
    cluster: Any,
    fault: str,
    harnesses: dict[str, Any],
    sources: dict[str, Callable[[], Any]],
    *,
    jobs: int,
    timeout_s: float = 120.0,
) -> Round:
    """One fault with both paths' loads running; `harnesses` and `sources` are per path (tables cleared)."""
    cluster.wait_healthy()
    leader = cluster.leader()
    done = Round(fault, leader)
    loads: dict[str, Load] = {}
    for path, harness in harnesses.items():
        harness.clear()
        loads[path] = Load(
            harness,
            jobs=jobs,
            worker_sources=[sources[path]] * WORKERS,
            threads=THREADS,
            enqueue_connects=[sources[path]] * ENQUEUERS,
            batch=BATCH,
            enqueue_pause_s=enqueue_pause_s(jobs),
            timeout_s=timeout_s,
        )
    logs = {node.name: node.log_size() for node in cluster.nodes}
    try:
        for load in loads.values():
            load.start()
        for load in loads.values():
            load.wait_handled(FAULT_AFTER)
        for load in loads.values():
            load.mark_fault()
        struck = time.monotonic()
        _strike(cluster, fault, leader, done.steps)
        cluster.wait_healthy()
        done.rejoined_s = time.monotonic() - struck
        done.new_leader = cluster.leader()
    finally:
        for path, load in loads.items():
            done.outcomes[path] = load.finish()
    done.pg_rewind = any(_rewound(node.log_since(logs[node.name])) for node in cluster.nodes)
    return done


def enqueue_pause_s(jobs: int) -> float:
    """The pause between an enqueuer's batches that spreads `jobs` over ENQUEUE_SPAN_S."""
    return ENQUEUE_SPAN_S / max(jobs / ENQUEUERS / BATCH, 1)


def _rewound(log: str) -> bool:
    """Whether a part of an agent's log says it ran pg_rewind."""
    return "running pg_rewind from" in log


def harnesses_for(cluster: Any) -> tuple[dict[str, Any], dict[str, Callable[[], Any]]]:
    """Per path: a harness on tables of its own (installed), and the workers' and enqueuers' data source."""
    from conformance import builtin
    from proletarian_ref.backends.dsn import connection_factory

    dsns = {"dsn": cluster.dsn, "haproxy": cluster.haproxy_dsn}
    harnesses = {}
    for path, dsn in dsns.items():
        harness = builtin.postgresql(dsn, f"patroni_{path}_job", f"patroni_{path}_archived")
        harness.install()
        harnesses[path] = harness
    return harnesses, {path: connection_factory(dsn) for path, dsn in dsns.items()}


def settings(cluster_settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide the figures: Patroni's, HAProxy's check and the load's shape."""
    return {
        **cluster_settings,
        "dsn": "multi-host, target_session_attrs=read-write, connect_timeout=2",
        "load_per_path": f"{WORKERS} workers x {THREADS} threads, {ENQUEUERS} enqueuers "
        f"(batches of {BATCH} spread over {ENQUEUE_SPAN_S:g} s), fault after {FAULT_AFTER:.0%} handled",
    }


def run_rounds(cluster: Any, faults: Sequence[str], *, jobs: int, timeout_s: float = 120.0) -> dict[str, Any]:
    """Each fault in turn on one cluster; the figures of all, and every problem named by fault and path."""
    harnesses, sources = harnesses_for(cluster)
    rounds = [
        run_round(cluster, fault, harnesses, sources, jobs=jobs, timeout_s=timeout_s) for fault in faults
    ]
    return {
        "settings": settings(cluster.settings),
        "jobs_per_path_per_round": jobs,
        "rounds": [done.figures() for done in rounds],
        "problems": [problem for done in rounds for problem in done.problems],
    }


def table(figures: dict[str, Any]) -> str:
    """The run as the Markdown table of docs/scaling.md: one row per fault and path."""
    lines = [
        "| fault | path | leader after | stall (s) | fault to the commit that ends it (s) | old primary a "
        "sync standby again (s) | pg_rewind | jobs committed | each archived once | enqueues uncertain | "
        "handlers run twice |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for done in figures["rounds"]:
        for path, run in done["paths"].items():
            once = "yes" if not run["problems"] else "NO"
            cells = [
                done["fault"],
                {"dsn": "multi-host DSN", "haproxy": "HAProxy"}[path],
                f"{done['new_leader']} (was {done['old_leader']})",
                _cell(run["stall_after_fault_s"]),
                _cell(run["fault_to_recovery_s"]),
                _cell(done["fault_to_sync_standby_again_s"]),
                "yes" if done["pg_rewind"] else "no",
                f"{run['jobs_committed']:,}",
                once,
                str(run["jobs_uncertain"]),
                str(run["jobs_run_twice"]),
            ]
            lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"
