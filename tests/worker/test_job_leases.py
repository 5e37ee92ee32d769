"""A job's lease, fenced end to end on the database's clock: a job never runs
twice at once.

Each test shows one way a job used to run twice at once, or a worker used to
stall, and runs on SQLite and on PostgreSQL: renewal fenced by (job id,
attempt), and the handler of a lost lease stopped or let go; a handler
stopped when its lease can no longer be confirmed; lease times taken from
the database, so a host with a wrong clock is harmless; an outcome the
database refuses for good left to the lease's expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

import later_django as later
from later_django.worker.server import Server
from tests.helpers import (
    await_record,
    await_stage,
    await_until,
    history_times_ms,
    in_thread,
    overlapping_runs,
    read_records,
    serve,
    set_later,
    sqlite_write_lock,
    wait_until,
)
from tests.jobapp.jobs import AsyncHold, Chain, Flaky, Noop, Sleep, Stoppable

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


# -- 1. renewal fenced by (job id, attempt) ------------------------------------
@pytest.mark.one_env  # a lease's timing: Django's version changes nothing (CI time)
def test_renewal_of_an_earlier_attempt_stops_its_handler(later_db, record, settings):
    """A server that stood still past its lease and then claimed the same job
    again holds only the new attempt: renewing finds the old one lost and
    cancels its handler, while the new attempt runs on."""
    # A lease long enough that no renewal runs before the one the test makes.
    set_later(settings, LEASE_DURATION=timedelta(seconds=90))
    job_id = later.enqueue(AsyncHold(seconds=60, then=60))

    async def body(server: Any) -> list[Any]:
        await await_record(record, "hold-start", job_id)
        await in_thread(_take_over, later_db.alias, job_id, 1)
        server.queues[0].wake.wake()

        async def second_attempt() -> bool:
            return any(r.attempt == 2 for r in read_records(record, "hold-start", job_id))

        await await_until(second_attempt, 10, "attempt 2 started on the same server")
        lost = await server.leases.renew()
        await await_record(record, "hold-cancelled", job_id)
        return lost

    lost = serve(body, workers=2)
    assert lost == [(job_id, 1)]
    cancelled = read_records(record, "hold-cancelled", job_id)
    # Attempt 2 was still running when the server shut down (cancelled then),
    # but attempt 1 was cancelled first, by the lost lease.
    assert cancelled[0].attempt == 1


def test_sync_handler_that_lost_its_lease_gives_its_worker_back(later_db, record, settings):
    """Found by the chaos runner: a process paused past its lease kept each
    hung sync handler's worker after the job was recovered elsewhere, until
    no worker was left. Now the worker stops waiting for the handler (whose
    thread goes on; its outcome is discarded) and takes other jobs."""
    set_later(
        settings,
        LEASE_DURATION=timedelta(milliseconds=600),
        SUPERVISOR_INTERVAL=timedelta(hours=1),
    )

    async def main() -> None:
        server = Server(workers=1)  # the only worker: it must come back
        await server.start()
        try:
            job_id = await in_thread(later.enqueue, Sleep(seconds=6))

            async def running() -> bool:
                return any(slot.current_job == job_id for slot in server.slots)

            await await_until(running, 10, f"job {job_id} running")
            # The scenario: the handler runs on past its lease's duration
            # (0.6 s, renewed meanwhile), as a hung one does.
            await asyncio.sleep(0.8)
            # Another server recovers the job (as maintenance would after a pause).
            await in_thread(
                later_db.rows,
                "UPDATE later_job SET lease_owner = 'elsewhere', attempts = attempts + 1 "
                "WHERE id = %s RETURNING id",
                [job_id],
            )
            other = await in_thread(later.enqueue, Noop(n=1))
            # Long before the old handler returns.
            await await_stage(other, "success", timeout=4.0)
            assert server.worker_count == 1
            assert not any(slot.current_job == job_id for slot in server.slots)
            assert await in_thread(later_db.stage_of, job_id) == "running", "owned elsewhere"
        finally:
            await server.shutdown(1)

    asyncio.run(main())


def test_sync_handler_that_lost_its_lease_is_told_through_cancel_requested(
    later_db, record, settings
):
    """The worker stops waiting for a sync handler whose lease another server
    took over: its ``ctx.cancel_requested`` is set, as on a timeout or
    cancel(), so the handler can stop instead of running on beside the run
    that recovered its job."""
    # A lease long enough that no renewal runs before the one the test makes.
    set_later(settings, LEASE_DURATION=timedelta(seconds=90))
    job_id = later.enqueue(Stoppable(seconds=30))

    async def body(server: Any) -> None:
        await await_record(record, "stoppable-start", job_id)
        # Another server recovered the job and runs it (as after a pause).
        await in_thread(
            later_db.rows,
            "UPDATE later_job SET lease_owner = 'elsewhere', attempts = attempts + 1 "
            "WHERE id = %s RETURNING id",
            [job_id],
        )
        assert await server.leases.renew() == [(job_id, 1)]
        told = await await_record(record, "stoppable-told", job_id)
        assert told.attempt == 1

    serve(body, workers=1)
    assert later_db.stage_of(job_id) == "running", "owned elsewhere"


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
        with sqlite_write_lock(later_db):
            yield
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


def _lease_expiries(later_db: Any, jobs: list[str]) -> dict[str, int]:
    """Each job's lease expiry (ms), as stored."""
    return {job_id: int(str(later_db.job_field(job_id, "lease_expires_ms"))) for job_id in jobs}


