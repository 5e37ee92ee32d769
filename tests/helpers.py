"""Helpers the test modules share: polls with a deadline, the record file the
test handlers append to, readers of the test database, a Server run in this
process and ``later_worker`` processes.

Nothing here is a fixture (those are in conftest.py), and no helper waits a
fixed time: a wait is a poll that fails with a message at its deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from django.db import connections

import later_django as later
from later_django.db import dialect_for
from later_django.types import JobInfo
from later_django.worker.server import Server

T = TypeVar("T")

PROJECT_DIR = Path(__file__).resolve().parent.parent
WORKER_ARGS = [sys.executable, "-m", "django", "later_worker"]
STOP_TIMEOUT = 15.0  # seconds a worker process gets to exit after SIGTERM
POLL_INTERVAL = 0.05  # seconds between two looks at a condition


# -- polling with a deadline --------------------------------------------------
def _timed_out(timeout: float, message: str | Callable[[], str]) -> AssertionError:
    text = message() if callable(message) else message
    return AssertionError(f"timed out after {timeout:.1f}s waiting for: {text}")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    message: str | Callable[[], str] = "condition",
    *,
    interval: float = POLL_INTERVAL,
) -> T:
    """Poll ``predicate`` until it returns a truthy value; return that value.

    Raise AssertionError naming ``message`` (a string, or a function called
    only then, for a message that shows the state at the deadline) when
    ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, message)
        time.sleep(interval)


async def await_until(
    predicate: Callable[[], Awaitable[T]],
    timeout: float,
    message: str | Callable[[], str] = "condition",
    *,
    interval: float = POLL_INTERVAL,
) -> T:
    """The async twin of ``wait_until``: await ``predicate`` until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, message)
        await asyncio.sleep(interval)


# -- the record file of the test handlers (tests/jobapp/jobs.py) ---------------
@dataclass(frozen=True)
class Record:
    """One line a test handler appends per run: what ran, which attempt,
    in which process, when (wall clock, seconds) and an optional tag."""

    kind: str
    job_id: str
    attempt: int
    pid: int
    start: float
    tag: str


def read_records(path: Path, kind: str | None = None, job_id: str | None = None) -> list[Record]:
    """Return the records in ``path``, in order, of one kind and job if given."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    lines.pop()  # after the last newline: nothing, or a line still being written
    records = []
    for line in lines:
        parts = line.split(" ")
        record = Record(
            parts[0], parts[1], int(parts[2]), int(parts[3]), float(parts[4]),
            parts[5] if len(parts) > 5 else "",
        )  # fmt: skip
        if (kind is None or record.kind == kind) and (job_id is None or record.job_id == job_id):
            records.append(record)
    return records


async def await_record(path: Path, kind: str, job_id: str, timeout: float = 10.0) -> Record:
    """Wait for the first ``kind`` record of ``job_id`` in ``path``; return it."""

    async def found() -> list[Record]:
        return read_records(path, kind, job_id)

    records = await await_until(found, timeout, f"a {kind} record of job {job_id}")
    return records[0]


# Handlers that write one record per run, at its end; the others write a
# "<name>-start" record and a "-end" or "-cancelled" one.
SINGLE_RECORD_KINDS = ("noop", "chain", "flaky")


