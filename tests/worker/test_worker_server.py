"""The worker Server in this process: executor, retries, worker count, maintenance, shutdown.

Each test drives a ``Server`` with ``asyncio.run`` on SQLite and on PostgreSQL
(the ``later_db`` fixture). Django's ORM refuses to run on the event loop's
thread, so every database call from the test goes through ``in_thread()``, a
worker thread that closes its connection afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from datetime import timedelta
from typing import Any

import msgpack
import pytest
from django.db import connections, transaction

import later_django as later
from later_django import RetryPolicy, events
from later_django.clock import now_ms
from later_django.threaded_store import ThreadedStore
from later_django.worker import handler_threads
from later_django.worker import workers as workers_module
from later_django.worker.server import Server
from later_django.worker.workers import MAX_WORKERS
from tests.helpers import (
    await_record,
    await_stage,
    await_until,
    history_stages,
    in_thread,
    job_info,
    job_row_locked,
    job_stages,
    read_records,
    serve,
    set_later,
)
from tests.jobapp.jobs import (
    AsyncExits,
    AsyncHold,
    AsyncNoop,
    AsyncOverrun,
    AsyncSnoozy,
    AsyncStoppable,
    CallablePolicy,
    CancelledThen,
    DefaultPolicy,
    Exits,
    Flaky,
    Noop,
    NoRetry,
    Overrun,
    Rendezvous,
    Sleep,
    Snoozy,
    Stoppable,
)

FAST_RETRY = RetryPolicy.fixed(1, timedelta(milliseconds=50))


# -- executor -----------------------------------------------------------------
def test_server_sync_handler_does_not_block_async_jobs(later_db, record):
    """A sync handler sleeping 2 s runs in a thread; an async job finishes meanwhile."""

    async def body(server: Server) -> None:
        sleep_id = await in_thread(later.enqueue, Sleep(seconds=2))
        sleep_start = await await_record(record, "sleep-start", sleep_id)
        async_id = await in_thread(later.enqueue, AsyncNoop(n=1))
        async_info = await await_stage(async_id, "success")
        await await_stage(sleep_id, "success")
        sleep_end = read_records(record, "sleep-end", sleep_id)[0]
        finished = async_info.finished_at.timestamp()
        assert sleep_start.start <= finished < sleep_end.start - 1.0, (
            sleep_start, finished, sleep_end,
        )  # fmt: skip

    serve(body, workers=2)


def test_server_flaky_job_succeeds_on_second_attempt(later_db, record):
    """A job failing once is requeued, promoted and succeeds on attempt 2."""

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, Flaky(succeed_on=2))
        info = await await_stage(job_id, "success")
        assert info.attempts == 2
        assert job_stages(info) == [
            "enqueued", "running", "requeued", "enqueued", "running", "success",
        ]  # fmt: skip
        assert [r.attempt for r in read_records(record, "flaky", job_id)] == [1, 2]

    serve(body)


@pytest.mark.parametrize("snoozy", [Snoozy, AsyncSnoozy], ids=["sync", "async"])
def test_server_snoozed_job_runs_again_after_its_delay_with_its_attempt_unchanged(
    later_db, record, snoozy
):
    """Snooze puts the job back to delayed, due after its delay; the
    attempt is not counted (its no-retry policy would fail it otherwise)."""

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, snoozy(times=2, delay_ms=300))
        info = await await_stage(job_id, "success")
        runs = read_records(record, "snoozy", job_id)
        assert [run.attempt for run in runs] == [1, 1, 1]
        assert info.attempts == 1
        assert job_stages(info) == [
            "enqueued", "running", "delayed", "enqueued", "running", "delayed",
            "enqueued", "running", "success",
        ]  # fmt: skip
        # Each run starts no sooner than the delay after the one before it
        # (a millisecond of rounding between the two clocks allowed).
        gaps = [b.start - a.start for a, b in itertools.pairwise(runs)]
        assert min(gaps) >= 0.299, gaps

    serve(body)


@pytest.mark.parametrize("overrun", [Overrun, AsyncOverrun], ids=["sync", "async"])
def test_server_attempt_past_its_timeout_fails_and_follows_the_retry_policy(
    later_db, record, overrun
):
    """@job(timeout=300 ms): each attempt that runs longer is stopped (an
    async handler cancelled, a sync one told through ctx.cancel_requested and
    abandoned) and fails with JobTimeout; one retry, then failed."""

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, overrun(seconds=5))
        info = await await_stage(job_id, "failed", timeout=15)
        assert info.attempts == 2
        assert job_stages(info) == [
            "enqueued", "running", "requeued", "enqueued", "running", "failed",
        ]  # fmt: skip
        assert info.last_error.startswith(
            "JobTimeout: the attempt ran past the job's timeout of 0.3 s"
        )
        starts = read_records(record, "overrun-start", job_id)
        assert [run.attempt for run in starts] == [1, 2]
        told = await await_record(record, "overrun-told", job_id)
        assert told.attempt in (1, 2)

    serve(body, workers=2)


def test_server_sync_handlers_waiting_on_each_other_all_get_a_thread(later_db, record, tmp_path):
    """Sync handlers start one thread at a time; four that can only end
    together (each waits for the others to start) still all run at once,
    and succeed: the handler threads grow while the process is idle."""

    async def body(server: Server) -> None:
        ids = [
            await in_thread(later.enqueue, Rendezvous(path=str(tmp_path), parties=4))
            for _ in range(4)
        ]
        for job_id in ids:
            await await_stage(job_id, "success", timeout=15)

    serve(body, workers=4)


def test_server_sync_job_that_waits_its_whole_timeout_for_a_thread_never_starts(
    later_db, record, monkeypatch, caplog
):
    """A sync job whose timeout passes while it waits for a handler thread
    (here the one thread is held and the limit kept) ends JobTimeout as any
    attempt past its timeout, and its handler never starts."""
    monkeypatch.setattr(handler_threads, "WINDOW", 60.0)  # the limit stays one thread

    async def body(server: Server) -> None:
        holder = await in_thread(later.enqueue, Stoppable(seconds=10))
        await await_record(record, "stoppable-start", holder)
        job_id = await in_thread(later.enqueue, Overrun(seconds=0.1))
        info = await await_stage(job_id, "failed", timeout=15)
        assert info.attempts == 2
        assert info.last_error.startswith("JobTimeout: the attempt ran past the job's timeout")
        assert read_records(record, "overrun-start", job_id) == []
        assert "waited its whole timeout of 300 ms for a handler thread" in caplog.text
        assert await in_thread(later.cancel, holder) is True
        await await_stage(holder, "cancelled", timeout=8)

    with caplog.at_level(logging.WARNING, logger="later_django"):
        serve(body, workers=2)


def test_server_enqueue_timeout_overrides_the_handlers(later_db, record):
    """enqueue(timeout=) wins over @job(timeout=): 5 s lets the 1 s handler finish."""

    async def body(server: Server) -> None:
        job_id = await in_thread(
            later.enqueue, AsyncOverrun(seconds=1), timeout=timedelta(seconds=5)
        )
        info = await await_stage(job_id, "success", timeout=15)
        assert info.attempts == 1

    serve(body)


@pytest.mark.parametrize("stoppable", [Stoppable, AsyncStoppable], ids=["sync", "async"])
def test_server_cancel_of_a_running_job_stops_it_for_good(later_db, record, stoppable):
    """cancel() of a running job: its server finds the request (a look at
    the database, no notification), stops the handler (async cancelled,
    sync told through ctx.cancel_requested), and the job ends cancelled,
    never retried, its waiting continuation failed as "parent cancelled"."""

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, stoppable(seconds=10))
        child = await in_thread(later.enqueue_continue, job_id, Noop(n=1))
        await await_record(record, "stoppable-start", job_id)
        assert await in_thread(later.cancel, job_id) is True
        info = await await_stage(job_id, "cancelled", timeout=8)
        assert job_stages(info) == ["enqueued", "running", "cancelled"]
        await await_record(record, "stoppable-told", job_id)
        child_info = await await_stage(child, "failed")
        assert child_info.last_error == "parent cancelled"
        assert len(read_records(record, "stoppable-start", job_id)) == 1

    serve(body, workers=2)


@pytest.mark.parametrize("then", ["retry", "snooze", "fail"])
def test_server_an_attempt_ended_after_a_cancel_is_stored_and_reported_cancelled(
    later_db, record, caplog, then
):
    """cancel() asked the job to stop before its worker looked: the retry,
    the snooze or the failure its attempt then ends with is stored as a
    cancel (never run again, its continuation "parent cancelled"), and the
    log, JobFinished and the outcome counts say cancelled."""
    finished: list[events.JobFinished] = []
    unsubscribe = events.subscribe(finished.append, events.JobFinished)
    counts: list[tuple[int, int, int, int]] = []
    ids: list[str] = []

    async def body(server: Server) -> None:
        job_id, child = await in_thread(_with_continuation, CancelledThen(then=then))
        ids.append(job_id)
        info = await await_stage(job_id, "cancelled")
        assert job_stages(info) == ["enqueued", "running", "cancelled"]
        assert (await await_stage(child, "failed")).last_error == "parent cancelled"
        await await_until(lambda: _async_true(finished), 5, "the JobFinished event")
        counts.append(server.completer.outcomes.take())
        assert len(read_records(record, "cancelled-then", job_id)) == 1

    caplog.set_level(logging.INFO, logger="later_django")
    try:
        serve(body)
    finally:
        unsubscribe()
    assert [(e.job_id, e.outcome) for e in finished] == [(ids[0], "cancelled")]
    assert counts == [(0, 0, 0, 0)], "a cancel is neither a failure nor a retry"
    said = [r.getMessage() for r in caplog.records if r.name == "later_django.worker.completer"]
    assert any("cancelled on attempt 1" in line for line in said), said
    assert not any("retrying" in line or "snoozed" in line for line in said), said


async def _async_true(items: list[object]) -> bool:
    return bool(items)


def _with_continuation(payload: object) -> tuple[str, str]:
    """Enqueue ``payload`` and a continuation of it, committed together (no
    worker can finish the first before the second is written)."""
    with transaction.atomic():
        job_id = later.enqueue(payload)
        return job_id, later.enqueue_continue(job_id, Noop(n=1))


@pytest.mark.parametrize("exits", [Exits, AsyncExits], ids=["sync", "async"])
def test_server_a_handler_calling_sys_exit_fails_its_job_and_the_worker_goes_on(
    later_db, record, exits
):
    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, exits(code=3))
        info = await await_stage(job_id, "failed")
        assert info.last_error.startswith("SystemExit: 3")
        after = await in_thread(later.enqueue, Noop(n=1))
        await await_stage(after, "success")

    serve(body)


def test_snooze_refuses_what_is_not_a_delay():
    with pytest.raises(TypeError, match="Snooze\\(delay\\) takes a datetime.timedelta, got int"):
        later.Snooze(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is negative"):
        later.Snooze(timedelta(seconds=-1))


def test_server_no_retry_policy_fails_after_one_attempt(later_db, record):
    """A per-type no-retry policy fails the job at once and stores the error."""

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, NoRetry())
        info = await await_stage(job_id, "failed")
        assert info.attempts == 1
        assert job_stages(info) == ["enqueued", "running", "failed"]
        assert "ValueError: refused once and for all" in info.last_error
        assert len(read_records(record, "noretry", job_id)) == 1

    serve(body)


def test_server_callable_policy_is_resolved_once_and_stored(later_db, record):
    """A callable policy is resolved after the first failure and stored on the row."""
    expected = RetryPolicy.fixed(1, timedelta(milliseconds=50)).to_json()

    job_id = later.enqueue(CallablePolicy(retries=1))
    assert later_db.job_field(job_id, "retry_policy") is None, "unknown until the first failure"

    async def body(server: Server) -> None:
        info = await await_stage(job_id, "failed")
        assert info.attempts == 2
        assert job_stages(info) == [
            "enqueued", "running", "requeued", "enqueued", "running", "failed",
        ]  # fmt: skip
        assert await in_thread(later_db.job_field, job_id, "retry_policy") == expected
        assert "always fails" in info.last_error
        assert [r.attempt for r in read_records(record, "callable", job_id)] == [1, 2]

    serve(body)


def test_server_default_retry_policy_setting_applies(later_db, record, settings):
    """DEFAULT_RETRY_POLICY replaces the built-in policy for types without their own."""
    set_later(settings, DEFAULT_RETRY_POLICY=FAST_RETRY)

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, DefaultPolicy())
        info = await await_stage(job_id, "failed")
        assert info.attempts == 2
        assert "fails under the default policy" in info.last_error
        assert [r.attempt for r in read_records(record, "default", job_id)] == [1, 2]

    serve(body)


def test_server_retries_exhausted_fail_with_last_error(later_db, record):
    """After its last retry a job is failed with the last attempt's error message."""

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, Flaky(succeed_on=0, message="boom-31337"))
        info = await await_stage(job_id, "failed")
        assert info.attempts == 3  # Flaky retries twice
        assert job_stages(info).count("requeued") == 2
        assert "RuntimeError: boom-31337 (attempt 3)" in info.last_error
        assert [r.attempt for r in read_records(record, "flaky", job_id)] == [1, 2, 3]

    serve(body)


