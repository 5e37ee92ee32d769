"""Leases fenced end to end, on the database's clock: a job never runs twice at once.

Each test shows one way a job used to run twice at once, or a worker used to
stall, and runs on SQLite and on PostgreSQL unless it names a capability:
renewal fenced by (job id, attempt); a handler stopped when its lease can no
longer be confirmed; times taken from the database, so a host with a wrong
clock is harmless; outcome storage that gives up on permanent errors and
never outlives shutdown; continuations released whatever the interleaving
with their parent's finish, with no lock a caller's transaction can hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction

import later_django as later
from later_django.db import dialect_for
from later_django.db.rows import FailureWrite, OwnerFence
from later_django.db.sessions import HotPath
from tests.jobapp.jobs import AsyncHold, Chain, Flaky, Noop, Sleep
from tests.test_worker_processes import job_row, wait_until
from tests.test_worker_server import (
    db,
    later_settings,
    read_records,
    serve,
    wait_record,
    wait_stage,
)
from tests.test_worker_server import wait_until as await_until

SHORT = {"LEASE_DURATION": 2, "STUCK_JOB_GRACE": 0.5, "MAINTENANCE_INTERVAL": 0.2}


# -- helpers ------------------------------------------------------------------
def _take_over(alias: str, job_id: str, attempts: int) -> None:
    """What another server does to a job whose owner stood still past its
    lease: the rescuer requeues the expired claim, and it is due at once.
    Plain SQL, so the scenario does not depend on the code under test."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE later_job SET stage = 'enqueued', lease_owner = NULL, "
            "lease_expires_ms = NULL, history = history || 'requeued@' || changed_ms || ';' "
            "WHERE id = %s AND attempts = %s AND stage = 'running'",
            [job_id, attempts],
        )
        assert cursor.rowcount == 1


def _history_ms(history: str) -> list[int]:
    return [int(entry.partition("@")[2]) for entry in history.split(";") if entry]


