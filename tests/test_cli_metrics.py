"""`worker --queue a --queue b --metrics-port`: queues in one process, Prometheus metrics, JSON logs."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import (
    Target,
    isolate,
    parametrize_dialects,
    run,
    sigterm_to_self,  # noqa: F401 (a fixture, used by name)
    target,
)
from fix_throwaway import free_port

from proletarian_ref import log as ev
from proletarian_ref.cli import ExitCode
from proletarian_ref.ops.metrics import OTHER_JOB_TYPES, WorkerMetrics

pytest_generate_tests = parametrize_dialects


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path)


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "metrics")


def _sample(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.usefixtures("sigterm_to_self")
def test_one_worker_process_runs_two_queues_and_serves_their_metrics(
    capsys: pytest.CaptureFixture[str], database: Target
) -> None:
    for argv in (
        ["t/ok", "{}", "--queue", "a/q"],
        ["t/bad", '{"fail": true}', "--queue", "b/q"],
        ["t/later", "{}", "--queue", "c/q", "--process-in", "3600"],
    ):
        assert run(capsys, "enqueue", *argv, *database.args).code == ExitCode.OK
    port = free_port()
    scraped: list[str] = []

    def scrape_then_stop() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(database.archived_jobs()) < 2:
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            scraped.append(response.read().decode())
        os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=scrape_then_stop, daemon=True)
    watcher.start()
    result = run(
        capsys,
        "worker",
        "--handler",
        "cli_handlers:fails_when_asked",
        "--queue",
        "a/q",
        "--queue",
        "b/q",
        "--queue",
        "empty/q",
        "--retries",
        "1",
        "--polling-interval-ms",
        "20",
        "--metrics-port",
        str(port),
        "--log-format",
        "json",
        *database.args,
    )
    watcher.join(timeout=10)
    assert result.code == ExitCode.OK, result.err
    assert sorted((a.queue, a.status, a.attempts) for a in database.archived_jobs()) == [
        (":a/q", ":success", 1),
        (":b/q", ":failure", 2),
    ]
    [text] = scraped
    ok, bad = {"queue": "a/q", "job_type": "t/ok"}, {"queue": "b/q", "job_type": "t/bad"}
    assert _sample(text, "proletarian_jobs_succeeded_total", **ok) == 1
    assert _sample(text, "proletarian_jobs_processed_total", **bad) == 2
    assert _sample(text, "proletarian_jobs_failed_total", **bad) == 2
    assert _sample(text, "proletarian_jobs_retried_total", **bad) == 1
    assert _sample(text, "proletarian_jobs_given_up_total", **bad) == 1
    assert _sample(text, "proletarian_handler_duration_seconds_count", **ok) == 1
    # Series for exactly the queues served: an empty one at 0, none for c/q, which has jobs but no worker.
    assert _sample(text, "proletarian_queue_depth", queue="empty/q", state="due") == 0
    assert _sample(text, "proletarian_queue_lag_seconds", queue="empty/q") == 0
    assert _sample(text, "proletarian_queue_depth", queue="a/q", state="running") == 0
    assert 'queue="c/q"' not in text
    assert _sample(text, "proletarian_queue_stats_up") == 1
    lines = [json.loads(line) for line in result.err.splitlines()]
    events = {line["event"] for line in lines}
    assert {ev.HANDLING_JOB, ev.JOB_FINISHED, ev.RETRYING, ev.NOT_RETRYING} <= events
    handling = next(line for line in lines if line["event"] == ev.HANDLE_JOB_EXCEPTION)
    assert (handling[ev.JOB_TYPE], handling[ev.EXCEPTION]["type"]) == ("t/bad", "PlannedFailure")
    assert any("worker running on queues a/q, b/q, empty/q" in line.get("message", "") for line in lines)
    assert lines[-1]["message"] == "worker stopped"


def test_interrupted_runs_and_polling_errors_are_counted() -> None:
    metrics = WorkerMetrics()
    job = {ev.QUEUE_WORKER_ID: "w", ev.WORKER_THREAD_ID: 1, ev.JOB_TYPE: "t/x"}
    metrics.observe(":q", ev.HANDLING_JOB, job)
    metrics.observe(":q", ev.JOB_INTERRUPTED, job)
    metrics.observe(":q", ev.SQL_TRANSIENT_EXCEPTION, {ev.QUEUE_WORKER_ID: "w"})
    metrics.observe(":q", ev.JOB_WORKER_ERROR, {ev.QUEUE_WORKER_ID: "w"})
    value = metrics.registry.get_sample_value
    assert value("proletarian_jobs_interrupted_total", {"queue": "q", "job_type": "t/x"}) == 1
    assert value("proletarian_jobs_processed_total", {"queue": "q", "job_type": "t/x"}) is None
    assert value("proletarian_handler_duration_seconds_count", {"queue": "q", "job_type": "t/x"}) == 1
    for kind in ("transient", "error"):
        assert value("proletarian_polling_errors_total", {"queue": "q", "kind": kind}) == 1


def test_job_types_past_the_limit_share_one_label_value() -> None:
    """A scrape's size must not follow the data: 10,000 job types give at most `max_job_types` + 1 series
    per counter."""
    metrics = WorkerMetrics(max_job_types=2)
    for n in range(10_000):
        job = {ev.QUEUE_WORKER_ID: "w", ev.WORKER_THREAD_ID: 1, ev.JOB_TYPE: f"t/x{n % 5}"}
        metrics.observe(":q", ev.HANDLING_JOB, job)
        metrics.observe(":q", ev.JOB_FINISHED, job)
    value = metrics.registry.get_sample_value
    assert value("proletarian_jobs_succeeded_total", {"queue": "q", "job_type": "t/x0"}) == 2000
    assert value("proletarian_jobs_succeeded_total", {"queue": "q", "job_type": "t/x1"}) == 2000
    assert value("proletarian_jobs_succeeded_total", {"queue": "q", "job_type": OTHER_JOB_TYPES}) == 6000
    samples = [s for m in metrics.registry.collect() for s in m.samples if s.name.endswith("succeeded_total")]
    assert len(samples) == 3
    assert WorkerMetrics(max_job_types=0)._job_type_label("t/x") == OTHER_JOB_TYPES