def test_server_bad_input_fails_jobs_and_worker_keeps_running(later_db, record, settings):
    """Undecodable payloads fail at once, unknown types follow the policy; workers survive."""
    set_later(settings, DEFAULT_RETRY_POLICY=RetryPolicy.fixed(2, timedelta(0)))
    garbage = later.enqueue(Noop(n=1))
    missing = later.enqueue(Sleep(seconds=1))
    gone = later.enqueue(Noop(n=2))
    with connections[later_db.alias].cursor() as cursor:
        cursor.execute("UPDATE later_job SET payload = %s WHERE id = %s", [b"\xc1", garbage])
        cursor.execute(
            "UPDATE later_job SET payload = %s WHERE id = %s", [msgpack.packb({"n": 1}), missing]
        )
        cursor.execute("UPDATE later_job SET type_name = 'gone.Type' WHERE id = %s", [gone])

    async def body(server: Server) -> None:
        for job_id, fragment in ((garbage, "does not decode"), (missing, "seconds")):
            info = await await_stage(job_id, "failed")
            assert info.attempts == 1
            assert job_stages(info) == ["enqueued", "running", "failed"]
            assert fragment in info.last_error
        assert read_records(record, "noop", garbage) == []
        assert read_records(record, "sleep-start", missing) == []

        info = await await_stage(gone, "failed")
        assert info.attempts == 3
        assert job_stages(info).count("requeued") == 2
        assert info.last_error == "no handler for gone.Type"

        after = await in_thread(later.enqueue, Noop(n=3))
        await await_stage(after, "success")
        assert server.worker_count == 2

    serve(body)


