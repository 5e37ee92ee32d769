"""The dashboard's cost at a backlog of a million jobs: every page and JSON
endpoint timed through Django's test client, and the plan of every query
it runs on later's tables.

    python benchmarks/dashboard.py --db sqlite
    python benchmarks/dashboard.py --db postgres --plans /tmp/dash/plans.md
    python benchmarks/dashboard.py --db sqlite --queued 100000 --finished 10000  # quick

Seeds 1,000,000 ready plain jobs and 100,000 finished ones (mostly
successes, some failures and cancellations, expiring DASHBOARD_RETENTION
after their finish), delayed, requeued, waiting and running jobs, a topic
"ordered" of 16 partitions (LATER["TOPICS"]) with finished and unfinished
jobs, 20 recurring schedules, a retained-log topic with two consumer groups,
four live servers, a week of per-minute backlog samples and five minutes of
per-second server figures. Job rows go in with COPY (PostgreSQL) or
executemany (SQLite), 100,000 a transaction, through later_job's counter
triggers: at the end ``stage_counts()`` must equal a count of the rows.
Ids come from later_django.ids, in creation order.

Each endpoint is requested by a logged-in superuser: warmed up, then timed
--requests times (median and max, ms). Django's cache is cleared before
every timed request, so the overview (cached for a second, and read by the
job list for its stage counts) is computed each time; rows marked "cached"
are the same requests with the cache warm. With --plans, the EXPLAIN of
every statement on later's tables goes into a markdown file (a section per
database; the other database's section is kept), and any full scan of
later_job is reported.

SQLite is a WAL file in --dir (a temp folder under /tmp by default, removed
at exit unless --keep; --reuse skips seeding when the file is already
seeded); no ANALYZE is run, as later never runs one. PostgreSQL is
LATER_TEST_POSTGRES_URL or a throwaway server that tests/pgserver.py starts
(fsync off); after seeding, VACUUM ANALYZE brings it where autovacuum would.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOPIC = "ordered"
PARTITIONS = 16
PER_PARTITION = 1250  # jobs per partition: the first FINISHED_PER_PARTITION succeeded
FINISHED_PER_PARTITION = 1000
RUNNING_HEADS = 12  # partitions whose head is running
SERVERS = 4
WORKERS = 16
RUNNING_PLAIN = 64
SCHEDULES = 20
LOG_TOPIC = "events"
LOG_PARTITIONS = 4
LOG_RECORDS = 4000
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
MINUTE_MS = 60_000
WARM = 3
BUDGET_MS = 50.0
SORTED_ROWS = 1000  # PostgreSQL: a sort of a page's rows over more read rows is reported
CHUNK = 100_000  # job rows per transaction
DETAIL_CHILDREN = 30  # waiting continuations of the job whose detail page is timed
SAMPLE_RANGES = ("1h", "24h", "7d")

# Job types: (payload, weight per 10,000). DefaultPolicy is the rare type:
# one ready job in 10,000, so a page of its jobs looks at its whole stretch.
COMMON_TYPE = "tests.jobapp.jobs.Noop"
RARE_TYPE = "tests.jobapp.jobs.DefaultPolicy"

# Unfinished-stage counts besides the ready backlog, per million ready jobs.
DELAYED = 20_000
REQUEUED = 2_000
WAITING = 5_000

COLUMNS = (
    "id, namespace, type_name, payload, stage, priority, attempts, retry_policy, parent_id, "
    "created_ms, run_at_ms, changed_ms, started_ms, finished_ms, expires_ms, lease_owner, "
    "lease_expires_ms, last_error, history, topic, partition, sequence"
)
ERROR = (
    "Traceback (most recent call last):\n"
    '  File "later_django/worker/runner.py", line 212, in run\n'
    "    await handler(ctx, payload)\n"
    '  File "tests/jobapp/jobs.py", line 104, in run_flaky\n'
    '    raise RuntimeError(f"{payload.message} (attempt {ctx.attempt})")\n'
    "RuntimeError: flaky failure (attempt {n})\n"
)


def failure(attempt: int) -> str:
    return ERROR.replace("{n}", str(attempt))


# -- settings ----------------------------------------------------------------------------
def configure(db: str, folder: str) -> None:
    if db == "postgres":
        from tests.pgserver import database_settings, ensure_postgres_url

        url = ensure_postgres_url()
        if not url:
            sys.exit("no PostgreSQL server: set LATER_TEST_POSTGRES_URL or install initdb")
        database: dict[str, Any] = database_settings(url)
    else:
        database = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(folder, "dashboard.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    settings.configure(
        SECRET_KEY="later-bench",
        DEBUG=False,
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        ROOT_URLCONF="tests.urls",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        STATIC_URL="static/",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        DATABASES={"default": database},
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django.contrib.admin",
            "django.contrib.staticfiles",
            "later_django",
            "tests.jobapp",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
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
        ],
        LATER={
            "DATABASE": "default",
            "TOPICS": {TOPIC: PARTITIONS},
            "QUEUES": {"default": {}, "emails": {}},
        },
    )
    django.setup()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- seeding -----------------------------------------------------------------------------
class Seeder:
    """Builds every job row, in creation order, from one random seed."""

    def __init__(self, queued: int, finished: int, now: int) -> None:
        from later_django.builder import JobBuilder
        from later_django.options import EnqueueOptions
        from later_django.partitions.hashing import partition_for_key
        from tests.jobapp import jobs

        self.now = now
        self.rng = random.Random(20240601)
        plain = JobBuilder()
        options = EnqueueOptions()
        # One row template per type: its name, encoded payload and retry policy.
        weights = [
            (jobs.Noop(n=17), 5000),
            (jobs.Sleep(seconds=0.05, n=3), 2500),
            (jobs.Flaky(succeed_on=2), 1500),
            (jobs.AsyncNoop(n=9), 999),
            (jobs.DefaultPolicy(), 1),
        ]
        self.types: list[tuple[str, bytes, str | None]] = []
        for payload, weight in weights:
            job = plain.build(payload, options, job_id="0" * 26)
            self.types += [(job.type_name, job.payload, job.retry_policy)] * weight
        assert self.types[0][0] == COMMON_TYPE and self.types[-1][0] == RARE_TYPE
        self.priorities = [0] * 16 + [10, 10, -10, 50]
        # A key of each partition, and its job template.
        partitioned = JobBuilder(partitioned=True)
        self.partition_jobs: dict[int, tuple[str, bytes, str | None]] = {}
        n = 0
        while len(self.partition_jobs) < PARTITIONS:
            key = f"customer-{n}"
            p = partition_for_key(key, PARTITIONS)
            if p not in self.partition_jobs:
                job = partitioned.build(jobs.Ordered(key, n), options, job_id="0" * 26)
                self.partition_jobs[p] = (job.type_name, job.payload, job.retry_policy)
            n += 1
        self.servers = [f"bench-{i}-{1000 + i}-{i:06x}" for i in range(SERVERS)]
        self.topic_servers = self.servers[:2]
        self.counts = {
            "enqueued": queued,
            "success": finished * 90 // 100,
            "failed": finished * 6 // 100,
            "cancelled": finished - finished * 90 // 100 - finished * 6 // 100,
            "delayed": max(1, queued * DELAYED // 1_000_000),
            "requeued": max(1, queued * REQUEUED // 1_000_000),
            "waiting": max(DETAIL_CHILDREN + 1, queued * WAITING // 1_000_000),
            "running": RUNNING_PLAIN,
        }
        self.detail_parent: str | None = None
        self.detail_failed: str | None = None

    def _specs(self) -> list[tuple[int, str]]:
        """(created_ms, kind) of every job, oldest first."""
        now, r = self.now, self.rng.randint
        windows = {
            "enqueued": (now - 2 * HOUR_MS, now - 1000),
            "success": (now - 23 * HOUR_MS, now - 2 * HOUR_MS),
            "failed": (now - 23 * HOUR_MS, now - 2 * HOUR_MS),
            "cancelled": (now - 23 * HOUR_MS, now - 10 * MINUTE_MS),
            "delayed": (now - 2 * HOUR_MS, now),
            "requeued": (now - HOUR_MS, now - 5 * MINUTE_MS),
            # After the first hour of ready jobs: their parents exist by then.
            "waiting": (now - HOUR_MS, now),
            "running": (now - 10 * MINUTE_MS, now - MINUTE_MS),
        }
        specs = [
            (r(*windows[kind]), kind) for kind, count in self.counts.items() for _ in range(count)
        ]
        specs += [
            (r(now - 3 * HOUR_MS, now - 1000), "partition")
            for _ in range(PARTITIONS * PER_PARTITION)
        ]
        specs.sort()
        return specs

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Every job row, in creation order (ids increase with it)."""
        from later_django.ids import new_job_ids

        rng, now = self.rng, self.now
        retention = DAY_MS
        recent: list[str] = []  # ready jobs' ids, parents of continuations
        sequences = [0] * PARTITIONS
        partition_order = list(range(PARTITIONS)) * PER_PARTITION
        rng.shuffle(partition_order)
        children = 0
        ns = "default"
        for created, kind in self._specs():
            job_id = new_job_ids(1, created)[0]
            type_name, payload, policy = self.types[rng.randrange(10_000)]
            priority = 0
            if kind == "enqueued":
                priority = self.priorities[rng.randrange(20)]
                if len(recent) < 1000:
                    recent.append(job_id)
                else:
                    recent[rng.randrange(1000)] = job_id
                yield (
                    job_id, ns, type_name, payload, "enqueued", priority, 0, policy, None,
                    created, created, created, None, None, None, None, None, None,
                    f"enqueued@{created};", None, None, None,
                )  # fmt: skip
            elif kind in ("success", "failed"):
                attempts = 3 if kind == "failed" else (2 if rng.random() < 0.05 else 1)
                history, t = [f"enqueued@{created}"], created
                started = t
                for attempt in range(1, attempts + 1):
                    started = t + rng.randint(2, 2000)
                    t = started + rng.randint(1, 500)
                    history.append(f"running@{started}")
                    if attempt < attempts:
                        history.append(f"requeued@{t}")
                        t += 100
                        history.append(f"enqueued@{t}")
                history.append(f"{kind}@{t}")
                error = failure(attempts - 1 if kind == "success" else attempts)
                if kind == "failed" and self.detail_failed is None:
                    self.detail_failed = job_id
                yield (
                    job_id, ns, type_name, payload, kind, priority, attempts, policy, None,
                    created, created, t, started, t, t + retention, None, None,
                    error if attempts > 1 else None, ";".join(history) + ";", None, None, None,
                )  # fmt: skip
            elif kind == "cancelled":
                at = created + rng.randint(1000, 10 * MINUTE_MS)
                yield (
                    job_id, ns, type_name, payload, "cancelled", priority, 0, policy, None,
                    created, created, at, None, at, at + retention, None, None, None,
                    f"enqueued@{created};cancelled@{at};", None, None, None,
                )  # fmt: skip
            elif kind == "delayed":
                due = now + rng.randint(MINUTE_MS, 6 * HOUR_MS)
                yield (
                    job_id, ns, type_name, payload, "delayed", priority, 0, policy, None,
                    created, due, created, None, None, None, None, None, None,
                    f"delayed@{created};", None, None, None,
                )  # fmt: skip
            elif kind == "requeued":
                started = created + rng.randint(2, 2000)
                failed_at = started + rng.randint(1, 500)
                due = now + rng.randint(MINUTE_MS, HOUR_MS)
                yield (
                    job_id, ns, type_name, payload, "requeued", priority, 1, policy, None,
                    created, due, failed_at, started, None, None, None, None, failure(1),
                    f"enqueued@{created};running@{started};requeued@{failed_at};",
                    None, None, None,
                )  # fmt: skip
            elif kind == "waiting":
                if self.detail_parent is None:
                    self.detail_parent = recent[-1] if len(recent) < 1000 else recent[0]
                if children < DETAIL_CHILDREN:
                    parent = self.detail_parent
                    children += 1
                else:
                    parent = recent[rng.randrange(len(recent))]
                yield (
                    job_id, ns, type_name, payload, "waiting", priority, 0, policy, parent,
                    created, created, created, None, None, None, None, None, None,
                    f"waiting@{created};", None, None, None,
                )  # fmt: skip
            elif kind == "running":
                started = now - rng.randint(1000, 30_000)
                owner = self.servers[rng.randrange(SERVERS)]
                yield (
                    job_id, ns, type_name, payload, "running", priority, 1, policy, None,
                    created, created, started, started, None, None, owner, now + 30 * MINUTE_MS,
                    None, f"enqueued@{created};running@{started};", None, None, None,
                )  # fmt: skip
            else:  # a job of the topic, at the next sequence of its partition
                p = partition_order.pop()
                seq = sequences[p]
                sequences[p] += 1
                type_name, payload, policy = self.partition_jobs[p]
                if seq < FINISHED_PER_PARTITION:
                    started = created + rng.randint(2, 200)
                    done = started + rng.randint(1, 50)
                    yield (
                        job_id, ns, type_name, payload, "success", 0, 1, policy, None,
                        created, created, done, started, done, done + retention, None, None,
                        None, f"enqueued@{created};running@{started};success@{done};",
                        TOPIC, p, seq,
                    )  # fmt: skip
                elif seq == FINISHED_PER_PARTITION and p < RUNNING_HEADS:
                    started = now - rng.randint(1000, 20_000)
                    owner = self.topic_servers[p % 2]
                    yield (
                        job_id, ns, type_name, payload, "running", 0, 1, policy, None,
                        created, created, started, started, None, None, owner,
                        now + 30 * MINUTE_MS, None,
                        f"enqueued@{created};running@{started};", TOPIC, p, seq,
                    )  # fmt: skip
                else:
                    yield (
                        job_id, ns, type_name, payload, "enqueued", 0, 0, policy, None,
                        created, created, created, None, None, None, None, None, None,
                        f"enqueued@{created};", TOPIC, p, seq,
                    )  # fmt: skip