def handler_runs(path: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Return each job's handler runs as (attempt, start, end), from the
    records in ``path``; a run without an end record lasts to +infinity."""
    starts: dict[tuple[str, int], float] = {}
    ends: dict[tuple[str, int], float] = {}
    for rec in read_records(path):
        kind = rec.kind.rsplit("-", 1)[-1] if "-" in rec.kind else "start"
        if kind == "start" or rec.kind in SINGLE_RECORD_KINDS:
            starts.setdefault((rec.job_id, rec.attempt), rec.start)
        if kind in ("end", "cancelled") or rec.kind in SINGLE_RECORD_KINDS:
            ends[(rec.job_id, rec.attempt)] = rec.start
    runs: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for (job_id, attempt), start in starts.items():
        runs[job_id].append((attempt, start, ends.get((job_id, attempt), float("inf"))))
    return runs


def overlapping_runs(path: Path) -> list[str]:
    """Describe every two runs of one job that were running at the same time."""
    found = []
    for job_id, runs in handler_runs(path).items():
        runs.sort()
        for (a1, s1, e1), (a2, s2, e2) in zip(runs, runs[1:], strict=False):
            if max(s1, s2) < min(e1, e2):
                found.append(f"{job_id}: attempt {a1} {s1:.3f}-{e1:.3f}, {a2} {s2:.3f}-{e2:.3f}")
    return found


# -- the test database -------------------------------------------------------------
@dataclass
class LaterDb:
    """The database a test runs on (the ``later_db`` fixture), read directly."""

    alias: str
    vendor: str

    def scalar(self, sql: str, params: list[object] | None = None) -> object:
        """Return the first column of the first row of ``sql``, or None."""
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, params or [])
            row = cursor.fetchone()
        return None if row is None else row[0]

    def rows(self, sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
        """Return every row of ``sql``."""
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, params or [])
            return list(cursor.fetchall())

    def execute(self, sql: str, params: list[object] | None = None) -> int:
        """Run a write; return how many rows it changed."""
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, params or [])
            return int(cursor.rowcount)

    def now_ms(self) -> int:
        """The database's clock, in epoch ms."""
        with connections[self.alias].cursor() as cursor:
            return dialect_for(self.alias).clock_now(cursor)

    def job_count(self) -> int:
        """Return how many rows later_job has, in every namespace."""
        return int(self.scalar("SELECT COUNT(*) FROM later_job"))  # type: ignore[arg-type]

    def stage_of(self, job_id: str) -> str:
        """Return the job's stage as stored."""
        return str(self.scalar("SELECT stage FROM later_job WHERE id = %s", [job_id]))

    def job_field(self, job_id: str, column: str) -> object:
        """Return one column of the job's row."""
        return self.scalar(f"SELECT {column} FROM later_job WHERE id = %s", [job_id])

    def job_row(self, job_id: str) -> tuple[str, int, str]:
        """Return the job's (stage, attempts, history) as stored."""
        sql = "SELECT stage, attempts, history FROM later_job WHERE id = %s"
        stage, attempts, history = self.rows(sql, [job_id])[0]
        return str(stage), int(attempts), str(history)  # type: ignore[call-overload]

    def worker_env(self) -> dict[str, str]:
        """Environment for a child process that uses this test database."""
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "LATER_TEST_ALIAS": self.alias,
            "LATER_TEST_USE_TEST_DB": "1",
        }


def history_stages(history: str) -> list[str]:
    """Return the stages of a stored history column ("stage@ms;..."), in order."""
    return [entry.partition("@")[0] for entry in history.split(";") if entry]


def history_times_ms(history: str) -> list[int]:
    """Return the times (ms) of a stored history column, in order."""
    return [int(entry.partition("@")[2]) for entry in history.split(";") if entry]


def job_stages(info: JobInfo) -> list[str]:
    """Return the stages of a JobInfo's history, in order."""
    return [change.stage for change in info.history]


def set_later(settings: Any, **values: object) -> None:
    """Override keys of LATER for one test (pytest-django's ``settings`` restores it)."""
    settings.LATER = {**settings.LATER, **values}


@contextmanager
def sqlite_write_lock(later_db: LaterDb) -> Iterator[sqlite3.Connection]:
    """Hold SQLite's write lock from another connection until the block ends
    (or until the block commits on the connection it is given)."""
    holder = sqlite3.connect(connections[later_db.alias].settings_dict["NAME"])
    holder.isolation_level = None
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield holder
    finally:
        if holder.in_transaction:
            holder.execute("COMMIT")
        holder.close()


@contextmanager
def job_row_locked(later_db: LaterDb, job_id: str) -> Iterator[Callable[[str, list[Any]], Any]]:
    """Hold the write lock (SQLite) or the job's row (PostgreSQL) from another
    connection until the block ends; yield a function ``write(sql, params)``
    that writes through that connection (committed at the end)."""
    if later_db.vendor == "sqlite":
        with sqlite_write_lock(later_db) as holder:
            yield lambda sql, params: holder.execute(sql.replace("%s", "?"), params)
        return
    import psycopg

    from later_django.db.postgresql import connect_kwargs

    with psycopg.connect(**connect_kwargs(later_db.alias)) as pg:
        pg.execute("SELECT 1 FROM later_job WHERE id = %s FOR UPDATE", [job_id])
        yield pg.execute
        pg.commit()


