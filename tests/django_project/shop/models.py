"""An order: the application's own row, written in the transaction that enqueues its task."""

from django.conf import settings
from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=40)
    shipped = models.BooleanField(default=False)

    class Meta:
        app_label = "shop"
        db_table = f"shop_order_{settings.SUFFIX}"
