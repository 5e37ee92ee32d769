"""Django settings of a chaos run, for the runner and its worker processes.

The runner exports, before it starts anything:

- ``CHAOS_DB``: ``sqlite`` or ``postgres``;
- ``CHAOS_SQLITE_PATH``: the run's own SQLite file (sqlite);
- ``CHAOS_PG_URL``: the throwaway server's database (postgres);
- ``CHAOS_RECORD_DIR``: where handlers append one line per run;
- ``CHAOS_ROLE``: ``runner`` or ``worker`` (PostgreSQL ``application_name``,
  so a fault can terminate the workers' connections only).

Timings are short so that a killed or paused process's jobs are recovered
within seconds. Database faults (a PostgreSQL restart, a SQLite lock) are
kept shorter than LEASE_DURATION + STUCK_JOB_GRACE, the window a running
job's owner has to renew its lease; pauses are longer, on purpose.
"""

from __future__ import annotations

import os
from datetime import timedelta

from tests.chaos.topics import ORDERED_PARTITIONS, ORDERED_TOPIC
from tests.pgserver import database_settings

SECRET_KEY = "later-chaos"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "later_django",
    "tests.chaos.app",
]

ROLE = os.environ.get("CHAOS_ROLE", "runner")
DB = os.environ.get("CHAOS_DB", "sqlite")

if DB == "postgres":
    _pg = database_settings(os.environ["CHAOS_PG_URL"])
    _pg.pop("TEST", None)
    _pg["OPTIONS"] = {"application_name": f"later-chaos-{ROLE}"}
    DATABASES = {"default": _pg}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("CHAOS_SQLITE_PATH", "/tmp/later-chaos.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                # Longer than any lock fault: writers wait instead of failing.
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

LEASE_DURATION = 3.0
STUCK_JOB_GRACE = 1.0


LATER = {
    "DATABASE": "default",
    "WORKERS": int(os.environ.get("CHAOS_WORKERS", "4")),
    "LEASE_DURATION": timedelta(seconds=LEASE_DURATION),
    "STUCK_JOB_GRACE": timedelta(seconds=STUCK_JOB_GRACE),
    "MAINTENANCE_INTERVAL": timedelta(milliseconds=300),
    "POLL_INTERVAL": timedelta(milliseconds=50),
    "SUPERVISOR_INTERVAL": timedelta(seconds=1),
    "HUNG_WORKER_THRESHOLD": timedelta(seconds=4),
    "SHUTDOWN_TIMEOUT": timedelta(seconds=3),
    "DASHBOARD_RETENTION": timedelta(days=1),
    # Registered in every process, the producer's and the workers'.
    "TOPICS": {ORDERED_TOPIC: ORDERED_PARTITIONS},
    # As short as the job lease: a killed or paused process's partitions
    # move to a live server within seconds, not the defaults' half minute.
    # The TTL outlasts a database fault (a lock of up to 2.5 s), so a fault
    # alone does not make every server look dead.
    "PARTITION_LEASE_DURATION": timedelta(seconds=LEASE_DURATION),
    "PARTITION_HEARTBEAT_TTL": timedelta(seconds=4),
    "PARTITION_HEARTBEAT_INTERVAL": timedelta(milliseconds=500),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
}