# -- a Server in this process ----------------------------------------------------
async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a synchronous Django call in a thread, closing its connections after.

    Django refuses database calls on an event loop's thread.
    """

    def call() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return await asyncio.to_thread(call)


async def job_info(job_id: str) -> JobInfo:
    """Return the job's JobInfo; it must exist."""
    info = await in_thread(later.get_job, job_id)
    assert info is not None, f"job {job_id} does not exist"
    return info


async def await_stage(job_id: str, stage: str, timeout: float = 10.0) -> JobInfo:
    """Wait until the job is in ``stage``; return its JobInfo."""
    last: list[JobInfo | None] = [None]

    async def reached() -> bool:
        info = last[0] = await job_info(job_id)
        return info.stage == stage

    await await_until(reached, timeout, lambda: f"job {job_id} in {stage}; it is {last[0]}")
    assert last[0] is not None
    return last[0]


def serve(
    body: Callable[[Server], Awaitable[T]],
    *,
    workers: int = 2,
    before_start: Callable[[Server], object] | None = None,
    **kwargs: Any,
) -> T:
    """Run ``body(server)`` on a started Server; always shut it down.

    ``before_start(server)`` may replace the server's methods first. A
    worker that died along the way fails the test.
    """

    async def main() -> T:
        server = Server(workers=workers, **kwargs)
        if before_start is not None:
            before_start(server)
        await server.start()
        try:
            result = await body(server)
            assert all(not slot.task.done() for slot in server.slots if slot.task), (
                "no worker died along the way"
            )
            return result
        finally:
            await server.shutdown(5)

    return asyncio.run(main())


# -- later_worker processes --------------------------------------------------------
@dataclass
class WorkerProcess:
    """One ``later_worker`` process and the file its output goes to."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM, then SIGKILL past ``timeout``; return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout)


class Workers:
    """Starts ``later_worker`` processes for one test (the ``workers``
    fixture, which always stops them); their handlers append to ``record``."""

    def __init__(self, later_db: LaterDb, tmp_path: Path) -> None:
        self.later_db = later_db
        self.tmp_path = tmp_path
        self.record = tmp_path / "record.txt"
        self.started: list[WorkerProcess] = []

    def start(
        self,
        *args: str,
        timings: dict[str, float] | None = None,
        workers: int | None = 8,
        env: dict[str, str] | None = None,
        command: list[str] = WORKER_ARGS,
    ) -> WorkerProcess:
        """Start a process with these options; ``timings`` are LATER keys in
        seconds; ``command`` runs later_worker (another way than the usual)."""
        env = {**self.later_db.worker_env(), "LATER_TEST_RECORD": str(self.record), **(env or {})}
        if timings:
            env["LATER_TEST_TIMINGS"] = json.dumps(timings)
        argv = [*command, *(["--workers", str(workers)] if workers else []), *args]
        log = self.tmp_path / f"worker-{len(self.started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=PROJECT_DIR,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = WorkerProcess(proc, log)
        self.started.append(worker)
        return worker

    def registered_pids(self) -> set[int]:
        """Return the PIDs of the servers registered in later_server."""
        return {int(row[0]) for row in self.later_db.rows("SELECT pid FROM later_server")}  # type: ignore[call-overload]

    def wait_registered(self, *workers: WorkerProcess, timeout: float = 30.0) -> None:
        """Wait until every given process has started its server."""

        def ready() -> bool:
            for worker in workers:
                code = worker.proc.poll()
                if code is not None:
                    raise AssertionError(
                        f"worker {worker.pid} exited with {code}:\n{worker.output()}"
                    )
            return {w.pid for w in workers} <= self.registered_pids()

        wait_until(ready, timeout, lambda: f"workers registered: {self.logs()}")

    def wait_stage(self, job_id: str, stage: str, timeout: float) -> None:
        """Wait until the job is in ``stage``; the message shows every log."""
        wait_until(
            lambda: self.later_db.stage_of(job_id) == stage,
            timeout,
            lambda: (
                f"job {job_id} to reach {stage} (now {self.later_db.job_row(job_id)})\n"
                f"{self.logs()}"
            ),
        )

    def logs(self) -> str:
        """Return every process's output, each under its PID."""
        return "\n".join(f"--- worker {w.pid} ---\n{w.output()}" for w in self.started)

    def stop_all(self) -> None:
        """SIGTERM every process, then SIGKILL the ones still running after a while."""
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        for worker in self.started:
            try:
                worker.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(worker.proc.pid, signal.SIGKILL)
                worker.proc.wait(STOP_TIMEOUT)
