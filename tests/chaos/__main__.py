"""``python -m tests.chaos --db postgres|sqlite --profile ci|long``: run a workload
against a real database with several ``later_worker`` processes, inject faults,
print a report, and exit non-zero on any lost job or violation.

See docs/project/chaos.md for what is measured and how to read the report.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests.chaos import faults as faults_module
from tests.chaos.workload import PROFILES

EXIT_VIOLATION = 1
EXIT_ERROR = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--db", choices=["postgres", "sqlite"])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="ci")
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed")
    parser.add_argument(
        "--workers-processes", type=int, default=3, help="later_worker processes (default 3)"
    )
    parser.add_argument(
        "--workers", type=int, default=4, help="worker tasks per process (default 4)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="later_worker --processes of each worker process: a fault hits a parent and "
        "all its children at once (default 1)",
    )
    parser.add_argument("--jobs", type=int, default=None, help="override the profile's job count")
    parser.add_argument(
        "--load-seconds", type=float, default=None, help="override how long the producer enqueues"
    )
    parser.add_argument("--report-json", type=Path, default=None, help="write the report here")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="records, logs and the SQLite file (default: a new temp folder)",
    )
    parser.add_argument(
        "--reanalyse",
        type=Path,
        default=None,
        metavar="WORKDIR",
        help="print the report of a finished run again from its workdir",
    )
    args = parser.parse_args(argv)
    if args.reanalyse is None and args.db is None:
        parser.error("--db is required")
    if args.workers_processes < 2:
        parser.error("--workers-processes must be >= 2 (a fault needs survivors)")
    return args


def _pg_database(url: str) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE later_chaos")
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/later_chaos"))


def finish(state: dict[str, Any], workdir: Path, report_json: Path | None) -> dict[str, Any]:
    """Analyse a finished run, print the report and write it as JSON."""
    from tests.chaos.records import read_runs
    from tests.chaos.report import analyse, render, write_logs_tail

    result = analyse(runs=read_runs(workdir / "records"), **state)
    result["workdir"] = str(workdir)
    write_logs_tail(state["lives"], workdir / "workers.log")
    print(render(result, state["times"]["start"]), flush=True)
    json_path = report_json or workdir / "report.json"
    json_path.write_text(json.dumps(result, indent=2, default=str))
    print(f"report: {json_path}; worker logs: {workdir / 'workers.log'}", flush=True)
    return result


def reanalyse(workdir: Path, report_json: Path | None) -> int:
    with open(workdir / "state.pickle", "rb") as fh:
        saved = pickle.load(fh)
    result = finish(saved["state"], workdir, report_json)
    return 0 if result["passed"] else EXIT_VIOLATION


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reanalyse is not None:
        return reanalyse(args.reanalyse, args.report_json)
    profile = PROFILES[args.profile]
    if args.jobs is not None:
        profile.jobs = args.jobs
    if args.load_seconds is not None:
        profile.load_seconds = args.load_seconds
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"later-chaos-{args.db}-"))
    record_dir, log_dir = workdir / "records", workdir / "logs"
    record_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"later chaos: db={args.db} profile={profile.name} seed={seed} workdir={workdir}",
        flush=True,
    )

    db = faults_module.Database(vendor=args.db)
    pg: tuple[str, str | None] | None = None
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
        "CHAOS_DB": args.db,
        "CHAOS_RECORD_DIR": str(record_dir),
        "CHAOS_WORKERS": str(args.workers),
        "CHAOS_ROLE": "runner",
    }
    from tests.pgserver import start_server, stop_server

    if args.db == "postgres":
        url, data, user = start_server()
        pg = (data, user)
        db.pg_url, db.pg_data, db.pg_user = _pg_database(url), data, user
        env["CHAOS_PG_URL"] = db.pg_url
    else:
        db.sqlite_path = str(workdir / "chaos.sqlite3")
        env["CHAOS_SQLITE_PATH"] = db.sqlite_path
    os.environ.update(env)

    pool = None
    host_clock = None
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        import later_django as later
        from later_django.conf import conf
        from tests.chaos import settings as chaos_settings
        from tests.chaos.procs import WorkerPool
        from tests.chaos.report import Row
        from tests.chaos.stalls import HostClock
        from tests.chaos.workload import OccurrenceWatcher, Plan, Producer

        call_command("later_migrate", verbosity=0)
        lease, grace = chaos_settings.LEASE_DURATION, chaos_settings.STUCK_JOB_GRACE

        def query(sql: str) -> list[tuple[Any, ...]]:
            for attempt in range(60):
                try:
                    with connections["default"].cursor() as cursor:
                        cursor.execute(sql)
                        return list(cursor.fetchall())
                except Exception:
                    if attempt == 59:
                        raise
                    connections["default"].close()
                    time.sleep(0.5)
            raise AssertionError("unreachable")

        pool = WorkerPool(
            args.workers_processes, args.workers, dict(os.environ), log_dir, args.processes
        )
        host_clock = HostClock(workdir / "host-stalls.txt")
        host_clock.start()
        pool.start_all()
        deadline = time.monotonic() + 90
        # One server per process, or per child with --processes.
        want = pool.count * args.processes
        while len(query("SELECT pid FROM later_server")) < want:
            if pool.check_exits() or time.monotonic() > deadline:
                raise RuntimeError("worker processes did not start; see " + str(log_dir))
            time.sleep(0.2)

        rng = random.Random(seed)
        plan = Plan()
        producer = Producer(plan, profile, random.Random(rng.random()))
        stop = threading.Event()
        t_start = time.time()
        faults_module.T0[0] = t_start
        hangs = [producer.enqueue_hang(i) for i in range(profile.hangs)]
        watcher = OccurrenceWatcher()
        watcher.start()
        schedules = producer.register_recurring()
        for schedule in schedules:
            print(f"  recurring {schedule.identifier!r} ({schedule.cron}) registered", flush=True)
        injector = faults_module.FaultInjector(
            db=db,
            pool=pool,
            plan=plan,
            rng=random.Random(rng.random()),
            record_dir=record_dir,
            lease=lease,
            grace=grace,
            gap=profile.fault_gap,
            hang_ids=[str(h.job_id) for h in hangs],
        )
        load_start = time.time()
        load_end_planned = load_start + profile.load_seconds
        fault_thread = threading.Thread(
            target=injector.run,
            args=(load_end_planned - 8, stop),
            name="chaos-faults",
            daemon=True,
        )

        def monitor() -> None:
            while not stop.wait(15 if profile.name == "long" else 10):
                try:
                    counts = later.stage_counts()
                except Exception as exc:
                    counts = {"error": str(exc).splitlines()[0]}
                finally:
                    connections["default"].close()
                print(
                    f"  +{time.time() - t_start:6.1f}s planned {len(plan.jobs)} {counts}",
                    flush=True,
                )

        threading.Thread(target=monitor, name="chaos-monitor", daemon=True).start()
        time.sleep(1.0)
        fault_thread.start()
        producer.produce(profile.load_seconds, threading.Event())
        load_end = time.time()
        fault_thread.join()
        # No fault runs any more: the schedules stop before the drain, which
        # then waits for their last occurrences too.
        producer.remove_recurring(schedules)
        print(f"  recurring schedules removed at +{time.time() - t_start:.1f}s", flush=True)
        print(
            f"  load done at +{load_end - t_start:.1f}s: {len(plan.jobs)} jobs; draining",
            flush=True,
        )

        hang_ids = {str(h.job_id) for h in hangs}
        drain_deadline = time.time() + profile.drain_seconds
        while True:
            pending = {
                r[0]
                for r in query(
                    "SELECT id FROM later_job WHERE stage NOT IN ('success', 'failed', 'cancelled')"
                )
            } - hang_ids
            if not pending or time.time() > drain_deadline:
                break
            time.sleep(0.5)
        drained = time.time()
        stop.set()
        pool.check_exits()  # a process that exited by itself is a violation in the report
        forced = pool.stop_all()
        watcher.finish()
        host_stalls = host_clock.stop()
        end = time.time()
        print(
            f"  drained at +{drained - t_start:.1f}s ({len(pending)} pending); workers stopped",
            flush=True,
        )

        rows = {
            r[0]: Row(
                id=r[0],
                type_name=r[1],
                stage=r[2],
                attempts=int(r[3]),
                payload=bytes(r[4]),
                last_error=r[5],
                parent_id=r[6],
                history=r[7],
                recurring=r[8],
                run_at_ms=int(r[9]),
                started_ms=None if r[10] is None else int(r[10]),
                topic=r[11],
                partition=None if r[12] is None else int(r[12]),
                sequence=None if r[13] is None else int(r[13]),
            )
            for r in query(
                "SELECT id, type_name, stage, attempts, payload, last_error, parent_id, history, "
                "recurring, run_at_ms, started_ms, topic, partition, sequence FROM later_job"
            )
        }
        state = {
            "vendor": args.db,
            "profile": profile.name,
            "seed": seed,
            "processes": args.workers_processes,
            "processes_each": args.processes,
            "workers": args.workers,
            "plan": plan,
            "rows": rows,
            "faults": injector.events,
            "host_stalls": host_stalls,
            "lives": pool.lives,
            "forced": forced,
            "times": {
                "start": t_start,
                "load_start": load_start,
                "load_end": load_end,
                "drained": drained,
                "end": end,
            },
            "producer": {
                "enqueue_errors": producer.enqueue_errors,
                "last_error": producer.last_error,
                "occurrence_watcher_errors": watcher.errors,
            },
            "lease": lease,
            "grace": grace,
            "injection_errors": injector.errors,
            "recurring": schedules,
            "fire_seen": watcher.fire_ms,
            "recurring_grace": conf.seconds("RECURRING_MISSED_GRACE"),
            "schedule_ahead": 2 * conf.seconds("MAINTENANCE_INTERVAL"),
        }
        # Kept so the report can be computed again: ``--reanalyse WORKDIR``.
        with open(workdir / "state.pickle", "wb") as fh:
            pickle.dump({"state": state}, fh)
        result = finish(state, workdir, args.report_json)
        return 0 if result["passed"] else EXIT_VIOLATION
    except Exception:
        import traceback

        traceback.print_exc()
        return EXIT_ERROR
    finally:
        if host_clock is not None:
            host_clock.stop()
        if pool is not None:
            pool.stop_all(timeout=10)
        if pg is not None:
            stop_server(*pg)


if __name__ == "__main__":
    sys.exit(main())