def _runs(record_path: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Handler runs per job: (attempt, start, end) from start/end records;
    a run without an end record lasts to +infinity."""
    starts: dict[tuple[str, int], float] = {}
    ends: dict[tuple[str, int], float] = {}
    for rec in read_records(record_path):
        kind = rec.kind.rsplit("-", 1)[-1] if "-" in rec.kind else "start"
        if kind == "start" or rec.kind in ("noop", "chain", "flaky"):
            starts.setdefault((rec.job_id, rec.attempt), rec.start)
        if kind in ("end", "cancelled") or rec.kind in ("noop", "chain", "flaky"):
            ends[(rec.job_id, rec.attempt)] = rec.start
    runs: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for (job_id, attempt), start in starts.items():
        runs[job_id].append((attempt, start, ends.get((job_id, attempt), float("inf"))))
    return runs


def _overlaps(record_path: Path) -> list[str]:
    found = []
    for job_id, runs in _runs(record_path).items():
        runs.sort()
        for (a1, s1, e1), (a2, s2, e2) in zip(runs, runs[1:], strict=False):
            if max(s1, s2) < min(e1, e2):
                found.append(f"{job_id}: attempt {a1} {s1:.3f}-{e1:.3f}, {a2} {s2:.3f}-{e2:.3f}")
    return found


# -- 1. renewal fenced by (job id, attempt) ------------------------------------
def test_renewal_of_an_earlier_attempt_stops_its_handler(later_db, record, settings):
    """A server that stood still past its lease and then claimed the same job
    again holds only the new attempt: renewing finds the old one lost and
    cancels its handler, while the new attempt runs on."""
    # A lease long enough that no renewal runs before the one the test makes.
    later_settings(settings, LEASE_DURATION=timedelta(seconds=90))
    job_id = later.enqueue(AsyncHold(seconds=60, then=60))

    async def body(server: Any) -> list[Any]:
        await wait_record(record, "hold-start", job_id)
        await db(_take_over, later_db.alias, job_id, 1)
        server.wake.wake()

        async def second_attempt() -> bool:
            return any(r.attempt == 2 for r in read_records(record, "hold-start", job_id))

        await await_until(second_attempt, 10, "attempt 2 started on the same server")
        lost = await server.renew_leases()
        await wait_record(record, "hold-cancelled", job_id)
        return lost

    lost = serve(body, workers=2)
    assert lost == [(job_id, 1)]
    cancelled = read_records(record, "hold-cancelled", job_id)
    # Attempt 2 was still running when the server shut down (cancelled then),
    # but attempt 1 was cancelled first, by the lost lease.
    assert cancelled[0].attempt == 1


# -- 2. a lease that cannot be confirmed stops its handler ---------------------
def _postmaster(alias: str) -> int:
    """The PID of the PostgreSQL server's postmaster: the parent of our backend."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return _parent_pid(int(cursor.fetchone()[0]))


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _parent_pid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return -1


@contextmanager
def _database_frozen(later_db: Any) -> Iterator[None]:
    """Nobody can write: SQLite's write lock held by another connection;
    every PostgreSQL process stopped with SIGSTOP."""
    if later_db.vendor == "sqlite":
        holder = sqlite3.connect(connections[later_db.alias].settings_dict["NAME"])
        holder.isolation_level = None
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("COMMIT")
            holder.close()
        return
    postmaster = _postmaster(later_db.alias)
    connections[later_db.alias].close()
    pids = [postmaster, *(pid for pid in _all_pids() if _parent_pid(pid) == postmaster)]
    for pid in pids:
        _signal(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            _signal(pid, signal.SIGCONT)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # a backend that ended meanwhile
        os.kill(pid, sig)


def test_handlers_stop_before_their_lease_expires_when_renewal_fails(later_db, workers):
    """While the database takes no writes for longer than the lease, every
    async handler is cancelled before its lease can expire; afterwards each
    job is recovered and runs to success exactly once more."""
    lease = SHORT["LEASE_DURATION"]
    proc = workers.start(timings=SHORT, workers=4)
    workers.wait_registered(proc)
    jobs = [later.enqueue(AsyncHold(seconds=60, then=0.1, n=n)) for n in range(4)]
    wait_until(
        lambda: len(_started(workers.record, 1)) == len(jobs),
        20,
        message=lambda: f"4 handlers running\n{workers.logs()}",
    )
    # A renewal is sent every lease / 3: wait for one after the claims, so the
    # lease is known to run until at most frozen_at + lease.
    time.sleep(lease / 3 + 0.2)
    frozen_at = time.time()
    with _database_frozen(later_db):
        time.sleep(lease * 2)
    thawed_at = time.time()
    for job_id in jobs:
        wait_until(
            lambda job_id=job_id: later_db.stage_of(job_id) == "success",
            30,
            message=lambda job_id=job_id: f"{job_id} succeeds\n{workers.logs()}",
        )
    records = read_records(workers.record)
    for job_id in jobs:
        mine = [r for r in records if r.job_id == job_id]
        cancelled = [r for r in mine if r.kind == "hold-cancelled" and r.attempt == 1]
        assert len(cancelled) == 1, (mine, workers.logs())
        assert frozen_at < cancelled[0].start < frozen_at + lease, (
            f"attempt 1 of {job_id} stopped {cancelled[0].start - frozen_at:.2f}s after the "
            f"database froze; its lease ran out {lease}s after"
        )
        again = [r for r in mine if r.kind == "hold-start" and r.attempt > 1]
        assert len(again) == 1 and again[0].start > thawed_at, mine
        assert [r.attempt for r in mine if r.kind == "hold-end"] == [again[0].attempt]
    assert "cancelled handler of job" in proc.output()


def _started(record_path: Path, attempt: int) -> set[str]:
    return {
        r.job_id
        for r in read_records(record_path)
        if r.kind == "hold-start" and r.attempt == attempt
    }


# -- 3. the database's clock, not the host's -----------------------------------
SKEW = 600.0  # seconds


def test_workers_with_skewed_clocks_never_take_live_jobs(later_db, workers):
    """Worker processes whose wall clocks are ten minutes ahead and behind the
    others' never rescue a live job, never run one twice at once, and leave
    every job's stage history in order."""
    started = [
        workers.start(timings=SHORT, workers=3),
        workers.start(timings=SHORT, workers=3, env={"LATER_TEST_CLOCK_SKEW": str(SKEW)}),
        workers.start(timings=SHORT, workers=3, env={"LATER_TEST_CLOCK_SKEW": str(-SKEW)}),
    ]
    workers.wait_registered(*started)
    jobs = [later.enqueue(Sleep(seconds=1.5, n=n)) for n in range(12)]
    jobs += [later.enqueue(Flaky(succeed_on=2)) for _ in range(6)]
    jobs += [later.enqueue(Chain(n=n)) for n in range(6)]
    jobs += later.enqueue_many([Noop(n=n) for n in range(60)])
    jobs += [later.enqueue_delayed(Noop(n=n), timedelta(seconds=1)) for n in range(6)]
    wait_until(
        lambda: later.stage_counts()["success"] >= len(jobs) + 6,  # + the chained Noops
        60,
        message=lambda: f"every job succeeds: {later.stage_counts()}\n{workers.logs()}",
    )
    logs = workers.logs()
    assert "recovered stuck job" not in logs
    assert "handler of job" not in logs  # no handler stopped or abandoned
    assert _overlaps(workers.record) == []
    rows = later_db.rows("SELECT id, history, last_error FROM later_job")
    for job_id, history, last_error in rows:
        stamps = _history_ms(str(history))
        assert stamps == sorted(stamps), (job_id, history)
        assert "lease expired" not in str(last_error or ""), (job_id, last_error)
    # Every process took part: each claimed jobs while skewed.
    pids = {r.pid for r in read_records(workers.record)}
    assert {w.pid for w in started} <= pids, (pids, logs)


def test_stage_time_never_goes_back_behind_a_writer_that_waited(later_db):
    """A write that waited for another writer of the job stamps its stage
    change no earlier than that writer's, so history stays in order."""
    job_id = later.enqueue_delayed(Noop(), timedelta(hours=1))
    result: dict[str, object] = {}

    def cancel() -> None:
        try:
            result["cancelled"] = later.cancel(job_id)
        finally:
            connections.close_all()

    writer = threading.Thread(target=cancel)
    with _row_locked(later_db, job_id) as write:
        writer.start()
        time.sleep(0.5)  # the cancel waits for the lock meanwhile
        other_ms = int(time.time() * 1000)
        write(
            "UPDATE later_job SET changed_ms = %s, history = history || %s WHERE id = %s",
            [other_ms, f"delayed@{other_ms};", job_id],
        )
    writer.join(10)
    assert result == {"cancelled": True}
    stage, _, history = job_row(later_db, job_id)
    assert stage == "cancelled"
    stamps = _history_ms(history)
    assert stamps == sorted(stamps), history
    assert stamps[-1] >= other_ms, (
        f"the cancel was stamped {other_ms - stamps[-1]} ms before the write it waited for"
    )


@contextmanager
def _row_locked(later_db: Any, job_id: str) -> Iterator[Any]:
    """Another connection holds the write lock (SQLite) or the job's row
    (PostgreSQL) until the block ends; yields a function that writes
    through that connection."""
    if later_db.vendor == "sqlite":
        holder = sqlite3.connect(connections[later_db.alias].settings_dict["NAME"])
        holder.isolation_level = None
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield lambda sql, params: holder.execute(sql.replace("%s", "?"), params)
        finally:
            holder.execute("COMMIT")
            holder.close()
        return
    import psycopg

    from later_django.db.postgresql import connect_kwargs

    with psycopg.connect(**connect_kwargs(later_db.alias)) as pg:
        pg.execute("SELECT 1 FROM later_job WHERE id = %s FOR UPDATE", [job_id])
        yield pg.execute
        pg.commit()


# -- 4. outcome storage: permanent errors, shutdown -----------------------------
REFUSE_RETRY = {
    "sqlite": (
        "CREATE TRIGGER later_test_refuse BEFORE UPDATE OF stage ON later_job "
        "WHEN NEW.stage = 'requeued' AND NEW.last_error NOT LIKE 'lease expired%' "
        "BEGIN SELECT RAISE(ABORT, 'retries refused by the test'); END"
    ),
    "postgresql": """
        CREATE FUNCTION later_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'retries refused by the test'; END $$;
        CREATE TRIGGER later_test_refuse BEFORE UPDATE ON later_job FOR EACH ROW
        WHEN (NEW.stage = 'requeued' AND NEW.last_error NOT LIKE 'lease expired%%')
        EXECUTE FUNCTION later_test_refuse();
    """,
}
DROP_REFUSE = {
    "sqlite": "DROP TRIGGER later_test_refuse",
    "postgresql": "DROP TRIGGER later_test_refuse ON later_job; DROP FUNCTION later_test_refuse()",
}


def test_permanent_store_error_lets_the_lease_expire_and_frees_the_worker(
    later_db, record, settings
):
    """An outcome the database refuses for good is not retried forever: the
    claim is let go (no more renewals), the worker runs other jobs, and the
    stuck-job recovery runs the job again once its lease expired."""
    later_settings(
        settings,
        LEASE_DURATION=timedelta(seconds=1),
        STUCK_JOB_GRACE=timedelta(milliseconds=300),
    )
    with connections[later_db.alias].cursor() as cursor:
        cursor.execute(REFUSE_RETRY[later_db.vendor])
    try:
        flaky = later.enqueue(Flaky(succeed_on=2))

        async def body(server: Any) -> None:
            await wait_record(record, "flaky", flaky)
            # The only worker is free for other jobs and their outcomes.
            other = await db(later.enqueue, Noop(n=7))
            await wait_stage(other, "success")
            await db(_drop_refuse, later_db)
            # No longer renewed, the lease expired and the job was recovered.
            info = await wait_stage(flaky, "success", within=15)
            assert info.attempts == 2
            assert not server.completer.unstored

        serve(body, workers=1)
    finally:
        _drop_refuse(later_db)


def _drop_refuse(later_db: Any) -> None:
    with connections[later_db.alias].cursor() as cursor:
        try:
            cursor.execute(DROP_REFUSE[later_db.vendor])
        except Exception:  # already dropped
            return


def test_shutdown_ends_outcome_stores_and_never_reconnects(later_db, record, settings):
    """An outcome still being stored at the shutdown deadline is abandoned
    with its session: after shutdown nothing writes for that server."""
    later_settings(settings, LEASE_DURATION=timedelta(seconds=30))
    job_id = later.enqueue(AsyncHold(seconds=0.2))

    async def main() -> Any:
        from later_django.worker.server import Server

        server = Server(workers=1)
        await server.start()
        await wait_record(record, "hold-start", job_id)
        with _row_locked(later_db, job_id):
            await wait_record(record, "hold-end", job_id)
            await asyncio.sleep(0.3)  # the completion now waits for the lock
            await server.shutdown(0.5)
        # The lock is gone: a store that outlived shutdown would write now.
        await asyncio.sleep(1.0)
        current = asyncio.current_task()
        return server, [t for t in asyncio.all_tasks() if t is not current and not t.done()]

    server, left = asyncio.run(main())
    assert later_db.stage_of(job_id) == "running", "nothing stored after shutdown"
    assert left == []
    for path in (server.claimer.path, server.completer.path):
        session = path.postgres or path.sqlite
        assert session is not None and session.closed


# -- 5. continuations and their parent's finish ---------------------------------
@pytest.mark.parametrize("parent_outcome", ["success", "failed"])
def test_continuation_settles_when_its_parent_finishes_during_its_transaction(
    later_db, parent_outcome
):
    """A parent that finishes while a caller's transaction adding its
    continuation is still open neither waits for that transaction nor
    strands the child: once it commits, the child is ready (or failed)."""
    if dialect_for(later_db.alias).single_writer:
        pytest.skip("one writer at a time: the finish waits for the transaction")
    parent = later.enqueue(Noop(n=1))
    added, commit = threading.Event(), threading.Event()
    child: list[str] = []

    def caller() -> None:
        try:
            with transaction.atomic(using=later_db.alias):
                child.append(later.enqueue_continue(parent, Noop(n=2)))
                added.set()
                commit.wait(10)
        finally:
            connections.close_all()

    async def finish_parent() -> tuple[list[str], list[tuple[str, int]]]:
        path = HotPath(later_db.alias)
        try:
            claimed = await path.claim(namespace="default", owner="w", limit=1, lease_ms=30_000)
            assert [job.id for job in claimed] == [parent]
            thread.start()
            await asyncio.to_thread(added.wait, 10)
            renewed = await asyncio.wait_for(asyncio.to_thread(_renew, later_db, parent), 3)
            if parent_outcome == "success":
                completion = await asyncio.wait_for(
                    path.complete_many(owner="w", jobs=[(parent, 1)], retention_ms=60_000), 3
                )
                done = completion.done_ids
            else:
                done = await asyncio.wait_for(asyncio.to_thread(_fail, later_db, parent), 3)
            return done, renewed
        finally:
            await path.close()

    thread = threading.Thread(target=caller)
    done, renewed = asyncio.run(finish_parent())
    assert done == [parent], "the parent's finish did not wait for the caller"
    assert renewed == [(parent, 1)], "renewal did not wait for the caller"
    commit.set()
    thread.join(10)
    expected = "enqueued" if parent_outcome == "success" else "failed"
    # No maintenance runs here: the child is settled by its own commit.
    wait_until(
        lambda: later_db.stage_of(child[0]) == expected,
        3,
        message=lambda: f"child {expected}, is {later_db.stage_of(child[0])}",
    )


def _renew(later_db: Any, job_id: str) -> list[tuple[str, int]]:
    try:
        with connections[later_db.alias].cursor() as cursor:
            return dialect_for(later_db.alias).job_renew(
                cursor, owner="w", jobs=[(job_id, 1)], lease_ms=30_000
            )
    finally:
        connections.close_all()


def _fail(later_db: Any, job_id: str) -> list[str]:
    try:
        with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
            failed = dialect_for(later_db.alias).job_fail(
                c,
                OwnerFence(job_id=job_id, attempts=1, owner="w"),
                FailureWrite(error="boom", retention_ms=60_000),
            )
        return [job_id] if failed else []
    finally:
        connections.close_all()
