"""Where the time of one SQLite ``enqueue()`` goes: an in-process microbenchmark.

Times N single ``later_django.enqueue()`` calls in autocommit on a SQLite file
set up as benchmarks/sqlite/ does (WAL, synchronous=NORMAL, IMMEDIATE
transactions, a persistent connection), beside the parts of its cost:

    enqueue      later_django.enqueue(Noop(...)), the whole call
    build        JobBuilder().build(): checks, encoding, id (no database)
    raw          later's exact INSERT through a sqlite3 connection of its own,
                 in autocommit: the stage counter trigger and the indexes
    bare         the same INSERT into a copy of later_job without triggers
                 and indexes: SQLite's floor for this row
    huey         huey's SqliteHuey task call, when huey is installed
    huey_sql     huey's statements alone (BEGIN EXCLUSIVE, its INSERT, COMMIT) on
                 its table and index, with a message of its size

Variants run in turns, several rounds, each round emptying the tables, and
the medians are printed (the machine's noise moves them less than means):

    python benchmarks/sqlite_enqueue.py [--n 5000] [--rounds 5] [--only enqueue,huey]
    python benchmarks/sqlite_enqueue.py --profile   # cProfile of enqueue, top 25

Only figures from one run compare.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
TMP = tempfile.mkdtemp(prefix="later-enqueue-bench-")
DB_PATH = os.path.join(TMP, "jobs.sqlite3")
PRAGMAS = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.configure(
    SECRET_KEY="bench-only",
    USE_TZ=True,
    INSTALLED_APPS=["later_django"],
    DATABASES={
        # As benchmarks/sqlite/common/sqlitebench.py.
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DB_PATH,
            "CONN_MAX_AGE": 600,
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": PRAGMAS},
        }
    },
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    LATER={"WORKERS": 8},
)
django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

import later_django  # noqa: E402
from later_django import job  # noqa: E402
from later_django.builder import JobBuilder  # noqa: E402
from later_django.options import EnqueueOptions  # noqa: E402
from later_django.types import NewJob  # noqa: E402


@dataclass
class Noop:
    n: int
    t: float


@job
async def noop(ctx: later_django.JobContext, payload: Noop) -> None:
    pass


def setup_database() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("later_migrate", verbosity=0)


def raw_connection() -> sqlite3.Connection:
    conn = sqlite3.connect(DB_PATH, timeout=20, isolation_level=None)
    conn.executescript(PRAGMAS)
    return conn


def insert_statement() -> str:
    """The statement one enqueue() runs, as Django's query log records it."""
    with CaptureQueriesContext(connection):
        later_django.enqueue(Noop(n=0, t=0.0))
    (insert,) = [q["sql"] for q in connection.queries if "INSERT INTO later_job" in q["sql"]]
    return str(insert)


def insert_params(job: NewJob, sql: str) -> list[object]:
    """The parameters of ``sql`` for ``job``: its first six fields, then
    (the statement of a job that may be delayed) its due time and delay."""
    return [*job[:6], job.run_at_ms, job.delay_ms][: sql.count("?")]


def make_bare_table(conn: sqlite3.Connection) -> None:
    # The same columns and constraint, without the indexes and the counter trigger.
    (sql,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'later_job'"
    ).fetchone()
    conn.execute("DROP TABLE IF EXISTS later_job_bare")
    conn.execute(sql.replace('"later_job"', "later_job_bare", 1))


def variants(n: int) -> dict[str, tuple[Callable[[], None], Callable[[], None]]]:
    """name -> (run n calls, empty the tables afterwards)."""
    raw = raw_connection()
    make_bare_table(raw)
    insert = insert_statement()
    raw.execute("DELETE FROM later_job")
    bare_insert = insert.replace("INSERT INTO later_job ", "INSERT INTO later_job_bare ", 1)
    assert bare_insert != insert
    options = EnqueueOptions()

    def params() -> list[list[object]]:
        builder = JobBuilder()
        return [insert_params(builder.build(Noop(n=i, t=0.0), options), insert) for i in range(n)]

    def clear_jobs() -> None:
        raw.execute("DELETE FROM later_job")  # the triggers keep the counters right

    def run_enqueue() -> None:
        enqueue = later_django.enqueue
        for i in range(n):
            enqueue(Noop(n=i, t=0.0))

    def run_build() -> None:
        for i in range(n):
            JobBuilder().build(Noop(n=i, t=0.0), options)

    def run_sql(sql: str) -> Callable[[], None]:
        def run() -> None:
            rows = params()
            execute = raw.execute
            started = time.perf_counter()
            for row in rows:
                execute(sql, row).fetchone()
            # Only the statements count: the parameters were built beforehand.
            timings["_sql_seconds"] = time.perf_counter() - started

        return run

    out: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "enqueue": (run_enqueue, clear_jobs),
        "build": (run_build, lambda: None),
        "raw": (run_sql(insert), clear_jobs),
        "bare": (run_sql(bare_insert), lambda: raw.execute("DELETE FROM later_job_bare")),
    }
    try:
        from huey import SqliteHuey
    except ImportError:
        return out

    huey = SqliteHuey("bench", filename=os.path.join(TMP, "huey.sqlite3"))
    huey.storage.conn.execute("PRAGMA synchronous=NORMAL")

    @huey.task()
    def huey_noop(n: int, t: float) -> None:
        pass

    def run_huey() -> None:
        for i in range(n):
            huey_noop(i, 0.0)

    out["huey"] = (run_huey, huey.flush)

    conn = huey.storage.conn
    message = huey.serialize_task(huey_noop.s(0, 0.0))

    def run_huey_sql() -> None:
        execute = conn.execute
        for _ in range(n):
            execute("begin exclusive")
            execute(
                "insert into task (queue, data, priority) values (?, ?, ?)",
                ("bench", message, 0),
            )
            execute("commit")

    out["huey_sql"] = (run_huey_sql, huey.flush)
    return out


timings: dict[str, float] = {}


def measure(n: int, rounds: int, only: list[str] | None) -> None:
    runs = variants(n)
    names = [name for name in runs if not only or name in only]
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            run, clear = runs[name]
            timings.pop("_sql_seconds", None)
            started = time.perf_counter()
            run()
            seconds = timings.get("_sql_seconds", time.perf_counter() - started)
            per_call[name].append(seconds / n * 1e6)
            clear()
    print(f"N={n} calls, {rounds} rounds, medians (min..max) of µs per call:")
    for name in names:
        values = per_call[name]
        median = statistics.median(values)
        print(
            f"  {name:8} {median:7.1f} µs  {1e6 / median:9,.0f}/s  "
            f"({min(values):.1f}..{max(values):.1f})"
        )


def profile(n: int) -> None:
    runs = variants(n)
    run, clear = runs["enqueue"]
    run()  # warm
    clear()
    profiler = cProfile.Profile()
    profiler.runcall(run)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated variant names")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    setup_database()
    if args.profile:
        profile(args.n)
    else:
        measure(args.n, args.rounds, [v for v in args.only.split(",") if v] or None)


if __name__ == "__main__":
    main()
