"""Runs locustfile.py headless against a live worker, then checks every job was archived exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter as Tally
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BENCH_QUEUE,
    BENCH_QUEUE_TEXT,
    BackendSpec,
    closing_harness,
    count_rows,
    open_harness,
    summarize_ms,
    wait_until,
)
from benchmarks.progress import Progress
from benchmarks.settings import Settings
from benchmarks.workers import processes_skip_reason
from proletarian_ref import Job, create_queue_worker
from proletarian_ref.backend import STATUS_SUCCESS
from proletarian_ref.job_ids import default_job_id_strategy

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
REQUEST_NAME = "enqueue+commit"


def _locust_stats(json_file: Path, ids_file: Path) -> dict[str, Any]:
    """Locust's own final counts, and exact percentiles from the durations the users recorded."""
    out: dict[str, Any] = {}
    if json_file.exists():
        for entry in json.loads(json_file.read_text(encoding="utf-8")):
            if entry.get("name") == REQUEST_NAME:
                seconds = max(entry["last_request_timestamp"] - entry["start_time"], 1e-9)
                out.update(
                    seconds=seconds,
                    requests=entry["num_requests"],
                    failures=entry["num_failures"],
                    requests_per_s=entry["num_requests"] / seconds,
                )
    if ids_file.exists():
        durations = json.loads(ids_file.read_text(encoding="utf-8")).get("durations_ms", [])
        out.update(summarize_ms([d / 1000 for d in durations]))
    return out


def run(spec: BackendSpec, settings: Settings, progress: Progress, out_dir: Path) -> dict[str, Any]:
    harness = open_harness(spec, "locust", settings.table_suffix)
    with closing_harness(harness):
        reason = processes_skip_reason(harness)
        if reason:
            return {
                "backend": harness.name,
                "factory": spec.factory,
                "skipped": f"locust runs in its own process: {reason}",
            }
        task = progress.task(f"{harness.name}: locust ({settings.locust_run_time_s} s)", 3)
        lock = threading.Lock()
        handled: Tally[str] = Tally()

        def handler(job: Job) -> None:
            with lock:
                handled[str(job.job_id)] += 1

        worker = create_queue_worker(
            harness.data_source,
            handler,
            handler_fn_mode="advanced",
            queue=BENCH_QUEUE,
            worker_threads=settings.locust_worker_threads,
            polling_interval_ms=settings.polling_interval_ms,
            **harness.table_options,
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        prefix = out_dir / f"locust_{harness.name}"
        ids_file = out_dir / f"locust_{harness.name}_ids.json"
        ids_file.unlink(missing_ok=True)
        env = {
            **os.environ,
            "PROLETARIAN_BENCH_FACTORY": spec.factory,
            "PROLETARIAN_BENCH_OPTIONS": json.dumps(spec.options),
            "PROLETARIAN_BENCH_JOB_TABLE": harness.job_table,
            "PROLETARIAN_BENCH_ARCHIVED_JOB_TABLE": harness.archived_job_table,
            "PROLETARIAN_BENCH_QUEUE": BENCH_QUEUE,
            "PROLETARIAN_BENCH_IDS_FILE": str(ids_file),
            "PROLETARIAN_BENCH_USER_RATE": str(settings.locust_user_rate),
        }
        users = str(settings.locust_users)
        command = [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "-u", users, "-r", users, "--run-time", f"{settings.locust_run_time_s}s",
            "--stop-timeout", "5", "--csv", str(prefix), "--json-file", str(prefix), "--only-summary",
            "--loglevel", "WARNING",
        ]  # fmt: skip
        worker.start()
        try:
            start = time.perf_counter()
            completed = subprocess.run(
                command,
                env=env,
                capture_output=True,
                text=True,
                timeout=settings.locust_run_time_s + 90,
                check=False,
            )
            run_s = time.perf_counter() - start
            handled_during_run = sum(handled.values())
            progress.advance(task)
            Path(f"{prefix}.log").write_text(completed.stdout + completed.stderr, encoding="utf-8")
            drained = wait_until(
                lambda: count_rows(harness, queue_text=BENCH_QUEUE_TEXT) == 0,
                settings.locust_drain_timeout_s,
                step_s=0.1,
            )
            drain_s = time.perf_counter() - start - run_s
            progress.advance(task)
        finally:
            worker.stop()
        result: dict[str, Any] = {
            "backend": harness.name,
            "factory": spec.factory,
            "users": settings.locust_users,
            "user_rate_per_s": settings.locust_user_rate,
            "worker_threads": settings.locust_worker_threads,
            "run_s": round(run_s, 3),
            "locust_exit_code": completed.returncode,
            "enqueue": _locust_stats(Path(f"{prefix}.json"), ids_file),
            "handled_during_run": handled_during_run,
            "drain_after_run_s": round(drain_s, 3),
            "drained": drained,
        }
        # Jobs handled while the users ran, over the seconds they ran (the process start-up excluded).
        seconds = result["enqueue"].get("seconds", run_s)
        result["jobs_per_s"] = handled_during_run / seconds if seconds > 0 else 0.0
        result["verification"] = verify(harness, ids_file, handled)
        if result["verification"]["ok"]:
            # Thousands of ids are only worth keeping when they explain a failure.
            ids_file.unlink(missing_ok=True)
        progress.done(task)
        return result


def verify(harness: Any, ids_file: Path, handled: Tally[str]) -> dict[str, Any]:
    """Every committed job archived exactly once as a success, handled once, and nothing left or unknown."""
    problems: list[str] = []
    if not ids_file.exists():
        return {"ok": False, "problems": [f"locust wrote no id file ({ids_file}); see the locust log"]}
    ids = json.loads(ids_file.read_text(encoding="utf-8"))
    committed: list[str] = ids["committed"]
    pending = set(ids["pending"])
    strategy = default_job_id_strategy(harness.backend().dialect)
    archived = [r for r in harness.archived_jobs() if r.queue == BENCH_QUEUE_TEXT]
    archived_ids = Tally(str(strategy.decode_id(r.job_id)) for r in archived)
    committed_set = set(committed)
    if len(committed_set) != len(committed):
        problems.append(f"enqueue returned {len(committed) - len(committed_set)} duplicate job ids")
    missing = committed_set - set(archived_ids)
    doubled = [i for i, n in archived_ids.items() if n != 1]
    unknown = set(archived_ids) - committed_set - pending
    handled_wrong = [i for i in archived_ids if handled.get(i, 0) != 1]
    not_success = [r for r in archived if r.status != STATUS_SUCCESS]
    left = count_rows(harness, queue_text=BENCH_QUEUE_TEXT)
    for label, items in (
        ("committed jobs never archived", missing),
        ("jobs archived more than once", doubled),
        ("archived jobs nobody enqueued", unknown),
        ("archived jobs not handled exactly once", handled_wrong),
        ("archived jobs not :success", not_success),
    ):
        if items:
            sample = ", ".join(sorted(map(str, items))[:5])
            problems.append(f"{len(items)} {label} (e.g. {sample})")
    if left:
        problems.append(f"{left} jobs still in the job table after the drain timeout")
    return {
        "ok": not problems and bool(committed),
        "committed": len(committed),
        "pending_at_stop": len(pending),
        "archived": sum(archived_ids.values()),
        "handled": sum(handled.values()),
        "left_in_queue": left,
        "problems": problems if committed else [*problems, "locust committed no job at all"],
    }
