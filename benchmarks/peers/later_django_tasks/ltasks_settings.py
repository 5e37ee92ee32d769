"""Django settings for measuring later_django as a django.tasks backend."""

from __future__ import annotations

import os

from adapterbase import django_database

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["later_django"]
DATABASES = {"default": django_database(os.environ["BENCH_PG_DSN"])}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "later_django.tasks.LaterBackend"}}
LATER = {"WORKERS": 8}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "WARNING"},
    "loggers": {"later_django": {"level": "WARNING"}, "django.tasks": {"level": "WARNING"}},
}
