"""The SQLite file a peer stores its jobs in, and the settings every peer opens it with.

run.sh gives each peer a fresh file in its temp folder (BENCH_SQLITE_PATH). All peers
run in WAL mode with the same ``synchronous`` level (BENCH_SQLITE_SYNCHRONOUS, default
NORMAL, the usual pairing with WAL), so commits cost the same fsyncs everywhere.
"""

from __future__ import annotations

import os

DB_PATH = os.environ.get("BENCH_SQLITE_PATH", "")
SYNCHRONOUS = os.environ.get("BENCH_SQLITE_SYNCHRONOUS", "NORMAL")


def django_database() -> dict[str, object]:
    """DATABASES["default"] for the peer's file, as a Django user would set it up."""
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DB_PATH,
        # Persistent connections, as in the PostgreSQL harness.
        "CONN_MAX_AGE": 600,
        "OPTIONS": {
            # Django >= 5.1: take the write lock at BEGIN, so a transaction never
            # fails half-way with "database is locked".
            "transaction_mode": "IMMEDIATE",
            # Seconds a writer waits for the lock (Python's default is 5).
            "timeout": 20,
            "init_command": f"PRAGMA journal_mode=WAL; PRAGMA synchronous={SYNCHRONOUS};",
        },
    }


def delete_all(*tables: str) -> None:
    """Empty these tables through Django's connection (SQLite has no TRUNCATE)."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"DELETE FROM {table}")
