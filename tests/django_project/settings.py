"""Settings of the Django test project: the database named by PROLETARIAN_DJANGO_DB, ProletarianBackend."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

DATABASE = os.environ.get("PROLETARIAN_DJANGO_DB", "postgresql")
# Keeps concurrent runs (xdist workers, checkouts) on one server apart, as the main tests' tables are.
SUFFIX = os.environ.get("PROLETARIAN_DJANGO_SUFFIX", "django")


def _database(dsn: str, engine: str) -> dict[str, Any]:
    url = urlsplit(dsn)
    return {
        "ENGINE": engine,
        "NAME": url.path.lstrip("/"),
        "USER": unquote(url.username or ""),
        "PASSWORD": unquote(url.password or ""),
        "HOST": url.hostname or "localhost",
        "PORT": str(url.port or ""),
    }


if DATABASE == "mysql":
    # Django's MySQL backend on PyMySQL installed as MySQLdb (docs/django.md, "Drivers").
    import pymysql

    pymysql.version_info = (2, 2, 1, "final", 0)
    pymysql.install_as_MySQLdb()
if DATABASE in ("mysql", "mysqlclient"):
    # On "mysqlclient", Django's MySQL backend on mysqlclient itself, Django's own choice of driver.
    DATABASES = {"default": _database(os.environ["PROLETARIAN_TEST_MYSQL_DSN"], "django.db.backends.mysql")}
else:
    DATABASES = {"default": _database(os.environ["PROLETARIAN_TEST_PG_DSN"], "django.db.backends.postgresql")}

SECRET_KEY = "proletarian-ref-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["proletarian_ref.integrations.django", "shop"]
TASKS = {
    "default": {
        "BACKEND": "proletarian_ref.integrations.django.ProletarianBackend",
        "QUEUES": ["default", "mail"],
        "OPTIONS": {
            "JOB_TABLE": f"proletarian.django_job_{SUFFIX}",
            "ARCHIVED_JOB_TABLE": f"proletarian.django_archived_job_{SUFFIX}",
        },
    }
}