def chunks(rows: Iterable[tuple[Any, ...]], size: int) -> Iterator[list[tuple[Any, ...]]]:
    batch: list[tuple[Any, ...]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def insert_jobs(vendor: str, rows: Iterable[tuple[Any, ...]]) -> int:
    """Write the rows through later_job's triggers, CHUNK rows a transaction."""
    from django.db import connection, transaction

    connection.ensure_connection()
    raw = connection.connection
    if vendor == "sqlite":
        # A larger page cache while seeding only: the connection is closed
        # after it, and the timed requests run with the default.
        raw.execute("PRAGMA cache_size = -256000")
    written = 0
    for batch in chunks(rows, CHUNK):
        with transaction.atomic():
            if vendor == "postgresql":
                with raw.cursor() as cur, cur.copy(f"COPY later_job ({COLUMNS}) FROM STDIN") as cp:
                    for row in batch:
                        cp.write_row(row)
            else:
                marks = ", ".join(["?"] * len(COLUMNS.split(", ")))
                raw.executemany(f"INSERT INTO later_job ({COLUMNS}) VALUES ({marks})", batch)
        written += len(batch)
    connection.close()
    return written


def seed_rest(seeder: Seeder) -> None:
    """Everything but the job rows: servers, partitions and their
    sequences, samples, server figures, schedules and the retained log."""
    from django.db import connection, transaction

    import later_django as later
    from later_django import retained_log
    from later_django.dashboard.waits import Waits, encode
    from tests.jobapp.jobs import Noop, Sleep

    now, rng, topic_servers = seeder.now, seeder.rng, seeder.topic_servers
    with transaction.atomic(), connection.cursor() as c:
        c.executemany(
            "INSERT INTO later_server (id, namespace, hostname, pid, workers, started_ms, "
            "heartbeat_ms, topics) VALUES (%s, 'default', %s, %s, %s, %s, %s, %s)",
            [
                (sid, f"worker-{i}", 1000 + i, WORKERS, now - DAY_MS, now, sid in topic_servers)
                for i, sid in enumerate(seeder.servers)
            ],
        )
        c.executemany(
            "INSERT INTO later_partition_seq (namespace, topic, partition, next_seq) "
            "VALUES ('default', %s, %s, %s)",
            [(TOPIC, p, PER_PARTITION) for p in range(PARTITIONS)],
        )
        c.executemany(
            "INSERT INTO later_partition (namespace, topic, partition, owner, epoch, "
            "lease_expires_ms) VALUES ('default', %s, %s, %s, %s, %s)",
            [
                (TOPIC, p, seeder.topic_servers[p % 2], 1 + p % 3, now + HOUR_MS)
                for p in range(PARTITIONS)
            ],
        )
        # A week of per-minute backlog samples: a daily wave around the backlog.
        samples = []
        for k in range(7 * 24 * 60):
            wave = 0.5 + 0.5 * abs(((k % 1440) / 720.0) - 1.0)
            samples.append(
                (now - k * MINUTE_MS, int(seeder.counts["enqueued"] * wave) + rng.randint(0, 5000),
                 rng.randint(15_000, 25_000), rng.randint(40, 80), rng.randint(4000, 6000),
                 rng.randint(3000, 5000))
            )  # fmt: skip
        c.executemany(
            "INSERT INTO later_queue_sample (namespace, at_ms, ready, scheduled, running, "
            "waiting, partitioned) VALUES ('default', %s, %s, %s, %s, %s, %s)",
            samples,
        )
        stats = []
        for sid in seeder.servers:
            for second in range(300):
                regular, partition = Waits.empty(), Waits.empty()
                for _ in range(20):
                    regular.add(rng.randint(1, 400))
                for _ in range(5):
                    partition.add(rng.randint(1, 2000))
                stats.append(
                    (sid, now - second * 1000, 25, 22, 2, 1,
                     encode(regular.counts), regular.sum_ms, regular.max_ms,
                     encode(partition.counts), partition.sum_ms, partition.max_ms)
                )  # fmt: skip
        c.executemany(
            "INSERT INTO later_dashboard_stat (namespace, server_id, at_ms, started, succeeded, "
            "retried, failed, regular_waits, regular_sum_ms, regular_max_ms, partition_waits, "
            "partition_sum_ms, partition_max_ms) "
            "VALUES ('default', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            stats,
        )
    for n in range(SCHEDULES):
        payload = Noop(n=n) if n % 2 else Sleep(seconds=1.0, n=n)
        later.enqueue_recurring(f"report-{n:02d}", payload, f"{n % 60} */{1 + n % 6} * * *")
    retained_log.register_topic(LOG_TOPIC, partitions=LOG_PARTITIONS)
    retained_log.append_many(
        LOG_TOPIC, [(f"order-{n}", b'{"total": 1200}') for n in range(LOG_RECORDS)]
    )
    for group in ("billing", "audit"):
        for p in range(LOG_PARTITIONS):
            lease = retained_log.acquire(LOG_TOPIC, group=group, partition=p, member=f"{group}-1")
            assert lease is not None
            end = len(retained_log.read(LOG_TOPIC, p, 0, LOG_RECORDS))
            lease.commit(end if group == "audit" else end // 2)


def freshen() -> None:
    """Keep the servers live and the per-second figures recent: the
    overview shows servers with a heartbeat in the last 15 s, and rates and
    waits of the last minute and five. The figures are moved forward when
    the newest is 20 s old, and PostgreSQL vacuums their table then, as
    autovacuum would under a flush a second. Not timed."""
    from django.db import connection, transaction

    from later_django.db import dialect_for

    with transaction.atomic(), connection.cursor() as c:
        now = dialect_for("default").clock_now(c)
        c.execute("UPDATE later_server SET heartbeat_ms = %s", [now])
        c.execute("SELECT MAX(at_ms) FROM later_dashboard_stat")
        newest = c.fetchone()[0]
        moved = newest is not None and newest < now - 20_000
        if moved:
            c.execute("UPDATE later_dashboard_stat SET at_ms = at_ms + %s", [now - 500 - newest])
    if moved and connection.vendor == "postgresql":
        with connection.cursor() as c:
            c.execute("VACUUM later_dashboard_stat, later_server")


def count_check() -> tuple[dict[str, int], dict[str, int]]:
    from django.db import connection

    import later_django as later

    counters = {k: v for k, v in later.stage_counts().items() if v}
    with connection.cursor() as c:
        c.execute(
            "SELECT stage, COUNT(*) FROM later_job WHERE namespace = 'default' GROUP BY stage"
        )
        rows = {stage: int(n) for stage, n in c.fetchall()}
    return counters, rows


# -- timing ------------------------------------------------------------------------------
class Endpoint:
    def __init__(self, label: str, url: str, *, cached: bool = False) -> None:
        self.label, self.url, self.cached = label, url, cached


def jobs_in(response: Any) -> int | None:
    """Jobs a list response shows (None for other responses)."""
    if response["Content-Type"].startswith("application/json"):
        data = json.loads(response.content)
        return len(data["jobs"]) if "jobs" in data else None
    body = response.content.decode()
    if 'id="later-jobs"' not in body:
        return None
    return body.count("data-job-id=")


def get(client: Any, url: str) -> Any:
    response = client.get(url)
    if response.status_code != 200:
        sys.exit(f"GET {url}: {response.status_code} {response.content[:500]!r}")
    return response


def measure(client: Any, endpoint: Endpoint, requests: int) -> tuple[float, float]:
    from django.core.cache import cache

    for _ in range(WARM):
        get(client, endpoint.url)
    times = []
    for _ in range(requests):
        if not endpoint.cached:
            cache.clear()
        start = time.perf_counter()
        get(client, endpoint.url)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def capture(client: Any, endpoint: Endpoint) -> tuple[list[str], int | None]:
    """The SQL one request runs (the cache emptied first unless cached),
    and the jobs it lists."""
    from django.core.cache import cache
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if not endpoint.cached:
        cache.clear()
    with CaptureQueriesContext(connection) as ctx:
        response = get(client, endpoint.url)
    return [q["sql"] for q in ctx.captured_queries], jobs_in(response)


def endpoints(client: Any, seeder: Seeder) -> list[Endpoint]:
    """Every page and JSON endpoint, with the cursors and ids they need."""
    from django.db import connection

    base = "/admin/later/"
    stages = ["enqueued", "delayed", "waiting", "running", "requeued", "success", "failed"]
    stages.append("cancelled")

    def after(query: str, pages: int) -> str | None:
        """``query`` with the cursor of page ``pages + 1`` (None: no such page)."""
        cursor = None
        for _ in range(pages):
            url = f"{base}api/jobs?{query}" + (f"&after={cursor}" if cursor else "")
            cursor = json.loads(get(client, url).content)["next"]
            if not cursor:
                return None
        return f"{query}&after={cursor}"

    def paged(label: str, path: str, query: str, pages: int) -> Endpoint | None:
        found = after(query, pages)
        return None if found is None else Endpoint(label, f"{base}{path}?{found}")

    with connection.cursor() as c:
        c.execute(
            "SELECT id FROM later_job WHERE namespace = 'default' AND stage = 'enqueued' "
            "AND topic IS NULL ORDER BY id LIMIT 1 OFFSET %s",
            [seeder.counts["enqueued"] // 2],
        )
        middle = c.fetchone()[0]
    found: list[Endpoint | None] = [
        Endpoint("overview page", base),
        Endpoint("overview page (cached)", base, cached=True),
        *(Endpoint(f"jobs: {stage}", f"{base}jobs/?stage={stage}") for stage in stages),
        Endpoint("jobs: enqueued (overview cached)", f"{base}jobs/?stage=enqueued", cached=True),
        Endpoint("jobs: enqueued, common type", f"{base}jobs/?stage=enqueued&type={COMMON_TYPE}"),
        Endpoint("jobs: enqueued, rare type", f"{base}jobs/?stage=enqueued&type={RARE_TYPE}"),
        Endpoint("jobs: success, rare type", f"{base}jobs/?stage=success&type={RARE_TYPE}"),
        Endpoint("jobs: topic, enqueued", f"{base}jobs/?stage=enqueued&topic={TOPIC}"),
        Endpoint("jobs: topic, no stage", f"{base}jobs/?topic={TOPIC}"),
        Endpoint(
            "jobs: topic + partition", f"{base}jobs/?stage=enqueued&topic={TOPIC}&partition=13"
        ),
        Endpoint(
            "jobs: success, topic + partition",
            f"{base}jobs/?stage=success&topic={TOPIC}&partition=13",
        ),
        Endpoint("jobs: id prefix, 6 chars", f"{base}jobs/?q={middle[:6]}"),
        Endpoint("jobs: id prefix, 12 chars", f"{base}jobs/?q={middle[:12]}"),
        paged("jobs: enqueued, page 2", "jobs/", 'stage=enqueued', 1),
        paged("jobs: enqueued, page 21", "jobs/", 'stage=enqueued', 20),
        paged("jobs: success, page 2", "jobs/", 'stage=success', 1),
        paged("jobs: success, page 21", "jobs/", 'stage=success', 20),
        paged("jobs: delayed, page 21", "jobs/", 'stage=delayed', 20),
        paged("jobs: failed, page 21", "jobs/", 'stage=failed', 20),
        paged("jobs: rare type, page 2", "jobs/", f"stage=enqueued&type={RARE_TYPE}", 1),
        Endpoint("job detail (30 continuations)", f"{base}jobs/{seeder.detail_parent}/"),
        Endpoint("job detail (failed)", f"{base}jobs/{seeder.detail_failed}/"),
        Endpoint("topics page", f"{base}topics/"),
        Endpoint("recurring page", f"{base}recurring/"),
        Endpoint("queues page", f"{base}queues/"),
        Endpoint("jobs: enqueued, another queue", f"{base}jobs/?stage=enqueued&queue=emails"),
        Endpoint("api/overview", f"{base}api/overview"),
        Endpoint("api/overview (cached)", f"{base}api/overview", cached=True),
        *(Endpoint(f"api/samples {r}", f"{base}api/samples?range={r}") for r in SAMPLE_RANGES),
        Endpoint("api/jobs: enqueued", f"{base}api/jobs?stage=enqueued"),
        Endpoint("api/jobs: success", f"{base}api/jobs?stage=success"),
        Endpoint("api/jobs: rare type", f"{base}api/jobs?stage=enqueued&type={RARE_TYPE}"),
        paged("api/jobs: enqueued, page 21", "api/jobs", 'stage=enqueued', 20),
        Endpoint("api/jobs/<id>", f"{base}api/jobs/{seeder.detail_parent}"),
        Endpoint("api/topics", f"{base}api/topics"),
        Endpoint("api/recurring", f"{base}api/recurring"),
        Endpoint("api/queues", f"{base}api/queues"),
    ]  # fmt: skip
    return [e for e in found if e is not None]


# -- plans -------------------------------------------------------------------------------
LATER_TABLE = re.compile(r"\blater_\w+")
KEYWORDS = {"where", "on", "join", "left", "inner", "order", "group", "limit", "set", "as"}


def job_aliases(sql: str) -> set[str]:
    """The names later_job goes by in ``sql``."""
    names = {"later_job"}
    for alias in re.findall(r"\blater_job\s+(?:AS\s+)?(\w+)", sql, flags=re.IGNORECASE):
        if alias.lower() not in KEYWORDS:
            names.add(alias)
    return names


def explain(vendor: str, sql: str) -> tuple[list[str], list[str], list[str]]:
    """The plan of ``sql`` as text lines; the full scans of later_job in
    it; and its sorts of later_job's rows where a page of them was asked
    for (LIMIT): the index did not give them in the list's order, so every
    row that matched was read and sorted, however many there are."""
    from django.db import connection

    problems, sorts = [], []
    paged = "later_job" in sql and " LIMIT " in sql.upper()
    with connection.cursor() as c:
        if vendor == "postgresql":
            c.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
            lines = []
            skip = False
            for (line,) in c.fetchall():
                if line.startswith("Planning:"):
                    skip = True  # the planner's own buffers
                    continue
                if skip and line.startswith("  "):
                    continue
                skip = False
                lines.append(line)
            for n, line in enumerate(lines):
                if re.search(r"Seq Scan on later_job\b", line):
                    problems.append(line.strip())
                if paged and re.match(r"\s*(->\s+)?Sort\s+\(cost", line):
                    read = [
                        int(m.group(1))
                        for below in lines[n + 1 :]
                        if " on later_job" in below
                        and (m := re.search(r"actual time=\S+ rows=(\d+)", below))
                    ]
                    if read and max(read) > SORTED_ROWS:
                        sorts.append(f"Sort over {max(read)} rows of later_job")
        else:
            c.execute(f"EXPLAIN QUERY PLAN {sql}")
            rows = c.fetchall()
            depth = {0: -1}
            lines = []
            for node, parent, _, detail in rows:
                depth[node] = depth.get(parent, -1) + 1
                lines.append("  " * depth[node] + detail)
            aliases = job_aliases(sql)
            for line in lines:
                m = re.match(r"\s*SCAN (\w+)(.*)$", line)
                if m and m.group(1) in aliases and " USING " not in m.group(2):
                    problems.append(line.strip())
                if paged and line.strip() == "USE TEMP B-TREE FOR ORDER BY":
                    sorts.append(line.strip())
    return lines, problems, sorts


def run_time(sql: str) -> tuple[float, int]:
    """The median time of ``sql`` over five runs (execute and fetch), in
    ms, and the rows it returns."""
    from django.db import connection

    times = []
    with connection.cursor() as c:
        for _ in range(5):
            start = time.perf_counter()
            c.execute(sql)
            rows = len(c.fetchall())
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), rows


def shown(sql: str) -> str:
    """``sql`` on one line, a long list of ids cut short."""
    sql = re.sub(r"\s+", " ", sql).strip()
    return re.sub(
        r"IN \(('[0-9a-z]{26}'), (?:'[0-9a-z]{26}', )+('[0-9a-z]{26}')\)",
        lambda m: f"IN ({m.group(1)}, ... {m.group(0).count(',') + 1} ids ..., {m.group(2)})",
        sql,
    )


class Statement:
    def __init__(
        self, label: str, sql: str, ms: float, rows: int, problems: list[str], sorts: list[str]
    ) -> None:
        self.label, self.sql, self.ms, self.rows = label, sql, ms, rows
        self.problems, self.sorts = problems, sorts


def write_plans(
    path: str, vendor: str, title: str, total: int, captured: list[tuple[Endpoint, list[str]]]
) -> list[Statement]:
    """Write the plans' section of ``vendor`` into ``path`` (the other
    vendor's section stays); return every statement explained."""
    how = (
        "EXPLAIN (ANALYZE, BUFFERS) of each statement, without the planner's own buffers"
        if vendor == "postgresql"
        else "EXPLAIN QUERY PLAN of each statement"
    )
    out = [
        f"## {title}",
        "",
        f"{total:,} jobs. {how}; its time is the median of five runs (execute and fetch) "
        "from Python.",
        "",
    ]
    seen: dict[str, str] = {}
    statements: list[Statement] = []
    for endpoint, queries in captured:
        ours = [q for q in queries if LATER_TABLE.search(q) and q.lstrip()[:6].upper() == "SELECT"]
        if not ours:
            continue
        out += [f"### {endpoint.label}", "", f"`GET {endpoint.url}`", ""]
        for n, sql in enumerate(ours, 1):
            key = shown(sql)
            if key in seen:
                out += [f"{n}. the same statement as {seen[key]}", ""]
                continue
            seen[key] = f"{endpoint.label}, statement {n}"
            lines, problems, sorts = explain(vendor, sql)
            ms, rows = run_time(sql)
            statements.append(Statement(endpoint.label, key, ms, rows, problems, sorts))
            out += [f"{n}. {ms:.2f} ms, {rows} rows", "", "```sql", key, "```", "", "```"]
            out += [*lines, "```", ""]
            if problems:
                out += ["**A full scan of later_job.**", ""]
            if sorts:
                out += ["**A page of later_job's rows sorted, not read in index order.**", ""]
    section = "\n".join(out).rstrip() + "\n"
    sections: dict[str, str] = {}
    if os.path.exists(path):
        for part in re.split(r"(?m)^(?=## )", Path(path).read_text()):
            if part.startswith("## "):
                sections[part.splitlines()[0][3:]] = part.rstrip() + "\n"
    sections[title] = section
    head = (
        "# Dashboard query plans\n\nWritten by benchmarks/dashboard.py: every statement "
        "that the dashboard's requests run on later's tables, with its plan, at the "
        "seeded backlog.\n\n"
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    body = "\n".join(sections[k] for k in sorted(sections, reverse=True))
    Path(path).write_text(head + body)
    return statements


# -- main --------------------------------------------------------------------------------
def timed(step: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = step()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--queued", type=int, default=1_000_000, help="ready plain jobs")
    parser.add_argument("--finished", type=int, default=100_000, help="finished plain jobs")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per endpoint")
    parser.add_argument("--plans", help="write the plans into this markdown file")
    parser.add_argument("--dir", help="the SQLite file's folder (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep --dir at exit")
    parser.add_argument("--reuse", action="store_true", help="skip seeding when already seeded")
    args = parser.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="later-bench-dashboard-")
    os.makedirs(folder, exist_ok=True)
    try:
        run(args, folder)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def run(args: argparse.Namespace, folder: str) -> None:
    configure(args.db, folder)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    vendor = connection.vendor
    call_command("migrate", verbosity=0)
    call_command("later_migrate", verbosity=0)
    seeder = Seeder(args.queued, args.finished, now_ms())
    with connection.cursor() as c:
        c.execute("SELECT COUNT(*) FROM later_job")
        present = c.fetchone()[0]
    report = []
    if args.reuse and present:
        # The seed is deterministic but for the ids: find the two jobs again.
        with connection.cursor() as c:
            c.execute(
                "SELECT parent_id FROM later_job WHERE stage = 'waiting' GROUP BY parent_id "
                "HAVING COUNT(*) >= %s",
                [DETAIL_CHILDREN],
            )
            seeder.detail_parent = c.fetchone()[0]
            c.execute("SELECT MIN(id) FROM later_job WHERE stage = 'failed'")
            seeder.detail_failed = c.fetchone()[0]
        report.append(f"  reused the seeded database ({present:,} job rows)")
    else:
        with connection.cursor() as c:
            for table in (
                "later_job", "later_server", "later_partition", "later_partition_seq",
                "later_queue_sample", "later_dashboard_stat", "later_schedule",
                "later_log_consumer", "later_log_record", "later_log_partition",
                "later_log_topic",
            ):  # fmt: skip
                c.execute(f"DELETE FROM {table}")
        written, seconds = timed(lambda: insert_jobs(vendor, seeder.rows()))
        report.append(
            f"  seeding job rows: {written:,} in {seconds:.1f} s ({written / seconds:,.0f} rows/s, "
            f"{CHUNK:,} a transaction, {'COPY' if vendor == 'postgresql' else 'executemany'})"
        )
        _, seconds = timed(lambda: seed_rest(seeder))
        report.append(
            f"  seeding servers, partitions, samples, figures, schedules, retained log: "
            f"{seconds:.1f} s"
        )
        with connection.cursor() as c:
            if vendor == "postgresql":
                _, seconds = timed(lambda: c.execute("VACUUM ANALYZE"))
                report.append(f"  VACUUM ANALYZE: {seconds:.1f} s")
            else:
                _, seconds = timed(lambda: c.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
                report.append(f"  WAL checkpoint: {seconds:.1f} s")
    User = get_user_model()
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "bench@example.com", "bench"
    )
    client = Client()
    client.force_login(user)

    results = []
    captured: list[tuple[Endpoint, list[str]]] = []
    for endpoint in endpoints(client, seeder):
        freshen()
        queries, listed = capture(client, endpoint)
        captured.append((endpoint, queries))
        median, worst = measure(client, endpoint, args.requests)
        results.append((endpoint, median, worst, len(queries), listed))
    counters, rows = count_check()
    total = sum(rows.values())

    title = "PostgreSQL" if vendor == "postgresql" else "SQLite"
    print(f"later_django dashboard on {title}: {total:,} jobs")
    print("  " + ", ".join(f"{stage} {n:,}" for stage, n in sorted(rows.items())))
    for line in report:
        print(line)
    print(
        f"  stage_counts() equals COUNT(*) per stage: {'yes' if counters == rows else 'NO'}"
        + ("" if counters == rows else f" (counters {counters}, rows {rows})")
    )
    print(
        f"  {args.requests} requests each after {WARM} to warm up; the cache emptied before "
        "each unless cached"
    )
    print()
    width = max(len(e.label) for e, *_ in results)
    print(f"  {'endpoint':<{width}}  {'median ms':>9}  {'max ms':>7}  {'queries':>7}  {'jobs':>4}")
    slow = []
    for endpoint, median, worst, queries, listed in results:
        flag = ""
        if median > BUDGET_MS:
            flag = f"  over {BUDGET_MS:.0f} ms"
            slow.append(endpoint.label)
        elif worst > BUDGET_MS:
            flag = f"  max over {BUDGET_MS:.0f} ms"
        shown = "" if listed is None else str(listed)
        print(
            f"  {endpoint.label:<{width}}  {median:>9.1f}  {worst:>7.1f}  {queries:>7}  "
            f"{shown:>4}{flag}"
        )
    print()
    print(f"  median over {BUDGET_MS:.0f} ms: {', '.join(slow) if slow else 'none'}")
    if args.plans:
        statements = write_plans(args.plans, vendor, title, total, captured)
        print(f"  plans: {args.plans}")
        bad = [(st.label, p) for st in statements for p in st.problems]
        if bad:
            print("  full scans of later_job:")
            for label, line in bad:
                print(f"    {label}: {line}")
        else:
            print("  full scans of later_job: none")
        sorted_pages = [st for st in statements if st.sorts]
        print(
            "  pages of later_job sorted instead of read in index order: "
            + ("none" if not sorted_pages else "")
        )
        for st in sorted_pages:
            print(f"    {st.ms:6.1f} ms  {st.label}: {'; '.join(st.sorts)}: {st.sql[:70]}")
        print("  slowest statements (ms, rows; first endpoint that ran it):")
        for st in sorted(statements, key=lambda st: -st.ms)[:8]:
            print(f"    {st.ms:6.1f} {st.rows:>5}  {st.label}: {st.sql[:90]}")
    if counters != rows:
        sys.exit(1)


if __name__ == "__main__":
    main()
