"""The Django project's checks, run by tests/test_django.py in a Python >= 3.12 with Django 6.

Each check names the behaviour it proves; any failed assert exits non-zero. The tables are the run's own
(settings.SUFFIX), created here and dropped at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from io import StringIO

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.tasks import default_task_backend  # noqa: E402
from django.tasks.base import TaskResultStatus  # noqa: E402
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist  # noqa: E402
from shop import tasks  # noqa: E402
from shop.models import Order  # noqa: E402

from proletarian_ref import schema  # noqa: E402
from proletarian_ref.ops.jobs import show_job  # noqa: E402

backend = default_task_backend


def run_worker(*args: str) -> str:
    out = StringIO()
    call_command("proletarian_worker", "--burst", *args, stdout=out)
    return out.getvalue()


def a_task_enqueued_in_atomic_commits_with_the_orders_row() -> None:
    with transaction.atomic():
        order = Order.objects.create(item="book")
        result = tasks.ship.enqueue(order.pk, note="fast ")
        assert backend.get_result(result.id).status == TaskResultStatus.READY  # seen in its transaction
    assert tasks.ship.get_result(result.id).status == TaskResultStatus.READY
    assert run_worker() == "ran 1 task(s)\n"
    assert Order.objects.get(pk=order.pk).item == "fast shipped"
    done = tasks.ship.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.is_finished, done
    assert done.args == [order.pk] and done.kwargs == {"note": "fast "}, done
    assert done.finished_at is not None and done.enqueued_at is not None
    assert done.return_value is None  # Proletarian's archive keeps no return value (docs/django.md)


def a_task_enqueued_in_a_rolled_back_atomic_is_gone_with_it() -> None:
    try:
        with transaction.atomic():
            order = Order.objects.create(item="lamp")
            result = tasks.ship.enqueue(order.pk)
            raise LookupError("the view failed")
    except LookupError:
        pass
    assert not Order.objects.filter(item="lamp").exists()
    try:
        backend.get_result(result.id)
    except TaskResultDoesNotExist:
        pass
    else:
        raise AssertionError("a rolled back task has a result")
    assert run_worker() == "ran 0 task(s)\n"
    for unknown in ("not-a-job-id", "00000000-0000-0000-0000-000000000000"):
        try:
            backend.get_result(unknown)
        except TaskResultDoesNotExist:
            pass
        else:
            raise AssertionError(f"{unknown!r} has a result")


def run_after_is_process_at_and_queue_name_is_the_queue() -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    deferred = tasks.ship.using(run_after=later).enqueue(0)
    view = show_job(connection.connection, deferred.id, tables=backend.tables)
    assert view is not None and abs(view.process_at - later) < timedelta(seconds=1), (
        view
    )  # MySQL keeps seconds
    assert view.job_type == ":shop.tasks/ship", view
    mailed = tasks.mail.enqueue("ann@example.com")
    view = show_job(connection.connection, mailed.id, tables=backend.tables)
    assert view is not None and view.queue == ":mail", view
    assert run_worker() == "ran 0 task(s)\n"  # the default queue has only the deferred task
    assert run_worker("--queue", "mail") == "ran 1 task(s)\n"
    assert Order.objects.filter(item="mail to ann@example.com").exists()
    assert backend.get_result(deferred.id).status == TaskResultStatus.READY
    assert backend.get_result(mailed.id).status == TaskResultStatus.SUCCESSFUL


def a_failing_task_is_failed_and_context_counts_its_attempt() -> None:
    failing = tasks.broken.enqueue()
    order = Order.objects.create(item="pen")
    counted = tasks.counted.enqueue(order.pk)
    assert run_worker() == "ran 2 task(s)\n"
    assert backend.get_result(failing.id).status == TaskResultStatus.FAILED
    assert backend.get_result(counted.id).status == TaskResultStatus.SUCCESSFUL
    assert Order.objects.get(pk=order.pk).item == "attempt 1"


def the_worker_command_runs_tasks_until_sigint() -> None:
    order = Order.objects.create(item="cup")
    result = tasks.ship_async.enqueue(order.pk)
    worker = subprocess.Popen(
        [
            sys.executable,
            os.path.join(HERE, "manage.py"),
            "proletarian_worker",
            "--polling-interval-ms",
            "50",
        ],
        cwd=HERE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):  # up to 30 s on a busy machine; the job normally runs within a second
            if backend.get_result(result.id).is_finished:
                break
            time.sleep(0.05)
        assert backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
        assert Order.objects.get(pk=order.pk).item == "async shipped"
    finally:
        worker.send_signal(signal.SIGINT)
        out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, (worker.returncode, out)
    assert "running queue 'default'" in out, out


def priority_is_refused_as_django_refuses_it_on_backends_without() -> None:
    try:
        tasks.ship.using(priority=5).enqueue(1)
    except InvalidTask as exc:
        assert "priority" in str(exc), exc
    else:
        raise AssertionError("a priority was taken")


def a_tasks_orm_writes_are_not_in_the_jobs_transaction_but_its_job_connection_writes_are() -> None:
    order = Order.objects.create(item="pen")
    failing = tasks.writes_both_ways_then_fails.enqueue(order.pk)
    assert run_worker() == "ran 1 task(s)\n"
    assert backend.get_result(failing.id).status == TaskResultStatus.FAILED
    order.refresh_from_db()
    # The ORM's write committed on its own; the write on current_job().connection() rolled back.
    assert (order.item, order.shipped) == ("written by the ORM", False), (order.item, order.shipped)


def main() -> None:
    job_table, archived = backend.tables.job, backend.tables.archived
    connection.ensure_connection()
    drop = [f"DROP TABLE IF EXISTS {archived}", f"DROP TABLE IF EXISTS {job_table}"]
    with connection.cursor() as cursor:
        for statement in drop:
            cursor.execute(statement)
    schema.install(connection.connection, job_table=job_table, archived_job_table=archived)
    with connection.schema_editor() as editor:
        if Order._meta.db_table in connection.introspection.table_names():
            editor.delete_model(Order)
        editor.create_model(Order)
    connection.ensure_connection()
    # The driver the settings asked for, not PyMySQL standing in for it: type(...) is the driver's class.
    driver = type(connection.connection).__module__.split(".")[0]
    print(f"driver {driver}")
    if os.environ.get("PROLETARIAN_DJANGO_DB") == "mysqlclient":
        assert driver == "MySQLdb" and "pymysql" not in sys.modules, (driver, sorted(sys.modules))
    try:
        for check in (
            a_task_enqueued_in_atomic_commits_with_the_orders_row,
            a_task_enqueued_in_a_rolled_back_atomic_is_gone_with_it,
            run_after_is_process_at_and_queue_name_is_the_queue,
            a_failing_task_is_failed_and_context_counts_its_attempt,
            a_tasks_orm_writes_are_not_in_the_jobs_transaction_but_its_job_connection_writes_are,
            the_worker_command_runs_tasks_until_sigint,
            priority_is_refused_as_django_refuses_it_on_backends_without,
        ):
            check()
            print(f"ok {check.__name__}")
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(Order)
        with connection.cursor() as cursor:
            for statement in drop:
                cursor.execute(statement)


if __name__ == "__main__":
    main()
