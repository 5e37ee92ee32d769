"""Faults injected on a seeded schedule, each logged with its start and end.

Kinds (``ALL_KINDS``; PostgreSQL-only and SQLite-only ones are filtered):

- ``kill``: kill -9 of a worker process, then a new process in its slot;
- ``kill_hung_holder``: the same, aimed at the process running a hung handler;
- ``pause``: SIGSTOP of a worker process for longer than its lease, then SIGCONT;
- ``pg_restart``: ``pg_ctl restart -m fast`` as the server's OS user;
- ``pg_terminate``: ``pg_terminate_backend`` of every worker connection;
- ``corrupt``: a still-queued job's payload overwritten with bytes that do
  not decode (its expected outcome becomes failed);
- ``sqlite_lock``: another process holds ``BEGIN IMMEDIATE`` for seconds.

Handlers that raise and handlers that hang are part of the workload.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.chaos.procs import WorkerPool
from tests.chaos.records import read_runs
from tests.chaos.workload import FAILED, REASON_DECODE, Plan
from tests.pgserver import _pg_bin, _run_as

PG_ONLY = {"pg_restart", "pg_terminate"}
SQLITE_ONLY = {"sqlite_lock"}
PROCESS_FAULTS = {"kill", "kill_hung_holder", "pause"}
# Relative frequency of each kind after the first round (which has one of each).
WEIGHTS = {
    "kill": 4,
    "kill_hung_holder": 1,
    "pause": 3,
    "pg_restart": 2,
    "pg_terminate": 2,
    "corrupt": 2,
    "sqlite_lock": 3,
}
CORRUPT_BYTES = b"\xc1\xc1chaos"  # 0xc1 is never used by msgpack


@dataclass
class FaultEvent:
    index: int
    kind: str
    start: float
    end: float
    pid: int | None = None
    detail: str = ""
    ok: bool = True
    # SQLite: the paused process held the write lock, so nobody could write
    # (renew a lease, finish a job) for the whole pause.
    db_frozen: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Database:
    """How to reach (and hurt) the run's database."""

    vendor: str  # sqlite | postgres
    sqlite_path: str | None = None
    pg_url: str | None = None
    pg_data: str | None = None
    pg_user: str | None = None


def kinds_for(vendor: str) -> list[str]:
    excluded = SQLITE_ONLY if vendor == "postgres" else PG_ONLY
    return [kind for kind in WEIGHTS if kind not in excluded]


