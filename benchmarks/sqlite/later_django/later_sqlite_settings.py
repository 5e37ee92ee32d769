"""Django settings for measuring later_django on SQLite."""

from __future__ import annotations

from sqlitebench import django_database

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["later_django", "lbench"]
DATABASES = {"default": django_database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LATER = {"WORKERS": 8}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "WARNING"},
    "loggers": {"later_django": {"level": "WARNING"}},
}
