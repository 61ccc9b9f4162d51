"""ProletarianBackend: django.tasks stored as Proletarian jobs on Django's own connection, run by a worker."""

from __future__ import annotations

from datetime import UTC, datetime
from traceback import format_exception
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils.crypto import get_random_string
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from proletarian_ref.errors import ConfigurationError
from proletarian_ref.job import enqueue
from proletarian_ref.keywords import from_keyword_text
from proletarian_ref.ops.db import Tables
from proletarian_ref.ops.jobs import show_job
from proletarian_ref.tables import DEFAULT_ARCHIVED_JOB_TABLE, DEFAULT_JOB_TABLE

__all__ = ["ProletarianBackend"]

# An archived job's status, as Django names it; a status ops tools may add (e.g. cancelled) is a failure.
_STATUSES = {":success": TaskResultStatus.SUCCESSFUL, ":failure": TaskResultStatus.FAILED}


class ProletarianBackend(BaseTaskBackend):
    """TASKS = {"default": {"BACKEND": "proletarian_ref.integrations.django.ProletarianBackend"}}.

    OPTIONS: DATABASE (the alias of the connection jobs are written on, "default"), JOB_TABLE and
    ARCHIVED_JOB_TABLE (Proletarian's tables, proletarian.job and proletarian.archived_job).
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        self.database: str = options.pop("DATABASE", DEFAULT_DB_ALIAS)
        try:
            self.tables = Tables.of(
                options.pop("JOB_TABLE", DEFAULT_JOB_TABLE),
                options.pop("ARCHIVED_JOB_TABLE", DEFAULT_ARCHIVED_JOB_TABLE),
            )
        except ConfigurationError as exc:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: {exc}") from exc
        if options:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}] OPTIONS has {sorted(options)}, which ProletarianBackend does not know: "
                "it takes DATABASE, JOB_TABLE and ARCHIVED_JOB_TABLE"
            )
        self.worker_id = get_random_string(32)

    @property
    def table_options(self) -> dict[str, Any]:
        return {"job_table": self.tables.job, "archived_job_table": self.tables.archived}

    def driver_connection(self) -> Any:
        """The driver connection under Django's connection of DATABASE, in whatever transaction it is in."""
        wrapper = connections[self.database]
        wrapper.ensure_connection()
        return wrapper.connection

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        args, kwargs = normalize_json(list(args)), normalize_json(kwargs)
        enqueued_at = datetime.now(UTC)
        job_id = enqueue(
            self.driver_connection(),
            job_type_of(task),
            {"args": args, "kwargs": kwargs},
            queue=task.queue_name,
            process_at=task.run_after,
            clock=lambda: enqueued_at,
            **self.table_options,
        )
        result = _result(task, str(job_id), TaskResultStatus.READY, args, kwargs, self.alias)
        object.__setattr__(result, "enqueued_at", enqueued_at)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's status from the job table (READY) or the archive (SUCCESSFUL or FAILED)."""
        try:
            view = show_job(self.driver_connection(), result_id, tables=self.tables)
        except ConfigurationError as exc:  # not a job id of this database
            raise TaskResultDoesNotExist(result_id) from exc
        if view is None:
            raise TaskResultDoesNotExist(result_id)
        status = TaskResultStatus.READY if view.status is None else _STATUSES.get(view.status)
        payload = view.payload()
        task = task_of(from_keyword_text(view.job_type)).using(queue_name=from_keyword_text(view.queue))
        result = _result(
            task,
            str(view.job_id),
            status or TaskResultStatus.FAILED,
            list(payload["args"]),
            dict(payload["kwargs"]),
            self.alias,
        )
        object.__setattr__(result, "enqueued_at", view.enqueued_at)
        object.__setattr__(result, "finished_at", view.finished_at)
        return result

    def run(self, job_type: str, payload: Any) -> None:
        """The worker's handler: call the job's task, with Django's connection handling around it."""
        close_old_connections()
        try:
            task = task_of(job_type)
            args, kwargs = list(payload["args"]), dict(payload["kwargs"])
            result = _result(task, "", TaskResultStatus.RUNNING, args, kwargs, self.alias)
            result.worker_ids.append(self.worker_id)
            now = datetime.now(UTC)
            object.__setattr__(result, "started_at", now)
            object.__setattr__(result, "last_attempted_at", now)
            task_started.send(type(self), task_result=result)
            try:
                if task.takes_context:
                    task.call(TaskContext(task_result=result), *args, **kwargs)
                else:
                    task.call(*args, **kwargs)
            except BaseException as exc:
                kind = type(exc)
                result.errors.append(
                    TaskError(
                        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                        traceback="".join(format_exception(exc)),
                    )
                )
                object.__setattr__(result, "status", TaskResultStatus.FAILED)
                raise
            else:
                object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
            finally:
                object.__setattr__(result, "finished_at", datetime.now(UTC))
                task_finished.send(type(self), task_result=result)
        finally:
            close_old_connections()


def job_type_of(task: Task) -> str:
    """The job type of a task: its module as the keyword's namespace, its function's name as the name."""
    return f"{task.func.__module__}/{task.func.__qualname__}"


def task_of(job_type: str) -> Task:
    """The task a job type names (job_type_of's inverse), refusing anything that is not a Task."""
    module, _, name = job_type.partition("/")
    found = import_string(f"{module}.{name}")
    if not isinstance(found, Task):
        raise ImproperlyConfigured(f"job type {job_type!r} names {found!r}, which is not a django.tasks Task")
    return found


def _result(
    task: Task, result_id: str, status: TaskResultStatus, args: Any, kwargs: Any, backend: str
) -> TaskResult:
    return TaskResult(
        task=task,
        id=result_id,
        status=status,
        enqueued_at=None,
        started_at=None,
        last_attempted_at=None,
        finished_at=None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=[],
    )