@pytest.mark.one_env
def test_handlers_stop_before_their_lease_expires_when_renewal_fails(later_db, workers):
    """While the database takes no writes for longer than the lease, every
    async handler is cancelled before its lease can expire; afterwards each
    job is recovered and runs to success exactly once more."""
    lease = SHORT["LEASE_DURATION"]
    proc = workers.start(timings=SHORT, workers=4)
    workers.wait_registered(proc)
    jobs = [later.enqueue(AsyncHold(seconds=60, then=0.1, n=n)) for n in range(4)]
    wait_until(
        lambda: {r.job_id for r in read_records(workers.record, "hold-start")} == set(jobs),
        20,
        message=lambda: f"4 handlers running\n{workers.logs()}",
    )
    # A renewal is sent every lease / 3: wait for one after the claims, so the
    # lease is known to run until at most frozen_at + lease.
    claimed = _lease_expiries(later_db, jobs)
    wait_until(
        lambda: all(
            expires > claimed[job_id] for job_id, expires in _lease_expiries(later_db, jobs).items()
        ),
        10,
        lambda: f"a renewal of every lease after the claims\n{workers.logs()}",
    )
    frozen_at = time.time()
    with _database_frozen(later_db):
        # The scenario: the database takes no writes for twice the lease.
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


# -- 3. the database's clock, not the host's -----------------------------------
SKEW = 600.0  # seconds


@pytest.mark.one_env  # later_worker processes: Django's version changes nothing (CI time)
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
    assert overlapping_runs(workers.record) == []
    rows = later_db.rows("SELECT id, history, last_error FROM later_job")
    for job_id, history, last_error in rows:
        stamps = history_times_ms(str(history))
        assert stamps == sorted(stamps), (job_id, history)
        assert "lease expired" not in str(last_error or ""), (job_id, last_error)
    # Every process took part: each claimed jobs while skewed.
    pids = {r.pid for r in read_records(workers.record)}
    assert {w.pid for w in started} <= pids, (pids, logs)


# -- 4. an outcome the database refuses for good ---------------------------------
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
    set_later(
        settings,
        LEASE_DURATION=timedelta(seconds=1),
        STUCK_JOB_GRACE=timedelta(milliseconds=300),
    )
    with connections[later_db.alias].cursor() as cursor:
        cursor.execute(REFUSE_RETRY[later_db.vendor])
    try:
        flaky = later.enqueue(Flaky(succeed_on=2))

        async def body(server: Any) -> None:
            await await_record(record, "flaky", flaky)
            # The only worker is free for other jobs and their outcomes.
            other = await in_thread(later.enqueue, Noop(n=7))
            await await_stage(other, "success")
            await in_thread(_drop_refuse, later_db)
            # No longer renewed, the lease expired and the job was recovered.
            info = await await_stage(flaky, "success", timeout=15)
            assert info.attempts == 2

            async def all_stored() -> bool:
                return not server.completer.unstored

            await await_until(all_stored, 10, "every outcome stored")

        serve(body, workers=1)
    finally:
        _drop_refuse(later_db)


def _drop_refuse(later_db: Any) -> None:
    with connections[later_db.alias].cursor() as cursor:
        try:
            cursor.execute(DROP_REFUSE[later_db.vendor])
        except Exception:  # already dropped
            return
