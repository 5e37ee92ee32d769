"""Sequential partition mode: ordered throughput and idle latency.

    python benchmarks/partitions.py                    # PostgreSQL (the issue's figures)
    python benchmarks/partitions.py --db sqlite
    BENCH_PART_JOBS=200 python benchmarks/partitions.py  # jobs per key

Throughput: 64 keys over 16 partitions, 3 ``later_worker`` processes of 8
workers each; every job is a no-op ``Ordered`` (tests/jobapp/jobs.py), all
enqueued in one transaction while the workers are idle; the figure is jobs
finished per second from that commit to the last success. Latency: one
partition job at a time enqueued to idle workers; enqueue to handler start
is ``started_ms - created_ms`` of the job row (both the database's clock).
The same workers then run as many plain no-op jobs (``Noop``), enqueued the
same way, and as many plain jobs one at a time: the ratios compare the
ordered lane with what plain jobs get from the same servers.

PostgreSQL is LATER_TEST_POSTGRES_URL or a throwaway server that
tests/pgserver.py starts (fsync off); SQLite a WAL file in a temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEYS = int(os.environ.get("BENCH_PART_KEYS", "64"))
PARTITIONS = int(os.environ.get("BENCH_PART_PARTITIONS", "16"))
PER_KEY = int(os.environ.get("BENCH_PART_JOBS", "100"))
PROCESSES = int(os.environ.get("BENCH_PART_PROCESSES", "3"))
WORKERS = int(os.environ.get("BENCH_PART_WORKERS", "8"))
LATENCY_SAMPLES = int(os.environ.get("BENCH_PART_LATENCY", "50"))


def child_env(db: str, folder: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "LATER_TEST_SETTINGS": json.dumps({"TOPICS": {"ordered": PARTITIONS}}),
    }
    env.pop("LATER_TEST_RECORD", None)  # handlers record nothing
    if db == "postgres":
        from tests.pgserver import ensure_postgres_url

        url = ensure_postgres_url()
        if not url:
            sys.exit("no PostgreSQL server: set LATER_TEST_POSTGRES_URL or install initdb")
        env |= {"LATER_TEST_POSTGRES_URL": url, "LATER_TEST_ALIAS": "pg"}
    else:
        env |= {
            "LATER_TEST_ALIAS": "default",
            "LATER_TEST_DB_OVERRIDE": json.dumps({"NAME": os.path.join(folder, "bench.sqlite3")}),
        }
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="later-bench-partitions-")
    env = child_env(args.db, folder)
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections, transaction

    import later_django as later
    from later_django.conf import conf
    from tests.jobapp.jobs import Noop, Ordered

    alias = conf.database
    call_command("later_migrate", verbosity=0)
    with connections[alias].cursor() as cursor:
        for table in ("later_job", "later_partition_seq", "later_partition", "later_server"):
            cursor.execute(f"DELETE FROM {table}")

    def scalar(sql: str) -> int:
        with connections[alias].cursor() as cursor:
            cursor.execute(sql)
            return int(cursor.fetchone()[0])

    procs = []
    try:
        for n in range(PROCESSES):
            log = open(os.path.join(folder, f"worker-{n}.log"), "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "django", "later_worker", "--workers", str(WORKERS)],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )
        deadline = time.monotonic() + 60
        while scalar("SELECT count(*) FROM later_server WHERE topics") < PROCESSES:
            if time.monotonic() > deadline:
                sys.exit("the workers did not start: see " + folder)
            time.sleep(0.1)
        time.sleep(1.0)  # every server has seen the others (membership refresh)

        total = KEYS * PER_KEY

        def drain(enqueue_all: Any) -> float:
            done = scalar("SELECT count(*) FROM later_job WHERE stage = 'success'")
            with transaction.atomic(using=alias):
                enqueue_all()
            committed = time.perf_counter()
            while scalar("SELECT count(*) FROM later_job WHERE stage = 'success'") < done + total:
                time.sleep(0.02)
            return time.perf_counter() - committed

        def idle_latencies(payload: Any, enqueue: Any) -> list[float]:
            latencies = []
            for n in range(LATENCY_SAMPLES):
                job_id = enqueue(payload(n))
                while True:
                    info = later.get_job(job_id)
                    if info is not None and info.stage == "success":
                        break
                    time.sleep(0.002)
                latencies.append((info.started_at - info.created_at).total_seconds() * 1000)
                time.sleep(0.05)  # idle again
            return sorted(latencies)

        def ordered_all() -> None:
            for n in range(PER_KEY):
                for k in range(KEYS):
                    later.enqueue_to_partition_in(Ordered(f"key-{k}", n))

        elapsed = drain(ordered_all)
        latencies = idle_latencies(lambda n: Ordered("latency", n), later.enqueue_to_partition)
        plain_elapsed = drain(lambda: later.enqueue_many([Noop(n) for n in range(total)]))
        plain_latencies = idle_latencies(Noop, later.enqueue)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
        shutil.rmtree(folder, ignore_errors=True)

    print(f"later_django partitions on {args.db}")
    rate, plain_rate = total / elapsed, total / plain_elapsed
    print(
        f"  ordered throughput: {total} jobs, {KEYS} keys over {PARTITIONS} partitions, "
        f"{PROCESSES} processes x {WORKERS} workers: {rate:,.0f} jobs/s ({elapsed:.2f} s)"
    )
    print(
        f"  plain drain, the same servers: {plain_rate:,.0f} jobs/s ({plain_elapsed:.2f} s); "
        f"ordered / plain = {rate / plain_rate:.0%}"
    )
    for name, found in (("ordered", latencies), ("plain", plain_latencies)):
        p50, p95 = statistics.median(found), found[int(len(found) * 0.95) - 1]
        print(
            f"  idle enqueue->start, {LATENCY_SAMPLES} {name} jobs: p50 {p50:.1f} ms, "
            f"p95 {p95:.1f} ms, max {found[-1]:.1f} ms"
        )
    ratio = statistics.median(latencies) / max(statistics.median(plain_latencies), 0.1)
    print(f"  idle latency p50, ordered / plain = {ratio:.1f}x")


if __name__ == "__main__":
    main()
