"""Locust users that enqueue jobs through proletarian-ref, each on its own connection, while workers drain.

Run by `python -m benchmarks run` (benchmarks/load_test.py), which sets the environment below, starts the
workers, and verifies afterwards that every job enqueued here was archived exactly once. By hand:

    PROLETARIAN_BENCH_FACTORY=conformance.builtin:postgresql \\
    PROLETARIAN_BENCH_JOB_TABLE=proletarian.bench_job_locust \\
    PROLETARIAN_BENCH_IDS_FILE=/tmp/ids.json \\
    locust -f benchmarks/locustfile.py --headless -u 4 -r 4 --run-time 20s --csv /tmp/locust
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

from locust import User, constant_throughput, events, task
from locust.env import Environment

from conformance.harness import Harness, load_harness
from proletarian_ref import enqueue

FACTORY = os.environ.get("PROLETARIAN_BENCH_FACTORY", "conformance.builtin:postgresql")
OPTIONS: dict[str, Any] = json.loads(os.environ.get("PROLETARIAN_BENCH_OPTIONS", "{}"))
JOB_TABLE = os.environ.get("PROLETARIAN_BENCH_JOB_TABLE", "proletarian.bench_job_locust")
ARCHIVED_JOB_TABLE = os.environ.get(
    "PROLETARIAN_BENCH_ARCHIVED_JOB_TABLE", "proletarian.bench_archived_job_locust"
)
QUEUE = os.environ.get("PROLETARIAN_BENCH_QUEUE", "bench/q")
IDS_FILE = os.environ.get("PROLETARIAN_BENCH_IDS_FILE", "")
USER_RATE = float(os.environ.get("PROLETARIAN_BENCH_USER_RATE", "40"))
REQUEST_NAME = "enqueue+commit"

# Ids whose COMMIT returned, and ids whose COMMIT was under way when a user was stopped: the verifier
# needs both to tell a lost job from one that was committed just as the run ended.
committed: list[str] = []
pending: set[str] = set()
# Locust rounds response times to whole milliseconds; an enqueue takes a few, so keep them exact too.
durations_ms: list[float] = []
_harnesses: list[Harness] = []


def harness() -> Harness:
    """The backend's harness, loaded once per locust process (users only take connections from it)."""
    if not _harnesses:
        _harnesses.append(
            load_harness(FACTORY, job_table=JOB_TABLE, archived_job_table=ARCHIVED_JOB_TABLE, **OPTIONS)
        )
    return _harnesses[0]


class EnqueueUser(User):
    """One application thread: enqueue a job and commit, at a steady rate."""

    wait_time = constant_throughput(USER_RATE)

    def on_start(self) -> None:
        self.conn = harness().connect()
        self.sequence = 0

    def on_stop(self) -> None:
        self.conn.close()

    @task
    def enqueue_job(self) -> None:
        self.sequence += 1
        start = time.perf_counter()
        exception: BaseException | None = None
        job_id = None
        try:
            job_id = str(
                enqueue(self.conn, "bench/job", {"i": self.sequence}, queue=QUEUE, job_table=JOB_TABLE)
            )
            pending.add(job_id)
            self.conn.commit()
            committed.append(job_id)
            pending.discard(job_id)
        except Exception as exc:
            exception = exc
            # The failure is already reported; a broken connection cannot roll back.
            with contextlib.suppress(Exception):
                self.conn.rollback()
        elapsed_ms = (time.perf_counter() - start) * 1000
        if exception is None:
            durations_ms.append(elapsed_ms)
        self.environment.events.request.fire(
            request_type="enqueue",
            name=REQUEST_NAME,
            response_time=elapsed_ms,
            response_length=0,
            exception=exception,
            context={"job_id": job_id},
        )


def write_ids(environment: Environment, **_: Any) -> None:
    """At exit, the ids and durations for the verifier in load_test.py."""
    if IDS_FILE:
        with open(IDS_FILE, "w", encoding="utf-8") as f:
            json.dump({"committed": committed, "pending": sorted(pending), "durations_ms": durations_ms}, f)


# locust's add_listener carries no annotations; typed here so the module stays mypy --strict.
_add_listener: Callable[[Callable[..., None]], object] = events.quitting.add_listener
_add_listener(write_ids)
