"""Real ``later_worker`` processes on the test databases: drain, crash, signals, CLI.

Every test runs on SQLite and on PostgreSQL (the ``later_db`` fixture). Worker
processes open the same test database through ``later_db.worker_env()``; each
handler run appends a line to the file named by ``LATER_TEST_RECORD``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter

import pytest

import later_django as later
from tests.helpers import (
    PROJECT_DIR,
    STOP_TIMEOUT,
    WORKER_ARGS,
    history_stages,
    read_records,
    wait_until,
)
from tests.jobapp.jobs import AsyncSleep, Noop, Sleep

# later_worker processes: Django's version changes nothing here (tox.ini).
pytestmark = pytest.mark.one_env

# Timings for processes that must recover a dead process's job quickly.
SHORT_LEASE = {"LEASE_DURATION": 1, "STUCK_JOB_GRACE": 0.5, "MAINTENANCE_INTERVAL": 0.2}


DRAIN_JOBS = 5_000
DRAIN_TIMEOUT = 120.0


def test_worker_processes_drain_jobs_exactly_once(later_db, workers):
    """Three processes of eight workers run 5,000 jobs, each exactly once."""
    procs = [workers.start() for _ in range(3)]
    workers.wait_registered(*procs)
    ids = later.enqueue_many(Noop(n=i) for i in range(DRAIN_JOBS))
    started = time.monotonic()
    wait_until(
        lambda: later.stage_counts()["success"] == DRAIN_JOBS,
        DRAIN_TIMEOUT,
        interval=0.2,
        message=lambda: f"all jobs succeed; counts {later.stage_counts()}\n{workers.logs()}",
    )
    elapsed = time.monotonic() - started
    print(f"\n{later_db.vendor}: drained {DRAIN_JOBS} jobs in {elapsed:.1f}s")

    counts = later.stage_counts()
    assert counts["success"] == DRAIN_JOBS
    assert sum(counts.values()) == DRAIN_JOBS, counts
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE stage = 'success'") == DRAIN_JOBS
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE attempts <> 1") == 0
    histories = {str(h) for (h,) in later_db.rows("SELECT history FROM later_job")}
    assert {tuple(history_stages(h)) for h in histories} == {("enqueued", "running", "success")}

    records = read_records(workers.record, "noop")
    runs = Counter(r.job_id for r in records)
    assert set(runs) == set(ids)
    assert max(runs.values()) == 1, [job for job, n in runs.items() if n > 1][:10]
    assert {r.attempt for r in records} == {1}
    assert {r.pid for r in records} == {p.pid for p in procs}, "every process took a share"

    for proc in procs:
        assert proc.stop() == 0, proc.output()
    assert workers.registered_pids() == set(), "stopped servers deregister"


WAKE_TIMEOUT = 15.0  # far below the poll interval the worker is given


def test_idle_worker_process_wakes_for_another_process_job_without_polling(later_db, workers):
    """An idle worker that polls only once a minute still starts a job another
    process enqueues at once: PostgreSQL by LISTEN/NOTIFY, SQLite by watching
    the file's commit counter."""
    proc = workers.start(timings={"POLL_INTERVAL": 60}, workers=2)
    workers.wait_registered(proc)
    # The worker's first empty claims and its polls are done; it now sleeps.
    for n in range(3):
        job_id = later.enqueue(Noop(n=n))
        workers.wait_stage(job_id, "success", WAKE_TIMEOUT)
    assert proc.stop() == 0, proc.output()


def test_worker_processes_recover_job_of_killed_process(later_db, workers):
    """kill -9 during a handler: another process recovers the job through its lease."""
    procs = [workers.start(timings=SHORT_LEASE) for _ in range(2)]
    workers.wait_registered(*procs)
    sleep_id = later.enqueue(Sleep(seconds=3))
    before = later.enqueue_many(Noop(n=i) for i in range(200))

    first = wait_until(
        lambda: read_records(workers.record, "sleep-start", sleep_id),
        30,
        message=lambda: f"the sleep job to start\n{workers.logs()}",
    )[0]
    victim = next(p for p in procs if p.pid == first.pid)
    survivor = next(p for p in procs if p.pid != first.pid)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.proc.wait(STOP_TIMEOUT) == -signal.SIGKILL
    after = later.enqueue_many(Noop(n=i) for i in range(200, 300))

    workers.wait_stage(sleep_id, "success", 30)
    stage, attempts, history = later_db.job_row(sleep_id)
    assert attempts == 2
    assert history_stages(history) == [
        "enqueued",
        "running",
        "requeued",
        "enqueued",
        "running",
        "success",
    ]
    starts = read_records(workers.record, "sleep-start", sleep_id)
    assert [(r.attempt, r.pid) for r in starts] == [(1, victim.pid), (2, survivor.pid)]
    ends = read_records(workers.record, "sleep-end", sleep_id)
    assert [(r.attempt, r.pid) for r in ends] == [(2, survivor.pid)]
    # The retry started only after the first attempt's lease had expired.
    assert starts[1].start - starts[0].start >= 1.0

    noops = [*before, *after]
    wait_until(
        lambda: later.stage_counts()["success"] == len(noops) + 1,
        30,
        message=lambda: f"every job succeeds; counts {later.stage_counts()}",
    )
    assert later_db.job_count() == len(noops) + 1
    assert set(Counter(r.job_id for r in read_records(workers.record, "noop"))) == set(noops)
    assert survivor.proc.poll() is None, "the surviving process keeps running"