# -- continuations and delays ---------------------------------------------------
def test_server_continuation_runs_after_parent_succeeds(later_db, record):
    """A child waits for its parent, then runs once the parent succeeded."""

    def enqueue_pair() -> tuple[str, str]:
        with transaction.atomic(using=later_db.alias):
            parent = later.enqueue(Noop(n=1))
            child = later.enqueue_continue(parent, Noop(n=2))
        return parent, child

    async def body(server: Server) -> None:
        parent, child = await in_thread(enqueue_pair)
        child_info = await await_stage(child, "success")
        parent_info = await job_info(parent)
        assert job_stages(child_info) == ["waiting", "enqueued", "running", "success"]
        assert child_info.started_at >= parent_info.finished_at
        parent_run = read_records(record, "noop", parent)[0]
        child_run = read_records(record, "noop", child)[0]
        assert parent_run.start <= child_run.start

    serve(body)


def test_server_continuation_fails_when_parent_fails(later_db, record):
    """A terminal parent failure fails waiting children and grandchildren unrun."""

    def enqueue_chain() -> tuple[str, str, str]:
        with transaction.atomic(using=later_db.alias):
            parent = later.enqueue(NoRetry())
            child = later.enqueue_continue(parent, Noop(n=1))
            grandchild = later.enqueue_continue(child, Noop(n=2))
        return parent, child, grandchild

    async def body(server: Server) -> None:
        parent, child, grandchild = await in_thread(enqueue_chain)
        await await_stage(parent, "failed")
        for job_id in (child, grandchild):
            info = await await_stage(job_id, "failed")
            assert info.last_error == "parent failed"
            assert info.attempts == 0
            assert job_stages(info) == ["waiting", "failed"]
        assert read_records(record, "noop") == []

    serve(body)


