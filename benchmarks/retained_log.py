"""Retained-log throughput on SQLite and PostgreSQL: appends one per
transaction, appends in batches (append_many), and reads by offset.

    python benchmarks/retained_log.py            # both databases
    BENCH_LOG_SINGLE=5000 BENCH_LOG_BATCHED=100000 python benchmarks/retained_log.py

SQLite is a WAL file in a temporary folder (synchronous=NORMAL, like the test
settings). PostgreSQL is LATER_TEST_POSTGRES_URL, or a throwaway server that
tests/pgserver.py starts (fsync off: the figures are the CPU and round-trip
cost, not the disk's). One process, one connection: the figures are what a
single appender or reader gets, on a machine other work shares.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SINGLE = int(os.environ.get("BENCH_LOG_SINGLE", "3000"))
BATCHED = int(os.environ.get("BENCH_LOG_BATCHED", "50000"))
BATCH = int(os.environ.get("BENCH_LOG_BATCH", "500"))
READ_PAGE = 1000
PARTITIONS = 4
VALUE = b"x" * 100  # a small event


def configure(folder: str) -> list[str]:
    from tests.pgserver import database_settings, ensure_postgres_url

    databases: dict[str, dict[str, object]] = {
        "sqlite": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(folder, "bench.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
    url = ensure_postgres_url()
    if url:
        databases["postgresql"] = database_settings(url)
    settings.configure(
        DATABASES={"default": databases["sqlite"], **databases},
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "later_django"],
        USE_TZ=True,
        LATER={"DATABASE": "sqlite"},
    )
    django.setup()
    return [alias for alias in ("sqlite", "postgresql") if alias in databases]


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>10,.0f}/s"


def run(alias: str) -> list[str]:
    from django.core.management import call_command
    from django.db import connections
    from django.test.utils import override_settings

    from later_django import retained_log as log

    call_command("migrate", "later_django", database=alias, verbosity=0)
    with connections[alias].cursor() as cursor:
        for table in ("later_log_record", "later_log_partition", "later_log_topic"):
            cursor.execute(f"DELETE FROM {table}")
    rows = []
    with override_settings(LATER={"DATABASE": alias}):
        log.register_topic("bench", partitions=PARTITIONS)

        start = time.perf_counter()
        for n in range(SINGLE):
            log.append("bench", key=f"key-{n}", value=VALUE)
        single = time.perf_counter() - start
        rows.append(f"  append, one per transaction ({SINGLE:,})   {rate(SINGLE, single)}")

        pairs = [(f"key-{n}", VALUE) for n in range(BATCHED)]
        start = time.perf_counter()
        for first in range(0, BATCHED, BATCH):
            log.append_many("bench", pairs[first : first + BATCH])
        batched = time.perf_counter() - start
        rows.append(f"  append_many, {BATCH} per call ({BATCHED:,})  {rate(BATCHED, batched)}")

        total = 0
        start = time.perf_counter()
        for partition in range(PARTITIONS):
            offset = 0
            while page := log.read("bench", partition, offset, READ_PAGE):
                offset = page[-1].offset + 1
                total += len(page)
        reading = time.perf_counter() - start
        assert total == SINGLE + BATCHED, (total, SINGLE + BATCHED)
        rows.append(f"  read, {READ_PAGE} per call ({total:,})        {rate(total, reading)}")
    connections[alias].close()
    return rows


def main() -> None:
    folder = tempfile.mkdtemp(prefix="later-bench-log-")
    try:
        aliases = configure(folder)
        print(f"retained log, {PARTITIONS} partitions, {len(VALUE)}-byte values")
        for alias in aliases:
            print(alias)
            for row in run(alias):
                print(row)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