def test_worker_process_sigterm_lets_running_handlers_commit(later_db, workers):
    """SIGTERM waits for running sync and async handlers, then exits 0."""
    proc = workers.start("--shutdown-timeout", "10")
    workers.wait_registered(proc)
    sync_id = later.enqueue(Sleep(seconds=3))
    async_id = later.enqueue(AsyncSleep(seconds=3))
    wait_until(
        lambda: (
            read_records(workers.record, "sleep-start", sync_id)
            and read_records(workers.record, "asleep-start", async_id)
        ),
        30,
        message=lambda: f"both handlers to start\n{workers.logs()}",
    )
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(STOP_TIMEOUT) == 0, proc.output()

    for job_id, end_kind in ((sync_id, "sleep-end"), (async_id, "asleep-end")):
        stage, attempts, _ = later_db.job_row(job_id)
        assert (stage, attempts) == ("success", 1), proc.output()
        assert len(read_records(workers.record, end_kind, job_id)) == 1
    assert proc.pid not in workers.registered_pids(), "a stopped server deregisters"


def test_worker_process_shutdown_deadline_aborts_and_lease_recovers(later_db, workers):
    """Past --shutdown-timeout the process exits; the lease recovers the job elsewhere."""
    first = workers.start("--shutdown-timeout", "0.5", timings=SHORT_LEASE)
    workers.wait_registered(first)
    job_id = later.enqueue(Sleep(seconds=3))
    start = wait_until(
        lambda: read_records(workers.record, "sleep-start", job_id),
        30,
        message=lambda: f"the handler to start\n{workers.logs()}",
    )[0]
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(STOP_TIMEOUT) == 0, first.output()
    exited_at = time.time()
    assert exited_at < start.start + 3, "the process exited before its handler could end"
    assert read_records(workers.record, "sleep-end", job_id) == []
    assert later_db.stage_of(job_id) == "running", "the aborted job keeps its lease"

    second = workers.start(timings=SHORT_LEASE)
    workers.wait_stage(job_id, "success", 30)
    stage, attempts, history = later_db.job_row(job_id)
    assert attempts == 2
    assert "requeued" in history_stages(history)
    starts = read_records(workers.record, "sleep-start", job_id)
    assert [(r.attempt, r.pid) for r in starts] == [(1, first.pid), (2, second.pid)]
    ends = read_records(workers.record, "sleep-end", job_id)
    assert [(r.attempt, r.pid) for r in ends] == [(2, second.pid)]


def test_worker_process_gives_back_an_async_job_it_stops_at_the_deadline(later_db, workers):
    """Past --shutdown-timeout an async handler is cancelled and its job is
    given back at once, its attempt not counted: a deploy never spends a
    retry or fails a job, and nobody waits for its lease."""
    proc = workers.start("--shutdown-timeout", "0.5")
    workers.wait_registered(proc)
    job_id = later.enqueue(AsyncSleep(seconds=60))
    wait_until(
        lambda: read_records(workers.record, "asleep-start", job_id),
        30,
        message=lambda: f"the handler to start\n{workers.logs()}",
    )
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(STOP_TIMEOUT) == 0, proc.output()
    stage, _, history = later_db.job_row(job_id)
    assert stage == "enqueued", proc.output()
    assert history_stages(history)[-2:] == ["running", "enqueued"]
    assert later.get_job(job_id).attempts == 0
    assert "1 given back to run again at once" in proc.output()


def test_worker_process_second_signal_stops_handlers_now_and_gives_jobs_back(later_db, workers):
    """The first SIGINT says the grace period and what more signals do; the
    second ends the grace period at once: the async job is given back and
    the process exits cleanly."""
    proc = workers.start("--shutdown-timeout", "60", "-v", "1")
    workers.wait_registered(proc)
    job_id = later.enqueue(AsyncSleep(seconds=60))
    wait_until(
        lambda: read_records(workers.record, "asleep-start", job_id),
        30,
        message=lambda: f"the handler to start\n{workers.logs()}",
    )
    proc.proc.send_signal(signal.SIGINT)
    wait_until(lambda: "a second signal stops them now" in proc.output(), 10, proc.output)
    assert "up to 60s to finish" in proc.output()
    proc.proc.send_signal(signal.SIGINT)
    assert proc.proc.wait(STOP_TIMEOUT) == 0, proc.output()
    assert later_db.stage_of(job_id) == "enqueued", proc.output()
    assert read_records(workers.record, "asleep-end", job_id) == []


def test_worker_process_autoscale_option_starts(later_db, workers):
    """``--autoscale 1:3`` starts a server clamped to three workers that runs jobs."""
    proc = workers.start("--autoscale", "1:3", workers=None)
    workers.wait_registered(proc)
    assert later_db.scalar("SELECT workers FROM later_server WHERE pid = %s", [proc.pid]) == 3
    job_id = later.enqueue(Noop(n=1))
    workers.wait_stage(job_id, "success", 30)
    assert proc.stop() == 0, proc.output()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--workers", "0"], "--workers"),
        (["--workers", "256"], "--workers"),
        (["--autoscale", "3:1"], "--autoscale"),
        (["--autoscale", "3"], "--autoscale"),
        (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
    ],
)
def test_worker_command_rejects_bad_options(later_db, args, option):
    """Bad option values exit non-zero with a message naming the option."""
    result = subprocess.run(
        [*WORKER_ARGS, *args],
        cwd=PROJECT_DIR,
        env=later_db.worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert option in result.stderr, result.stderr
    assert later_db.scalar("SELECT COUNT(*) FROM later_server") == 0, "no server started"