def test_server_delayed_job_runs_after_its_time(later_db, record):
    """A delayed job is promoted by maintenance and never starts before run_at."""

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue_delayed, AsyncNoop(n=7), timedelta(milliseconds=300))
        assert (await job_info(job_id)).stage == "delayed"
        info = await await_stage(job_id, "success")
        assert job_stages(info) == ["delayed", "enqueued", "running", "success"]
        run_at = info.run_at.timestamp()
        assert info.started_at.timestamp() >= run_at
        assert read_records(record, "async", job_id)[0].start >= run_at

    serve(body)


# -- claims, completions and the worker count ---------------------------------
def test_server_claim_error_backs_off_and_recovers(later_db, record, monkeypatch):
    """A failing claim backs off instead of spinning, and the worker recovers."""
    monkeypatch.setattr(workers_module, "CLAIM_ERROR_BACKOFF", 0.2)
    attempts: list[float] = []

    def patch_claim(server: Server) -> None:
        original = server.queues[0].claimer.claim

        async def claim_fails_thrice() -> Any:
            attempts.append(time.monotonic())
            if len(attempts) <= 3:
                raise RuntimeError("database unavailable")
            return await original()

        server.queues[0].claimer.claim = claim_fails_thrice  # type: ignore[method-assign]

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, Noop(n=1))
        await await_stage(job_id, "success")
        gaps = [b - a for a, b in zip(attempts[:3], attempts[1:4], strict=True)]
        assert min(gaps) >= 0.09, gaps  # the jitter's floor is 0.5 x the 0.2 s backoff

    serve(body, workers=1, before_start=patch_claim)


