"""The shop's tasks, as a Django 6 application declares them."""

from __future__ import annotations

from typing import Any

from django.tasks import task

from proletarian_ref import current_job
from shop.models import Order

ATTEMPTS: list[int] = []


@task
def ship(order_id: int, *, note: str = "") -> str:
    Order.objects.filter(pk=order_id).update(shipped=True, item=f"{note}shipped")
    return "shipped"


@task
async def ship_async(order_id: int) -> None:
    await Order.objects.filter(pk=order_id).aupdate(shipped=True, item="async shipped")


@task(queue_name="mail")
def mail(to: str) -> None:
    Order.objects.create(item=f"mail to {to}")


@task
def broken() -> None:
    raise RuntimeError("out of stock")


@task(takes_context=True)
def counted(context: Any, order_id: int) -> None:
    Order.objects.filter(pk=order_id).update(item=f"attempt {context.attempt}")


@task
def writes_both_ways_then_fails(order_id: int) -> None:
    # Django's ORM writes on Django's connection of this thread, in autocommit: not the job's.
    Order.objects.filter(pk=order_id).update(item="written by the ORM")
    # The job's own transaction: rolled back with the failure below.
    with current_job().connection().cursor() as cursor:
        cursor.execute(f"UPDATE {Order._meta.db_table} SET shipped = %s WHERE id = %s", [True, order_id])
    raise RuntimeError("fails after both writes")
