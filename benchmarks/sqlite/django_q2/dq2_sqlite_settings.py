"""Minimal Django settings for the django-q2 peer on SQLite (ORM broker)."""

from __future__ import annotations

import os

from sqlitebench import django_database

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_q"]
DATABASES = {"default": django_database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
Q_CLUSTER = {
    "name": "bench",
    "orm": "default",  # the Django ORM broker
    "workers": int(os.environ.get("BENCH_DQ2_WORKERS", "8")),
    # Keep every success row (as the other peers keep their job rows), so the
    # number of finished tasks can be counted in the database.
    "save_limit": 0,
    "log_level": "WARNING",
    "timeout": 60,
    "retry": 120,  # must exceed timeout
}