def test_server_retries_storing_a_success_the_database_refused(later_db, record, caplog):
    """A batch completion that fails (e.g. the database restarting) is stored
    again with backoff; the job does not run twice and the worker goes on."""
    calls: list[int] = []

    def patch_completion(server: Server) -> None:
        original = server.completer.sessions.complete_many

        async def fails_once(**kwargs: Any) -> Any:
            calls.append(len(kwargs["jobs"]))
            if len(calls) == 1:
                raise RuntimeError("server closed the connection unexpectedly")
            return await original(**kwargs)

        server.completer.sessions.complete_many = fails_once  # type: ignore[method-assign]

    async def body(server: Server) -> None:
        first = await in_thread(later.enqueue, AsyncNoop(n=1))
        info = await await_stage(first, "success")
        second = await in_thread(later.enqueue, AsyncNoop(n=2))
        await await_stage(second, "success")
        assert info.attempts == 1
        assert len(calls) >= 3, calls

        # The stage is visible once the batch commits, a moment before the
        # completer hears back from the database.
        async def all_stored() -> bool:
            return not server.completer.unstored

        await await_until(all_stored, 10, "every outcome stored")

    serve(body, workers=1, before_start=patch_completion)
    assert "could not store the outcome of job" in caplog.text


def test_server_wakeup_during_claim_is_not_missed(later_db, record, settings):
    """A commit while an idle worker's claim is in flight makes it claim again at once."""
    # Polling that never comes within the test: only the in-process wake-up can help.
    set_later(settings, POLL_INTERVAL=timedelta(minutes=10))
    enqueued: list[str] = []

    def patch(server: Server) -> None:
        # No LISTEN or commit-watching backstop either.
        server.notifier.listen = server.notifier.watch = False
        original = server.queues[0].claimer.claim

        async def claim_then_enqueue() -> Any:
            job = await original()
            if job is None and not enqueued:
                # Commits (and wakes the server) after this claim found nothing.
                enqueued.append(await in_thread(later.enqueue, Noop(n=1)))
            return job

        server.queues[0].claimer.claim = claim_then_enqueue  # type: ignore[method-assign]

    async def body(server: Server) -> None:
        async def was_enqueued() -> bool:
            return bool(enqueued)

        await await_until(was_enqueued, 10, "the racing enqueue")
        info = await await_stage(enqueued[0], "success", timeout=10)
        assert info.attempts == 1

    serve(body, workers=1, before_start=patch)


def test_server_add_and_remove_worker_change_count(later_db, record):
    """add_worker and remove_worker change worker_count; at least one worker remains."""

    async def body(server: Server) -> None:
        assert server.worker_count == 2
        assert await server.add_worker() == 3
        assert await server.remove_worker() == 2
        assert await server.remove_worker() == 1
        assert await server.remove_worker() == 1
        assert server.worker_count == 1
        assert len(server.slots) == 1
        job_id = await in_thread(later.enqueue, Noop(n=1))
        await await_stage(job_id, "success")

    serve(body, workers=2)


def test_server_remove_worker_waits_for_current_job(later_db, record):
    """remove_worker on busy workers returns once the removed worker's job committed."""

    async def body(server: Server) -> None:
        ids = await in_thread(
            later.enqueue_many, [Sleep(seconds=0.5, n=1), Sleep(seconds=0.5, n=2)]
        )

        async def both_busy() -> bool:
            return sorted(str(slot.current_job) for slot in server.slots) == sorted(ids)

        await await_until(both_busy, 10, "each worker to run one sleep job")
        removed = server.slots[-1]
        running = removed.current_job
        assert running is not None
        assert await server.remove_worker() == 1
        assert (await job_info(running)).stage == "success"
        assert removed not in server.slots

    serve(body, workers=2)