class FaultInjector:
    """Runs faults one after the other, with seeded random kinds, targets and gaps."""

    def __init__(
        self,
        *,
        db: Database,
        pool: WorkerPool,
        plan: Plan,
        rng: random.Random,
        record_dir: Path,
        lease: float,
        grace: float,
        gap: tuple[float, float],
        hang_ids: list[str],
    ) -> None:
        self.db = db
        self.pool = pool
        self.plan = plan
        self.rng = rng
        self.record_dir = record_dir
        self.lease = lease
        self.grace = grace
        self.gap = gap
        self.hang_ids = set(hang_ids)
        self.events: list[FaultEvent] = []
        self.kinds = kinds_for(db.vendor)
        self.errors: list[str] = []

    # -- the schedule --------------------------------------------------------------
    def next_kinds(self) -> list[str]:
        first = list(self.kinds)
        self.rng.shuffle(first)
        return first

    def run(self, until: float, stop: threading.Event) -> None:
        """Inject faults until the wall-clock time ``until`` (no fault starts later)."""
        queue = self.next_kinds()
        weights = [WEIGHTS[k] for k in self.kinds]
        while not stop.is_set():
            if stop.wait(self.rng.uniform(*self.gap)):
                return
            if time.time() >= until:
                return
            self.pool.check_exits()
            kind = queue.pop(0) if queue else self.rng.choices(self.kinds, weights)[0]
            try:
                event = getattr(self, f"_{kind}")()
            except Exception as exc:
                now = time.time()
                event = FaultEvent(0, kind, now, now, detail=f"injection failed: {exc!r}", ok=False)
                self.errors.append(f"{kind}: {exc!r}")
            if event is None:
                continue
            event.index = len(self.events) + 1
            self.events.append(event)
            print(
                f"  fault #{event.index:<3} {event.kind:<16} at +{event.start - T0[0]:7.1f}s "
                f"for {event.end - event.start:5.2f}s  {event.detail}",
                flush=True,
            )

    # -- process faults --------------------------------------------------------------
    def _live_slot(self) -> int | None:
        slots = [s for s in self.pool.alive_slots() if self.pool.pid_of(s) not in self.pool.paused]
        return self.rng.choice(slots) if slots else None

    def _kill_slot(self, kind: str, slot: int, detail: str = "") -> FaultEvent:
        start = time.time()
        pid = self.pool.kill(slot)
        time.sleep(self.rng.uniform(0.2, 2.0))
        new = self.pool.start(slot)
        return FaultEvent(
            0,
            kind,
            start,
            time.time(),
            pid,
            f"pid {pid} killed, slot {slot} restarted as {new.pid} {detail}".strip(),
        )

    def _kill(self) -> FaultEvent | None:
        slot = self._live_slot()
        return None if slot is None else self._kill_slot("kill", slot)

    def _kill_hung_holder(self) -> FaultEvent | None:
        """Kill the process that runs a hung handler now (its job must be recovered)."""
        latest: dict[str, int] = {}
        for run in read_runs(self.record_dir):
            if run.job_id in self.hang_ids:
                latest[run.job_id] = run.pid
        holders = [
            (job_id, pid)
            for job_id, pid in sorted(latest.items())
            if self.pool.slot_of_pid(pid) is not None and pid not in self.pool.paused
        ]
        if not holders:
            return self._kill()
        job_id, pid = self.rng.choice(holders)
        slot = self.pool.slot_of_pid(pid)
        assert slot is not None
        return self._kill_slot("kill_hung_holder", slot, f"(it ran hung job {job_id})")

    def _pause(self) -> FaultEvent | None:
        slot = self._live_slot()
        if slot is None:
            return None
        # Past the lease and the grace, so maintenance elsewhere recovers its jobs.
        seconds = self.lease + self.grace + self.rng.uniform(1.5, 3.5)
        start = time.time()
        pid = self.pool.pause(slot)
        frozen = False
        try:
            if self.db.vendor == "sqlite":
                time.sleep(1.0)
                frozen = not self._sqlite_writable() and not self._sqlite_writable()
                time.sleep(max(0.0, start + seconds - time.time()))
            else:
                time.sleep(seconds)
        finally:
            self.pool.resume(pid)
        detail = f"SIGSTOP pid {pid}"
        if frozen:
            detail += " (it held the SQLite write lock: nobody could write meanwhile)"
        return FaultEvent(0, "pause", start, time.time(), pid, detail, db_frozen=frozen)

    def _sqlite_writable(self) -> bool:
        """Can another process take the SQLite write lock within a second?"""
        assert self.db.sqlite_path is not None
        conn = sqlite3.connect(self.db.sqlite_path, timeout=1.0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    # -- database faults -----------------------------------------------------------------
    def _pg_restart(self) -> FaultEvent:
        assert self.db.pg_data is not None
        log = os.path.join(os.path.dirname(self.db.pg_data), "log")
        start = time.time()
        result = _run_as(
            self.db.pg_user,
            [
                f"{_pg_bin()}/pg_ctl",
                "-D",
                self.db.pg_data,
                "-l",
                log,
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
                "restart",
            ],
        )
        end = time.time()
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl restart failed: {result.stderr.strip()}")
        return FaultEvent(0, "pg_restart", start, end, detail="pg_ctl restart -m fast")

    def _pg_terminate(self) -> FaultEvent:
        import psycopg

        assert self.db.pg_url is not None
        start = time.time()
        with psycopg.connect(
            self.db.pg_url, autocommit=True, application_name="later-chaos-fault"
        ) as conn:
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'later-chaos-worker'"
            ).fetchone()
        count = int(row[0]) if row else 0
        return FaultEvent(
            0, "pg_terminate", start, time.time(), detail=f"terminated {count} worker connections"
        )

    def _corrupt(self) -> FaultEvent | None:
        """Overwrite the payload of a delayed job nobody has taken yet."""
        now = time.time()
        candidates = [
            job
            for job in self.plan.snapshot()
            if job.kind == "delayed"
            and job.children == 0
            and job.corrupted_at is None
            and job.job_id is not None
            and job.ready_at > now + 1.0
        ]
        if not candidates:
            return None
        job = self.rng.choice(candidates)
        start = time.time()
        sql = (
            "UPDATE later_job SET payload = {p} WHERE id = {p} AND stage IN ('delayed', 'enqueued')"
        )
        if self.db.vendor == "postgres":
            import psycopg

            assert self.db.pg_url is not None
            with psycopg.connect(
                self.db.pg_url, autocommit=True, application_name="later-chaos-fault"
            ) as conn:
                changed = conn.execute(sql.format(p="%s"), [CORRUPT_BYTES, job.job_id]).rowcount
        else:
            assert self.db.sqlite_path is not None
            conn = sqlite3.connect(self.db.sqlite_path, timeout=30, isolation_level=None)
            try:
                changed = conn.execute(sql.format(p="?"), [CORRUPT_BYTES, job.job_id]).rowcount
            finally:
                conn.close()
        if changed == 1:
            job.corrupted_at = start
            job.expected, job.reason = FAILED, REASON_DECODE
            detail = f"payload of job {job.job_id} (n={job.n}) corrupted"
        else:
            detail = f"job {job.job_id} was already taken; nothing corrupted"
        return FaultEvent(0, "corrupt", start, time.time(), detail=detail)

    def _sqlite_lock(self) -> FaultEvent:
        """Another process takes SQLite's write lock and keeps it for seconds.

        Kept below LEASE_DURATION + STUCK_JOB_GRACE - renew interval: while
        the file is locked nobody can renew a lease, so a longer lock makes
        every running job look abandoned (by design of leases)."""
        assert self.db.sqlite_path is not None
        seconds = self.rng.uniform(1.0, 2.5)
        code = (
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(float(sys.argv[2]))\n"
            "c.execute('ROLLBACK')\n"
        )
        asked = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-c", code, self.db.sqlite_path, str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        proc.stdout.readline()
        start = time.time()
        proc.wait(60)
        return FaultEvent(
            0,
            "sqlite_lock",
            start,
            time.time(),
            None,
            f"BEGIN IMMEDIATE held {seconds:.1f}s (waited {start - asked:.2f}s for the lock)",
        )


# The run's start time, for printing offsets (set by __main__).
T0 = [time.time()]
