"""One worker process on one host: `python -m benchmarks.scale.host_worker DSN JOB ARCHIVED THREADS STOP`.

Runs a queue worker until the STOP file appears, then prints one JSON line: the job numbers its handler
ran, the errors it logged, and whether the worker was still running.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proletarian_ref import create_queue_worker
from proletarian_ref import log as ev
from proletarian_ref.backends.dsn import connection_factory

WORK_S = 0.0005


def main(argv: list[str]) -> int:
    dsn, job_table, archived_job_table, threads, stop_file = argv
    lock = threading.Lock()
    runs: list[int] = []
    problems: list[str] = []

    def handler(job_type: str, payload: Any) -> None:
        time.sleep(WORK_S)
        with lock:
            runs.append(int(payload))

    def log(event: str, data: Mapping[str, Any]) -> None:
        if event in (ev.SQL_TRANSIENT_EXCEPTION, ev.JOB_WORKER_ERROR, ev.HANDLE_JOB_EXCEPTION):
            with lock:
                problems.append(f"{event}: {data.get(ev.THROWABLE) or data.get(ev.EXCEPTION)}")

    worker = create_queue_worker(
        connection_factory(dsn),
        handler,
        job_table=job_table,
        archived_job_table=archived_job_table,
        worker_threads=int(threads),
        polling_interval_ms=100,
        log=log,
    )
    worker.start()
    deadline = time.monotonic() + 3600
    while not Path(stop_file).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    running = worker.running
    worker.stop()
    print(json.dumps({"runs": runs, "problems": problems, "running": running}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
