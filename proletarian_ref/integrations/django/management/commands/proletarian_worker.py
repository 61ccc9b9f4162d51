"""manage.py proletarian_worker: run the django.tasks of a ProletarianBackend's queue (docs/django.md)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, task_backends

from proletarian_ref.backends import backend_for_data_source
from proletarian_ref.integrations.django.backend import ProletarianBackend
from proletarian_ref.worker import create_queue_worker, process_next_job


def connection_factory(alias: str) -> Callable[[], Any]:
    """New driver connections set up as Django sets up its own for `alias`, owned by the worker alone."""

    def connect() -> Any:
        wrapper = connections.create_connection(alias)
        wrapper.ensure_connection()
        return wrapper.connection

    return connect


class Command(BaseCommand):
    help = (
        "Run the tasks of a ProletarianBackend queue until stopped (SIGINT or SIGTERM), or once with --burst."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default=DEFAULT_TASK_BACKEND_ALIAS, help="the TASKS alias")
        parser.add_argument("--queue", default=DEFAULT_TASK_QUEUE_NAME, help="the task queue_name to run")
        parser.add_argument("--threads", type=int, default=1, help="tasks run at once (worker threads)")
        parser.add_argument("--polling-interval-ms", type=float, default=100, help="wait between polls")
        parser.add_argument("--burst", action="store_true", help="run every due task, then exit")

    def handle(self, *args: Any, **options: Any) -> None:
        tasks_backend = task_backends[options["backend"]]
        if not isinstance(tasks_backend, ProletarianBackend):
            raise CommandError(
                f"TASKS[{options['backend']!r}] is a {type(tasks_backend).__name__}, not a ProletarianBackend"
            )
        if tasks_backend.queues and options["queue"] not in tasks_backend.queues:
            raise CommandError(
                f"queue {options['queue']!r} is not in TASKS[{options['backend']!r}]['QUEUES']"
            )
        connect = connection_factory(tasks_backend.database)
        job_options = {"queue": options["queue"], **tasks_backend.table_options}
        if options["burst"]:
            backend = backend_for_data_source(connect)
            try:
                ran = 0
                while process_next_job(connect, tasks_backend.run, backend=backend, **job_options):
                    ran += 1
            finally:
                backend.close()
            self.stdout.write(f"ran {ran} task(s)")
            return
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        worker = create_queue_worker(
            connect,
            tasks_backend.run,
            worker_threads=options["threads"],
            polling_interval_ms=options["polling_interval_ms"],
            **job_options,
        )
        worker.start()
        self.stdout.write(f"proletarian_worker: running queue {options['queue']!r}; Ctrl-C stops")
        try:
            stop.wait()
        finally:
            worker.stop()