def test_server_add_worker_refuses_above_limit(later_db, record):
    """A server runs at most 255 workers; add_worker beyond that raises ValueError."""

    def idle_claims(server: Server) -> None:
        # 255 real claims would need 255 PostgreSQL connections; the limit is what counts.
        async def no_job() -> None:
            return None

        server.queues[0].claimer.claim = no_job  # type: ignore[method-assign]

    async def body(server: Server) -> None:
        while server.worker_count < MAX_WORKERS:
            await server.add_worker()
        assert server.worker_count == MAX_WORKERS
        with pytest.raises(ValueError, match="255"):
            await server.add_worker()
        assert server.worker_count == MAX_WORKERS

    serve(body, workers=1, before_start=idle_claims)


@pytest.mark.parametrize("count", [0, MAX_WORKERS + 1])
def test_server_rejects_bad_worker_count(count):
    """Server refuses a worker count outside 1..255."""

    async def build() -> None:
        Server(workers=count)

    with pytest.raises(ValueError, match="workers must be 1..255"):
        asyncio.run(build())


def test_autoscale_clamps_initial_workers_to_bounds():
    """The initial worker count is clamped into the autoscale bounds."""

    async def build() -> tuple[int, int]:
        return (
            Server(workers=8, autoscale=(1, 3)).initial_workers,
            Server(workers=1, autoscale=(2, 4)).initial_workers,
        )

    assert asyncio.run(build()) == (3, 2)


# -- maintenance ------------------------------------------------------------------
def _boom(*args: object) -> int:
    raise RuntimeError("step exploded")


def _make_due_delayed(later_db: Any) -> str:
    job_id = later.enqueue_delayed(Noop(n=1), timedelta(hours=1))
    with connections[later_db.alias].cursor() as cursor:
        cursor.execute("UPDATE later_job SET run_at_ms = %s WHERE id = %s", [now_ms() - 1, job_id])
    return job_id


def _make_expired_success(later_db: Any) -> str:
    job_id = later.enqueue(Noop(n=2))
    past = now_ms() - 1000
    with connections[later_db.alias].cursor() as cursor:
        cursor.execute(
            "UPDATE later_job SET stage = 'success', finished_ms = %s, expires_ms = %s "
            "WHERE id = %s",
            [past, past, job_id],
        )
    return job_id


def test_maintenance_failing_step_does_not_stop_others(later_db):
    """A step that raises is reported; the steps before and after it still run."""

    async def main() -> None:
        server = Server(workers=1)
        maintenance = server.maintenance
        maintenance.steps["rescue_stuck"] = _boom
        try:
            for _ in range(2):
                due = await in_thread(_make_due_delayed, later_db)
                expired = await in_thread(_make_expired_success, later_db)
                results = await maintenance.run_once()
                assert isinstance(results["rescue_stuck"], RuntimeError)
                assert str(results["rescue_stuck"]) == "step exploded"
                assert results["promote_due"] == 1
                assert results["prune_expired"] >= 1
                assert set(results) == {
                    "fire_schedules", "promote_due", "rescue_stuck", "resolve_orphans",
                    "prune_expired", "compact_counters", "vacuum", "prune_retained_log",
                    "sample_queue",
                }  # fmt: skip
                assert (await job_info(due)).stage == "enqueued"
                assert await in_thread(later.get_job, expired) is None
            assert maintenance.ticks == 2
        finally:
            await server.shutdown(1)

    asyncio.run(main())


def test_maintenance_loop_survives_failing_step(later_db, record):
    """The maintenance service keeps ticking and promoting while one step fails."""

    def break_step(server: Server) -> None:
        server.maintenance.steps["prune_expired"] = _boom

    async def body(server: Server) -> None:
        due = await in_thread(_make_due_delayed, later_db)
        await await_stage(due, "success")

        async def ticked() -> bool:
            return server.maintenance.ticks >= 3

        await await_until(ticked, 10, "three maintenance ticks")
        task = server.services.task("maintenance")
        assert task is not None and not task.done()

    serve(body, workers=1, before_start=break_step)


