"""Settings for the test suite: a SQLite database and a PostgreSQL database.

Every storage test runs once on each (see the ``later_db`` fixture). The
SQLite test database is a file so worker processes can open it too.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from datetime import timedelta

from tests.pgserver import database_settings, ensure_postgres_url

# A worker process started by a test may run with its wall clock off by
# LATER_TEST_CLOCK_SKEW seconds, as on a host whose clock is wrong:
# time.time() and time.time_ns() lie, the monotonic clock does not.
if os.environ.get("LATER_TEST_CLOCK_SKEW"):
    import time as _time

    _skew_ns = int(float(os.environ["LATER_TEST_CLOCK_SKEW"]) * 1e9)
    _real_time_ns = _time.time_ns
    _time.time_ns = lambda: _real_time_ns() + _skew_ns
    _time.time = lambda: (_real_time_ns() + _skew_ns) / 1e9

SECRET_KEY = "later-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    # The live server of the browser tests serves the admin's and later's static files.
    "django.contrib.staticfiles",
    "later_django",
    "tests.jobapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

_sqlite_dir = os.environ.get("LATER_TEST_SQLITE_DIR", "")
if not _sqlite_dir:
    # Child processes inherit the folder through the environment; the process
    # that made it removes it when it exits.
    _sqlite_dir = os.environ["LATER_TEST_SQLITE_DIR"] = tempfile.mkdtemp(
        prefix="later-test-sqlite-"
    )
    atexit.register(shutil.rmtree, _sqlite_dir, ignore_errors=True)

DATABASES: dict[str, dict[str, object]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_sqlite_dir, "main.sqlite3"),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        "TEST": {"NAME": os.path.join(_sqlite_dir, "test.sqlite3")},
    },
}

_pg_url = ensure_postgres_url()
if _pg_url:
    DATABASES["pg"] = database_settings(_pg_url)

if os.environ.get("LATER_TEST_USE_TEST_DB"):
    # A worker process started by a test: open the test databases.
    for _db in DATABASES.values():
        _db["NAME"] = _db["TEST"]["NAME"]  # type: ignore[index]

LATER = {
    "DATABASE": os.environ.get("LATER_TEST_ALIAS", "default"),
    "MAINTENANCE_INTERVAL": timedelta(milliseconds=200),
    "POLL_INTERVAL": timedelta(milliseconds=50),
}

# Worker processes started by a test read this file, not the test's settings
# fixture: LATER_TEST_TIMINGS='{"LEASE_DURATION": 1}' shortens their timings
# (seconds, merged into LATER as timedeltas).
if os.environ.get("LATER_TEST_TIMINGS"):
    LATER.update(
        {
            key: timedelta(seconds=float(value))
            for key, value in json.loads(os.environ["LATER_TEST_TIMINGS"]).items()
        }
    )

# A worker process started by a test may point LATER's database elsewhere:
# LATER_TEST_DB_OVERRIDE='{"NAME": "/tmp/x.sqlite3"}' is merged into it.
if os.environ.get("LATER_TEST_DB_OVERRIDE"):
    DATABASES[str(LATER["DATABASE"])].update(json.loads(os.environ["LATER_TEST_DB_OVERRIDE"]))

# LATER_TEST_EXTRA_APPS="django_prometheus" adds installed apps to a child process.
if os.environ.get("LATER_TEST_EXTRA_APPS"):
    INSTALLED_APPS += os.environ["LATER_TEST_EXTRA_APPS"].split(",")

# LATER_TEST_SETTINGS='{"CONTEXT": "x.y"}' is merged into LATER as it is.
if os.environ.get("LATER_TEST_SETTINGS"):
    LATER.update(json.loads(os.environ["LATER_TEST_SETTINGS"]))

# Django's Tasks API on later (tests/api/test_tasks.py): django.tasks on Django 6,
# the django_tasks backport (the "tasks" extra) on Django 5.2.
try:
    import django.tasks  # noqa: F401

    HAS_TASKS_API = True
except ImportError:
    try:
        import django_tasks  # noqa: F401

        INSTALLED_APPS.append("django_tasks")
        HAS_TASKS_API = True
    except ImportError:
        HAS_TASKS_API = False
if HAS_TASKS_API:
    TASKS = {"default": {"BACKEND": "later_django.tasks.LaterBackend"}}