def test_server_shutdown_deregisters_and_stops_workers(later_db, record, monkeypatch):
    """shutdown() stops the workers, deregisters the server and closes its connections."""
    used: set[Any] = set()
    run_in_thread = ThreadedStore._run_in_thread

    def tracking(self: ThreadedStore, *args: Any) -> Any:
        used.add(connections[self.alias])
        return run_in_thread(self, *args)

    monkeypatch.setattr(ThreadedStore, "_run_in_thread", tracking)

    async def main() -> None:
        server = Server(workers=2)
        await server.start()
        assert await in_thread(later_db.scalar, "SELECT workers FROM later_server") == 2
        job_id = await in_thread(later.enqueue, AsyncNoop(n=1))
        await await_stage(job_id, "success")
        await server.shutdown(5)
        assert server.closed.is_set()
        assert all(slot.task is not None and slot.task.done() for slot in server.slots)
        assert await in_thread(later_db.scalar, "SELECT COUNT(*) FROM later_server") == 0
        assert used, "the server used pool connections"
        assert [c for c in used if c.connection is not None] == [], "all closed"

    asyncio.run(main())


def test_server_shutdown_ends_outcome_stores_and_never_reconnects(
    later_db, record, settings, monkeypatch
):
    """An outcome still being stored at the shutdown deadline is abandoned
    with its session: after shutdown nothing writes for that server."""
    set_later(settings, LEASE_DURATION=timedelta(seconds=30))
    if later_db.vendor == "sqlite":
        # The server's leaving waits for the test's write lock: on the
        # server's new connections, for 2 s rather than the suite's 20.
        options = connections.settings[later_db.alias]["OPTIONS"]
        monkeypatch.setitem(options, "timeout", 2)
    job_id = later.enqueue(AsyncHold(seconds=0.2))

    async def main() -> Any:
        server = Server(workers=1)
        await server.start()
        await await_record(record, "hold-start", job_id)
        with job_row_locked(later_db, job_id):
            await await_record(record, "hold-end", job_id)

            async def storing() -> bool:
                return server.completer._completions.flush_started is not None

            # The completion is sent; it waits for the lock.
            await await_until(storing, 10, "the completion of the job to be sent")
            await server.shutdown(0.5)
        # The lock is gone: a store that outlived shutdown would write now.
        # Nothing can say when it would have: watch for it for a second.
        await asyncio.sleep(1.0)
        current = asyncio.current_task()
        return server, [t for t in asyncio.all_tasks() if t is not current and not t.done()]

    server, left = asyncio.run(main())
    assert later_db.stage_of(job_id) == "running", "nothing stored after shutdown"
    assert left == []
    for sessions in (server.queues[0].claimer.sessions, server.completer.sessions):
        session = sessions.postgres or sessions.sqlite
        assert session is not None and session.closed


def test_shutdown_gives_back_jobs_whose_async_handlers_it_stopped(later_db, record):
    """Past the shutdown deadline an async handler is cancelled and its job
    is enqueued again at once, the attempt not counted; a sync handler
    cannot be stopped, so its job keeps its lease for the stuck-job
    recovery."""
    held = later.enqueue(AsyncHold(seconds=60, then=60))
    slept = later.enqueue(Sleep(seconds=3))

    async def main() -> None:
        server = Server(workers=2)
        await server.start()
        await await_record(record, "hold-start", held)
        await await_record(record, "sleep-start", slept)
        await server.shutdown(0.2)

    asyncio.run(main())
    stage, attempts, history = later_db.job_row(held)
    assert (stage, history_stages(history)[-2:]) == ("enqueued", ["running", "enqueued"])
    assert later.get_job(held).attempts == 0
    assert later_db.stage_of(slept) == "running"


def test_shutdown_deadline_tells_a_sync_handler_it_stopped_waiting(later_db, record):
    """Past the shutdown deadline the server stops waiting for a sync
    handler, whose thread goes on: its ``ctx.cancel_requested`` is set, as
    on a timeout or cancel(), so the handler can stop."""
    job_id = later.enqueue(Stoppable(seconds=30))

    async def main() -> None:
        server = Server(workers=1)
        await server.start()
        await await_record(record, "stoppable-start", job_id)
        await server.shutdown(0.2)
        told = await await_record(record, "stoppable-told", job_id)
        assert told.attempt == 1

    asyncio.run(main())
    assert later_db.stage_of(job_id) == "running", "its lease recovers it"
