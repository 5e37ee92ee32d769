"""The job engine (``dialect.jobs``): enqueue, the worker's hot path and its
fenced writes, maintenance, tracing, wake-ups, an operator's actions on
jobs, the Tasks backend's results and the stage counters' folding.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from django.db import connections, transaction

from later_django.db.rows import (
    ClaimRequest,
    Completion,
    ExpiredFence,
    FailureWrite,
    FanInInsert,
    LeftAs,
    Orphan,
    OwnerFence,
    RetryWrite,
    StuckJob,
    SuccessBatch,
    TaskAttemptEnd,
)
from later_django.ids import new_job_id
from later_django.states import PARENT_CANCELLED, PARENT_FAILED, Stage
from later_django.types import Claim, ClaimedJob, NewJob
from tests.conformance.helpers import (
    DAY_MS,
    HOUR_MS,
    LEASE_MS,
    NS,
    OWNER,
    age,
    assert_counts,
    claim,
    claim_head,
    claim_one,
    complete,
    cursor_of,
    db_now,
    fan_in_rows,
    finish_unseen,
    insert,
    insert_child,
    insert_fan_in,
    insert_partitioned,
    job_row,
    new_job,
    owned,
    stages,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


# -- enqueue ----------------------------------------------------------------------------


def test_job_insert_one_decides_ready_or_delayed_by_the_database_clock(later_db, dialect):
    """A job is ready unless it is due later than the database's now; its
    times are the database's, taken by the insert."""
    db = connections[later_db.alias]
    before = db_now(later_db)
    ready, delayed = new_job(priority=5, retry_policy='{"max": 2}'), new_job(delay_ms=HOUR_MS)
    past, future = new_job(run_at_ms=before - HOUR_MS), new_job(run_at_ms=before + DAY_MS)
    assert [dialect.jobs.job_insert_one(db, job) for job in (ready, delayed, past, future)] == [
        "enqueued",
        "delayed",
        "enqueued",
        "delayed",
    ]
    after = db_now(later_db)
    rows = {job.id: job_row(later_db, job.id) for job in (ready, delayed, past, future)}
    for row in rows.values():
        assert before <= row["created_ms"] <= after
        assert row["changed_ms"] == row["created_ms"]
        assert row["attempts"] == 0 and row["lease_owner"] is None
        assert row["history"] == f"{row['stage']}@{row['created_ms']};"
    assert rows[ready.id]["run_at_ms"] == rows[ready.id]["created_ms"]
    assert (rows[ready.id]["priority"], rows[ready.id]["retry_policy"]) == (5, '{"max": 2}')
    assert rows[delayed.id]["run_at_ms"] == rows[delayed.id]["created_ms"] + HOUR_MS
    assert rows[past.id]["run_at_ms"] == rows[past.id]["created_ms"], "never due in the past"
    assert rows[future.id]["run_at_ms"] == before + DAY_MS
    assert_counts(later_db)


def test_job_insert_many_writes_every_job_ready_or_none(later_db, dialect):
    """A bulk insert writes every job ready, in more than one batch where the
    database needs batches; an error while the jobs are built writes none."""
    db = connections[later_db.alias]
    jobs = [new_job(payload=bytes([n % 256]) * (n % 7), priority=n % 3) for n in range(1200)]
    before = db_now(later_db)
    with transaction.atomic(using=later_db.alias):
        dialect.jobs.job_insert_many(db, iter(jobs))
    after = db_now(later_db)
    assert later_db.job_count() == len(jobs)
    stored = {
        str(r[0]): r[1:]
        for r in later_db.rows("SELECT id, stage, payload, priority, created_ms FROM later_job")
    }
    for job in jobs[:: len(jobs) // 10]:
        stage, payload, priority, created_ms = stored[job.id]
        assert (stage, bytes(payload), priority) == ("enqueued", job.payload, job.priority)  # type: ignore[call-overload]
        assert before <= created_ms <= after  # type: ignore[operator]
    job_row(later_db, jobs[0].id)
    assert_counts(later_db)

    def broken() -> Iterator[NewJob]:
        yield from (new_job() for _ in range(300))
        raise ValueError("payload 301 cannot be encoded")

    with pytest.raises(ValueError), transaction.atomic(using=later_db.alias):
        dialect.jobs.job_insert_many(db, broken())
    assert later_db.job_count() == len(jobs)
    assert_counts(later_db)


def test_job_insert_unique_writes_once_per_key_and_returns_the_holder(later_db, dialect):
    """A job with a unique key is written while no unfinished job of its
    type holds the key; otherwise nothing is written and the holder's id
    comes back. A window also holds it over finished jobs; a unique
    continuation of a missing parent writes nothing and returns None."""

    def put(**fields: object):
        job = new_job(**fields)
        with cursor_of(later_db, atomic=True) as c:
            return job.id, dialect.jobs.job_insert_unique(c, job, DAY_MS)

    first_id, first = put(unique_key="k")
    assert first == (first_id, "enqueued")
    again_id, again = put(unique_key="k", delay_ms=HOUR_MS)
    assert again == (first_id, None)
    other_type_id, other_type = put(unique_key="k", type_name="conformance.Other")
    assert other_type == (other_type_id, "enqueued")
    windowed_id, windowed = put(unique_key="w", unique_for_ms=HOUR_MS)
    assert windowed == (windowed_id, "enqueued")
    slot = int(later_db.job_field(windowed_id, "unique_slot_ms"))
    assert slot % HOUR_MS == 0 and slot <= db_now(later_db) < slot + HOUR_MS
    claimed = claim(later_db, limit=10)
    done = [(job.id, job.attempts) for job in claimed if job.id in (first_id, windowed_id)]
    assert sorted(complete(later_db, done).done_ids) == sorted([first_id, windowed_id])
    assert put(unique_key="w", unique_for_ms=HOUR_MS)[1] == (windowed_id, None)
    freed_id, freed = put(unique_key="k")
    assert freed == (freed_id, "enqueued"), "a finished job frees its key"
    orphan_id, orphan = put(unique_key="c", parent_id=new_job_id())
    assert orphan is None
    for unwritten in (again_id, orphan_id):
        assert not later_db.rows("SELECT 1 FROM later_job WHERE id = %s", [unwritten])
    assert_counts(later_db)


def test_job_insert_continuation_follows_its_parent(later_db, dialect):
    """A child waits for a parent that has not finished, is ready after one
    that succeeded, and fails after one that failed or was cancelled; with
    no parent in the namespace nothing is inserted."""
    running, succeeded, failed = insert(later_db), insert(later_db), insert(later_db)
    cancelled, elsewhere = insert(later_db), insert(later_db, namespace="other")
    first = claim(later_db, limit=3)
    by_id = {job.id: job for job in first}
    assert complete(later_db, [(succeeded, 1)]).done_ids == [succeeded]
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_fail(
            c, owned(by_id[failed]), FailureWrite(error="x", retention_ms=1)
        )
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=cancelled, retention_ms=DAY_MS)
    assert running in by_id

    children = {
        parent: insert_child(later_db, parent, retention_ms=HOUR_MS)
        for parent in (running, succeeded, failed, cancelled)
    }
    assert {parent: stage for parent, (_, stage) in children.items()} == {
        running: "waiting",
        succeeded: "enqueued",
        failed: "failed",
        cancelled: "failed",
    }
    for parent in (failed, cancelled):
        row = job_row(later_db, children[parent][0])
        assert row["last_error"] == PARENT_FAILED
        assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert job_row(later_db, children[running][0])["parent_id"] == running
    before = later_db.job_count()
    assert insert_child(later_db, new_job_id())[1] is None
    assert insert_child(later_db, elsewhere)[1] is None, "another namespace's parent"
    assert later_db.job_count() == before
    assert_counts(later_db)


def test_job_settle_child_releases_or_fails_a_child_its_parent_missed(later_db, dialect):
    """After its commit a waiting child looks at its parent: still running,
    it waits; finished meanwhile, it is released or failed with its own
    descendants."""
    parents = [insert(later_db) for _ in range(3)]
    claim(later_db, limit=3)
    children = [insert_child(later_db, parent)[0] for parent in parents]
    grandchild = insert_child(later_db, children[1])[0]
    # The parents finish without seeing the children (they were uncommitted).
    with cursor_of(later_db) as c:
        for parent, stage in zip(parents[:2], ("success", "cancelled"), strict=True):
            c.execute(
                "UPDATE later_job SET stage = %s, lease_owner = NULL, lease_expires_ms = NULL "
                "WHERE id = %s",
                [stage, parent],
            )
    before = db_now(later_db)
    settled = []
    for child in children:
        with cursor_of(later_db, atomic=True) as c:
            settled.append(dialect.jobs.job_settle_child(c, job_id=child, retention_ms=DAY_MS))
    after = db_now(later_db)
    assert settled == ["released", "failed", "waiting"]
    assert stages(later_db, *children, grandchild) == ["enqueued", "failed", "waiting", "failed"]
    released = job_row(later_db, children[0])
    assert before <= released["run_at_ms"] == released["changed_ms"] <= after
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    with cursor_of(later_db, atomic=True) as c:
        assert (
            dialect.jobs.job_settle_child(c, job_id=children[0], retention_ms=DAY_MS) == "waiting"
        )
    assert_counts(later_db)


def test_job_cancel_cancels_only_jobs_not_started(later_db, dialect):
    """Ready, delayed and waiting jobs are cancelled, with their waiting
    descendants failed; running (only asked to stop), finished and other
    namespaces' are not."""
    ready, delayed, running = insert(later_db), insert(later_db, delay_ms=HOUR_MS), insert(later_db)
    elsewhere = insert(later_db, namespace="other")
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_job SET priority = 100 WHERE id = %s", [running])
    claim_one(later_db, running)
    child = insert_child(later_db, ready)[0]
    grandchild = insert_child(later_db, child)[0]

    def cancel(job_id: str, namespace: str = NS) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.jobs.job_cancel(
                c, namespace=namespace, job_id=job_id, retention_ms=HOUR_MS
            )

    before = db_now(later_db)
    assert [cancel(ready), cancel(delayed)] == [True, True]
    after = db_now(later_db)
    assert [cancel(ready), cancel(elsewhere), cancel(new_job_id())] == [False] * 3
    assert cancel(running) is True, "a running job is asked to stop, not cancelled"
    assert stages(later_db, ready, delayed, running, elsewhere, child, grandchild) == [
        "cancelled",
        "cancelled",
        "running",
        "enqueued",
        "failed",
        "failed",
    ]
    row = job_row(later_db, ready)
    assert before <= row["finished_ms"] == row["changed_ms"] <= after
    assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    assert cancel(child) is False, "a failed job is finished"
    waiting = insert_child(later_db, running)[0]
    assert cancel(waiting) is True
    assert_counts(later_db)


# -- the worker's hot path --------------------------------------------------------------


def test_claim_takes_the_best_ready_jobs_and_leases_them(later_db, dialect):
    """A claim takes ready jobs of its namespace, highest priority first and
    then oldest, never more than its limit, and leases each to its owner
    until the database's now plus the lease."""
    low, high, mid = insert(later_db), insert(later_db, priority=9), insert(later_db, priority=5)
    newer_low = insert(later_db)
    insert(later_db, delay_ms=HOUR_MS)
    insert(later_db, namespace="other", priority=50)
    insert_child(later_db, low)
    before = db_now(later_db)
    first = claim(later_db, limit=2, owner="server-b", lease_ms=5_000)
    after = db_now(later_db)
    assert [job.id for job in first] == [high, mid]
    assert [job.id for job in claim(later_db, limit=5)] == [low, newer_low]
    assert claim(later_db, limit=5) == []
    job = first[0]
    row = job_row(later_db, high)
    assert isinstance(job, ClaimedJob)
    assert job == ClaimedJob(
        high, "conformance.Job", b"\x81\xa1n\x01", 1, None, row["created_ms"], row["run_at_ms"]
    )
    assert (row["stage"], row["attempts"], row["lease_owner"]) == ("running", 1, "server-b")
    assert before <= row["started_ms"] == row["changed_ms"] <= after
    assert before + 5_000 <= row["lease_expires_ms"] <= after + 5_000
    assert_counts(later_db)


def test_claim_pair_on_a_cursor_runs_everywhere_the_asyncio_pair_where_declared(later_db, dialect):
    """The claim and the batch completion run on a Django cursor on every
    vendor, in the caller's transaction (testing's drain()); their asyncio
    twins only where the dialect declares supports_async_connection."""
    job_id = insert(later_db)
    request = ClaimRequest(namespace=NS, owner=OWNER, limit=5, lease_ms=LEASE_MS)
    with cursor_of(later_db, atomic=True) as c:
        (job,) = dialect.jobs.job_claim(c, request)
        done = dialect.jobs.job_complete_many(
            c, SuccessBatch(owner=OWNER, jobs=[(job.id, job.attempts)], retention_ms=DAY_MS)
        )
    assert (job.id, done.done_ids) == (job_id, [job_id])
    assert stages(later_db, job_id) == ["success"]
    assert_counts(later_db)
    if not dialect.supports_async_connection:
        with cursor_of(later_db) as c:
            with pytest.raises(NotImplementedError):
                asyncio.run(dialect.jobs.ajob_claim(c, request))
            with pytest.raises(NotImplementedError):
                asyncio.run(
                    dialect.jobs.ajob_complete_many(
                        c, SuccessBatch(owner=OWNER, jobs=[], retention_ms=1)
                    )
                )


def test_complete_many_is_fenced_by_owner_and_attempt_per_claim(later_db, dialect):
    """Each claim of a batch succeeds only under its own owner and attempt;
    the waiting children of those that did become ready."""
    a, b, c_ = insert(later_db), insert(later_db), insert(later_db)
    claim(later_db, limit=3)
    child = insert_child(later_db, a)[0]
    assert complete(later_db, []) == Completion(done_ids=[], released=0)
    stranger = complete(later_db, [(a, 1), (b, 1)], owner="server-b")
    assert stranger == Completion(done_ids=[], released=0)
    before = db_now(later_db)
    done = complete(later_db, [(a, 1), (b, 2), (new_job_id(), 1)], retention_ms=HOUR_MS)
    after = db_now(later_db)
    assert done == Completion(done_ids=[a], released=1)
    assert stages(later_db, a, b, c_, child) == ["success", "running", "running", "enqueued"]
    row = job_row(later_db, a)
    assert before <= row["finished_ms"] == row["changed_ms"] <= after
    assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    assert before <= job_row(later_db, child)["run_at_ms"] <= after
    assert complete(later_db, [(a, 1)]).done_ids == [], "finished already"
    assert sorted(complete(later_db, [(b, 1), (c_, 1)]).done_ids) == sorted([b, c_])
    assert_counts(later_db)


# -- the worker's other writes, under the fence of a claim ------------------------------


def test_job_renew_extends_only_the_claims_still_held(later_db, dialect):
    """A renewal returns the claims its owner still holds, at the attempt
    held, and moves their leases to the database's now plus the lease."""
    a, b = insert(later_db), insert(later_db)
    claim(later_db, limit=2, lease_ms=1_000)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_renew(c, owner=OWNER, jobs=[], lease_ms=LEASE_MS) == []
        assert dialect.jobs.job_renew(c, owner="server-b", jobs=[(a, 1)], lease_ms=LEASE_MS) == []
        before = db_now(later_db)
        renewed = dialect.jobs.job_renew(
            c, owner=OWNER, jobs=[(a, 1), (b, 1), (a, 2), (new_job_id(), 1)], lease_ms=LEASE_MS
        )
        after = db_now(later_db)
    assert sorted(renewed) == sorted([Claim(a, 1), Claim(b, 1)])
    assert all(isinstance(held, Claim) for held in renewed)
    for job_id in (a, b):
        row = job_row(later_db, job_id)
        assert before + LEASE_MS <= row["lease_expires_ms"] <= after + LEASE_MS
        assert (row["stage"], row["attempts"]) == ("running", 1)
    assert_counts(later_db)


def test_job_unclaim_gives_a_claim_back_as_if_never_made(later_db, dialect):
    """Only the claim's own owner and attempt give it back: ready again,
    the attempt not counted, while attempts (the fence) keeps growing, so
    the given-back claim's writes never match the next claim."""
    job_id = insert(later_db)
    job = claim_one(later_db, job_id)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_unclaim(c, owned(job, owner="server-b")) is False
        assert (
            dialect.jobs.job_unclaim(c, OwnerFence(job_id=job_id, attempts=2, owner=OWNER)) is False
        )
        assert stages(later_db, job_id) == ["running"]
        assert dialect.jobs.job_unclaim(c, owned(job)) is True
        assert dialect.jobs.job_unclaim(c, owned(job)) is False
    row = job_row(later_db, job_id)
    assert (row["stage"], row["attempts"], row["uncounted"]) == ("enqueued", 1, 1)
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    again = claim_one(later_db, job_id)
    assert (again.attempts, again.attempt) == (2, 1)
    with cursor_of(later_db) as c:
        stale = [(job_id, job.attempts)]
        assert dialect.jobs.job_renew(c, owner=OWNER, jobs=stale, lease_ms=LEASE_MS) == []
        assert dialect.jobs.job_unclaim(c, owned(job)) is False
    assert stages(later_db, job_id) == ["running"]
    assert_counts(later_db)


def test_a_jobs_own_timeout_comes_back_with_its_claim(later_db, dialect):
    """An enqueue's timeout is stored with the job, in every lane and as a
    continuation, and each claim returns it (None: the handler decides)."""
    timed, plain = insert(later_db, timeout_ms=1500), insert(later_db)
    assert {job.id: job.timeout_ms for job in claim(later_db, limit=5)} == {
        timed: 1500,
        plain: None,
    }
    complete(later_db, [(timed, 1), (plain, 1)])
    child = new_job(parent_id=timed, timeout_ms=700)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_insert_continuation(c, child, DAY_MS) == "enqueued"
    assert [job.timeout_ms for job in claim(later_db)] == [700]
    head, _ = insert_partitioned(later_db, timeout_ms=2500)
    _, job = claim_head(later_db, "a")
    assert job is not None and (job.id, job.timeout_ms) == (head, 2500)
    assert_counts(later_db)


def test_a_cancel_request_marks_only_a_running_job_and_its_owner_finds_it(later_db, dialect):
    """job_cancel marks a running job once (its first time kept);
    job_cancel_requested lists the owner's marked claims only."""
    mine, theirs = insert(later_db), insert(later_db)
    job = claim_one(later_db, mine)
    claim_one(later_db, theirs, owner="server-b")
    ready = insert(later_db)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_cancel_requested(c, namespace=NS, owner=OWNER) == []
        assert (
            dialect.jobs.job_cancel(c, namespace="other", job_id=mine, retention_ms=DAY_MS) is False
        )
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=mine, retention_ms=DAY_MS) is True
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=theirs, retention_ms=DAY_MS) is True
        assert dialect.jobs.job_cancel_requested(c, namespace=NS, owner=OWNER) == [
            (mine, job.attempts)
        ]
    assert job_row(later_db, ready)["stage"] == "enqueued"
    assert_counts(later_db)


def test_job_cancel_cancels_a_waiting_job_asks_a_running_one_and_refuses_the_rest(
    later_db, dialect
):
    """job_cancel: a job not started is cancelled, a running one is asked
    to stop; False only for a finished or unknown one (or another
    namespace's)."""
    done = insert(later_db)
    complete(later_db, [(done, claim_one(later_db, done).attempts)])
    running = insert(later_db)
    claim_one(later_db, running)
    ready = insert(later_db)
    with cursor_of(later_db, atomic=True) as c:
        for job_id in (ready, running):
            assert dialect.jobs.job_cancel(c, namespace=NS, job_id=job_id, retention_ms=DAY_MS)
        for job_id in (done, new_job_id()):
            assert not dialect.jobs.job_cancel(c, namespace=NS, job_id=job_id, retention_ms=DAY_MS)
        assert not dialect.jobs.job_cancel(
            c, namespace="other", job_id=running, retention_ms=DAY_MS
        )
    assert stages(later_db, ready, running, done) == ["cancelled", "running", "success"]
    asked = "SELECT cancel_requested_ms FROM later_job WHERE id = %s"
    assert later_db.scalar(asked, [running]) is not None
    assert_counts(later_db)


def test_a_running_job_asked_to_stop_ends_cancelled_never_retried(later_db, dialect):
    """Once a cancel is requested, a retry, a snooze or a failure of the
    claim does not pass; job_cancel_running ends it cancelled under the claim's fence
    (owner, or the rescuer's expired one) and fails its waiting
    continuations as "parent cancelled". Without a request it changes nothing."""
    asked, unasked = insert(later_db), insert(later_db)
    child, _ = insert_child(later_db, asked)
    job, other = claim_one(later_db, asked), claim_one(later_db, unasked)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_cancel_running(c, owned(other), DAY_MS) is False
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=asked, retention_ms=DAY_MS) is True
        retry = RetryWrite(delay_ms=0, error="boom", retry_policy=None)
        assert dialect.jobs.job_retry(c, owned(job), retry) is False
        assert dialect.jobs.job_snooze(c, owned(job), 0) is False
        failure = FailureWrite(error="boom", retention_ms=DAY_MS)
        assert dialect.jobs.job_fail(c, owned(job), failure) is False
        assert dialect.jobs.job_unclaim(c, owned(job)) is False
        assert dialect.jobs.job_cancel_running(c, owned(job, owner="server-b"), DAY_MS) is False
        assert dialect.jobs.job_cancel_running(c, owned(job), DAY_MS) is True
        assert dialect.jobs.job_cancel_running(c, owned(job), DAY_MS) is False
    row = job_row(later_db, asked)
    assert (row["stage"], row["lease_owner"]) == ("cancelled", None)
    assert row["expires_ms"] == row["finished_ms"] + DAY_MS
    assert (job_row(later_db, child)["stage"], job_row(later_db, child)["last_error"]) == (
        "failed",
        PARENT_CANCELLED,
    )
    assert stages(later_db, unasked) == ["running"]
    # The rescuer: a stuck job asked to stop is reported so, and cancelled
    # under its expired fence.
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=unasked, retention_ms=DAY_MS) is True
    age(later_db, "lease_expires_ms", unasked, LEASE_MS + HOUR_MS)
    with cursor_of(later_db, atomic=True) as c:
        (stuck,) = dialect.jobs.job_stuck(c, namespace=NS, expired_for_ms=HOUR_MS, limit=10)
        assert (stuck.id, stuck.cancel_requested) == (unasked, True)
        fence = ExpiredFence(job_id=unasked, attempts=other.attempts, expired_for_ms=HOUR_MS)
        assert dialect.jobs.job_cancel_running(c, fence, DAY_MS) is True
    assert stages(later_db, unasked) == ["cancelled"]
    assert_counts(later_db)


def test_job_snooze_delays_a_claim_uncounted_under_its_fence(later_db, dialect):
    """A snooze is fenced like a retry: only the claim's owner and attempt
    move the job back to delayed, due after the delay by the database's
    clock, the claim not counted as an attempt."""
    job_id = insert(later_db)
    job = claim_one(later_db, job_id)
    before = db_now(later_db)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_snooze(c, owned(job, owner="server-b"), HOUR_MS) is False
        assert stages(later_db, job_id) == ["running"]
        assert dialect.jobs.job_snooze(c, owned(job), HOUR_MS) is True
        assert dialect.jobs.job_snooze(c, owned(job), HOUR_MS) is False
    after = db_now(later_db)
    row = job_row(later_db, job_id)
    assert (row["stage"], row["attempts"], row["uncounted"]) == ("delayed", 1, 1)
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    assert before + HOUR_MS <= row["run_at_ms"] <= after + HOUR_MS
    assert row["history"].split(";")[-2].startswith("delayed@")
    age(later_db, "run_at_ms", job_id, HOUR_MS + 1)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 1
    again = claim_one(later_db, job_id)
    assert (again.attempts, again.attempt) == (2, 1)
    assert_counts(later_db)


def test_job_claimed_since_lists_an_owners_recent_running_plain_claims(later_db, dialect):
    """What a claim abandoned mid-statement may have taken: the running
    plain jobs of one owner claimed within the window, by the database's
    clock."""
    old, recent = insert(later_db), insert(later_db)
    first = claim_one(later_db, old)
    age(later_db, "started_ms", old, 60_000)
    second = claim_one(later_db, recent)
    claim(later_db, owner="server-b", limit=5)  # nothing left
    insert_partitioned(later_db)
    claim_head(later_db, OWNER)  # a partition job: not the plain claim's
    with cursor_of(later_db) as c:
        within = dialect.jobs.job_claimed_since(c, since_request(NS, OWNER), within_ms=30_000)
        assert within == [(recent, second.attempts)]
        both = dialect.jobs.job_claimed_since(c, since_request(NS, OWNER), within_ms=120_000)
        assert sorted(both) == sorted([(old, first.attempts), (recent, second.attempts)])
        assert (
            dialect.jobs.job_claimed_since(c, since_request(NS, "server-b"), within_ms=120_000)
            == []
        )
        assert (
            dialect.jobs.job_claimed_since(c, since_request("other", OWNER), within_ms=120_000)
            == []
        )


def test_job_stage_after_tells_where_a_claim_left_its_job(later_db, dialect):
    """None while the claim runs or once a later claim took the job; else
    the stage and the error its outcome stored."""
    job_id = insert(later_db)
    first = claim_one(later_db, job_id)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_stage_after(c, (job_id, first.attempts)) is None  # running
    with cursor_of(later_db, atomic=True) as c:
        retry = RetryWrite(delay_ms=0, error="x", retry_policy=None)
        assert dialect.jobs.job_retry(c, owned(first), retry)
    with cursor_of(later_db) as c:
        left = dialect.jobs.job_stage_after(c, (job_id, first.attempts))
        assert left == LeftAs(stage="requeued", last_error="x")
        dialect.jobs.job_promote_due(c, namespace=NS, limit=10)
    second = claim_one(later_db, job_id)
    assert complete(later_db, [(job_id, second.attempts)]).done_ids == [job_id]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_stage_after(c, (job_id, first.attempts)) is None  # taken again
        left = dialect.jobs.job_stage_after(c, (job_id, second.attempts))
        assert left == LeftAs(stage="success", last_error="x")  # the error of attempt 1 stays
        assert dialect.jobs.job_stage_after(c, ("0" * 26, 1)) is None


def test_job_retry_requeues_under_the_owner_or_expiry_fence(later_db, dialect):
    """A retry needs the claim's owner and attempt, or (the rescuer) a lease
    expired long enough; it is due its delay after the database's now."""
    job_id = insert(later_db, retry_policy='{"old": 1}')
    job = claim_one(later_db, job_id)
    retry = RetryWrite(delay_ms=HOUR_MS, error="boom", retry_policy='{"new": 2}')

    def write(fence: OwnerFence | ExpiredFence, write: RetryWrite = retry) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.jobs.job_retry(c, fence, write)

    stale = OwnerFence(job_id=job_id, attempts=2, owner=OWNER)
    assert [write(owned(job, owner="server-b")), write(stale)] == [False, False]
    before = db_now(later_db)
    assert write(owned(job)) is True
    after = db_now(later_db)
    assert write(owned(job)) is False, "no longer running"
    row = job_row(later_db, job_id)
    assert (row["stage"], row["last_error"], row["retry_policy"]) == (
        "requeued",
        "boom",
        '{"new": 2}',
    )
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    assert before + HOUR_MS <= row["run_at_ms"] <= after + HOUR_MS
    assert before <= row["changed_ms"] <= after

    # The rescuer: a lease renewed meanwhile is left alone.
    age(later_db, "run_at_ms", job_id, 2 * HOUR_MS)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 1
    again = claim_one(later_db, job_id)
    assert again.attempts == 2
    rescue = ExpiredFence(job_id=job_id, attempts=2, expired_for_ms=10_000)
    keep = RetryWrite(delay_ms=0, error="lease expired")
    assert write(rescue, keep) is False
    age(later_db, "lease_expires_ms", job_id, LEASE_MS + 20_000)
    assert write(ExpiredFence(job_id=job_id, attempts=1, expired_for_ms=10_000), keep) is False
    assert write(rescue, keep) is True
    row = job_row(later_db, job_id)
    assert (row["stage"], row["retry_policy"]) == ("requeued", '{"new": 2}'), "policy kept"
    assert_counts(later_db)


def test_job_fail_descendants_fails_every_waiting_generation_and_nothing_else(later_db, dialect):
    """The waiting continuations of a job, and theirs, fail as "parent
    failed"; the job itself and another job's continuation do not change."""
    parent = insert(later_db)
    child, _ = insert_child(later_db, parent)
    grandchild, _ = insert_child(later_db, child)
    other = insert(later_db)
    other_child, _ = insert_child(later_db, other)
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_fail_descendants(c, job_id=parent, retention_ms=DAY_MS)
    assert stages(later_db, parent, child, grandchild, other_child) == [
        "enqueued",
        "failed",
        "failed",
        "waiting",
    ]
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    assert_counts(later_db)


def test_job_fail_fails_the_claim_and_its_waiting_descendants(later_db, dialect):
    """A failure is fenced as a retry is, and fails every waiting descendant
    with "parent failed"."""
    job_id, other = insert(later_db), insert(later_db)
    job, rescued = claim(later_db, limit=2)
    child = insert_child(later_db, job_id)[0]
    grandchild = insert_child(later_db, child)[0]
    failure = FailureWrite(error="boom", retention_ms=HOUR_MS)

    def write(fence: OwnerFence | ExpiredFence) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.jobs.job_fail(c, fence, failure)

    assert write(owned(job, owner="server-b")) is False
    assert write(OwnerFence(job_id=job.id, attempts=2, owner=OWNER)) is False
    assert write(ExpiredFence(job_id=rescued.id, attempts=1, expired_for_ms=0)) is False
    assert stages(later_db, job_id, child, grandchild) == ["running", "waiting", "waiting"]
    before = db_now(later_db)
    assert write(owned(job)) is True
    after = db_now(later_db)
    assert stages(later_db, job_id, child, grandchild) == ["failed", "failed", "failed"]
    row = job_row(later_db, job_id)
    assert (row["last_error"], row["lease_owner"], row["lease_expires_ms"]) == ("boom", None, None)
    assert before <= row["finished_ms"] == row["changed_ms"] <= after
    assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    age(later_db, "lease_expires_ms", rescued.id, LEASE_MS + 1)
    assert write(ExpiredFence(job_id=rescued.id, attempts=1, expired_for_ms=0)) is True
    assert stages(later_db, other) == ["failed"]
    assert_counts(later_db)


# -- maintenance ------------------------------------------------------------------------


def test_job_promote_due_makes_due_jobs_ready(later_db, dialect):
    """Delayed and requeued jobs whose time came become ready, at most
    ``limit`` a call; those not due yet wait."""
    due = [insert(later_db, delay_ms=HOUR_MS) for _ in range(3)]
    later_one = insert(later_db, delay_ms=HOUR_MS)
    requeued = insert(later_db)
    job = claim_one(later_db, requeued)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry(c, owned(job), RetryWrite(delay_ms=HOUR_MS, error="x"))
    for job_id in (*due, requeued):
        age(later_db, "run_at_ms", job_id, 2 * HOUR_MS)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_promote_due(c, namespace="other", limit=10) == 0
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=2) == 2
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 2
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 0
    assert stages(later_db, *due, requeued, later_one) == ["enqueued"] * 4 + ["delayed"]
    assert_counts(later_db)


def test_job_stuck_lists_running_jobs_whose_lease_expired_long_enough(later_db, dialect):
    """Only running jobs whose lease expired at least the grace ago, on the
    database's clock, oldest lease first."""
    a, b, c_ = insert(later_db), insert(later_db), insert(later_db)
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_job SET retry_policy = %s WHERE id = %s", ['{"max": 1}', b])
    claim(later_db, limit=3)
    # b was claimed twice, the first claim given back: one attempt counted.
    later_db.execute("UPDATE later_job SET attempts = 2, uncounted = 1 WHERE id = %s", [b])
    age(later_db, "lease_expires_ms", a, LEASE_MS + 20_000)
    age(later_db, "lease_expires_ms", b, LEASE_MS + 40_000)
    age(later_db, "lease_expires_ms", c_, LEASE_MS - 5_000)
    with cursor_of(later_db) as c:
        stuck = dialect.jobs.job_stuck(c, namespace=NS, expired_for_ms=10_000, limit=10)
        assert dialect.jobs.job_stuck(c, namespace=NS, expired_for_ms=10_000, limit=1) == stuck[:1]
        assert dialect.jobs.job_stuck(c, namespace=NS, expired_for_ms=60_000, limit=10) == []
        assert dialect.jobs.job_stuck(c, namespace="other", expired_for_ms=0, limit=10) == []
    assert stuck == [
        StuckJob(
            id=b, type_name="conformance.Job", attempts=2, retry_policy='{"max": 1}', attempt=1
        ),
        StuckJob(id=a, type_name="conformance.Job", attempts=1, retry_policy=None, attempt=1),
    ]


def test_job_orphans_are_resolved_by_their_parents_end(later_db, dialect):
    """Waiting children of a finished or vanished parent are orphans: a
    succeeded parent's is released, the others' fail with their descendants."""
    parents = [insert(later_db) for _ in range(4)]
    claim(later_db, limit=4)
    children = [insert_child(later_db, parent)[0] for parent in parents]
    grandchild = insert_child(later_db, children[1])[0]
    with cursor_of(later_db) as c:
        c.execute(
            "UPDATE later_job SET stage = 'success', lease_owner = NULL, "
            "lease_expires_ms = NULL WHERE id = %s",
            [parents[0]],
        )
        c.execute("DELETE FROM later_job WHERE id = %s", [parents[1]])
        c.execute(
            "UPDATE later_job SET stage = 'failed', lease_owner = NULL, "
            "lease_expires_ms = NULL WHERE id = %s",
            [parents[2]],
        )
    with cursor_of(later_db) as c:
        orphans = dialect.jobs.job_orphans(c, namespace=NS, limit=10)
        assert dialect.jobs.job_orphans(c, namespace="other", limit=10) == []
        assert len(dialect.jobs.job_orphans(c, namespace=NS, limit=1)) == 1
    assert sorted(orphans, key=lambda o: o.job_id) == sorted(
        [
            Orphan(job_id=children[0], parent_stage="success"),
            Orphan(job_id=children[1], parent_stage=None),
            Orphan(job_id=children[2], parent_stage="failed"),
        ],
        key=lambda o: o.job_id,
    )
    before = db_now(later_db)
    for orphan in orphans:
        with cursor_of(later_db, atomic=True) as c:
            dialect.jobs.job_resolve_orphan(c, orphan, retention_ms=HOUR_MS)
    after = db_now(later_db)
    assert stages(later_db, *children, grandchild) == [
        "enqueued",
        "failed",
        "failed",
        "waiting",
        "failed",
    ]
    assert before <= job_row(later_db, children[0])["run_at_ms"] <= after
    reasons = [job_row(later_db, job_id)["last_error"] for job_id in (*children[1:3], grandchild)]
    assert reasons == ["parent missing", PARENT_FAILED, PARENT_FAILED]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_orphans(c, namespace=NS, limit=10) == []
    assert_counts(later_db)


def test_job_prune_deletes_finished_jobs_past_their_retention(later_db, dialect):
    """Only finished jobs whose expiry passed go, at most ``limit`` a call,
    and the task results of those that go with them."""
    gone = [insert(later_db) for _ in range(3)]
    kept, running = insert(later_db), insert(later_db)
    claim(later_db, limit=5)
    for job_id in (gone[0], kept):
        with cursor_of(later_db) as c:
            end = TaskAttemptEnd(job_id=job_id, earlier_workers="[", errors="[]", return_value="1")
            dialect.jobs.task_results_write(c, owner=OWNER, ends=[end])
    ready = insert(later_db)
    assert len(complete(later_db, [(job_id, 1) for job_id in gone], retention_ms=0).done_ids) == 3
    assert complete(later_db, [(kept, 1)], retention_ms=HOUR_MS).done_ids == [kept]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_prune(c, namespace="other", limit=10) == 0
        assert dialect.jobs.job_prune(c, namespace=NS, limit=2) == 2
        assert dialect.jobs.job_prune(c, namespace=NS, limit=10) == 1
        assert dialect.jobs.job_prune(c, namespace=NS, limit=10) == 0
    remaining = {str(r[0]) for r in later_db.rows("SELECT id FROM later_job")}
    assert remaining == {kept, running, ready}
    assert later_db.rows("SELECT job_id FROM later_task_result") == [(kept,)]
    assert_counts(later_db)


def test_job_next_due_in_is_the_wait_for_the_first_delayed_or_requeued_job(later_db, dialect):
    """None while no job of the namespace waits for its time; else the first
    delayed or requeued job's run_at minus the database's now (not above
    zero once it is due). Ready jobs and other namespaces do not count."""

    def due_in(namespace: str = NS) -> tuple[int, int | None, int]:
        before = db_now(later_db)
        with cursor_of(later_db) as c:
            value = dialect.jobs.job_next_due_in(c, namespace=namespace)
        return before, value, db_now(later_db)

    def assert_due_in(run_at_ms: int, namespace: str = NS) -> int:
        before, value, after = due_in(namespace)
        assert value is not None and run_at_ms - after <= value <= run_at_ms - before
        return value

    assert due_in()[1] is None
    retried = insert(later_db)
    insert(later_db, namespace="other", delay_ms=60_000)
    assert due_in()[1] is None, "a ready job and another namespace's wait for nothing"
    now = db_now(later_db)
    insert(later_db, run_at_ms=now + 3 * HOUR_MS)
    insert(later_db, run_at_ms=now + 2 * HOUR_MS)
    assert assert_due_in(now + 2 * HOUR_MS) > HOUR_MS
    job = claim_one(later_db, retried)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry(c, owned(job), RetryWrite(delay_ms=HOUR_MS, error="x"))
    assert_due_in(job_row(later_db, retried)["run_at_ms"])
    age(later_db, "run_at_ms", retried, 2 * HOUR_MS)
    assert assert_due_in(job_row(later_db, retried)["run_at_ms"]) < 0, "overdue"
    other_run_at = later_db.scalar(
        "SELECT run_at_ms FROM later_job WHERE namespace = 'other' AND stage = 'delayed'"
    )
    assert 0 < assert_due_in(int(other_run_at), namespace="other") <= 60_000


# -- the stage counters' folding --------------------------------------------------------


def test_stage_counts_has_every_stage_and_counter_compact_keeps_them(later_db, dialect):
    """Counts cover every stage, zero included, and stay exact when the
    counter rows are folded together (into at most one row a stage)."""
    with cursor_of(later_db) as c:
        assert dialect.reads.stage_counts(c, namespace=NS) == dict.fromkeys(Stage.values, 0)
    ids = [insert(later_db) for _ in range(6)] + [insert(later_db, namespace="other")]
    claim(later_db, limit=4)
    complete(later_db, [(ids[0], 1), (ids[1], 1)])
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_cancel(c, namespace=NS, job_id=ids[5], retention_ms=1)
    assert_counts(later_db)
    with cursor_of(later_db, atomic=True) as c:
        c.execute("SELECT COUNT(*) FROM later_stage_count WHERE namespace = %s", [NS])
        rows_before = int(c.fetchone()[0])
        folded = dialect.jobs.counter_compact(c, namespace=NS)
    rows_after = int(
        later_db.scalar(  # type: ignore[arg-type]
            "SELECT COUNT(*) FROM later_stage_count WHERE namespace = %s", [NS]
        )
    )
    # One row per stage and lane at most: folded only beyond that.
    assert folded == (rows_before if rows_before > 2 * len(Stage) else 0)
    assert rows_after <= (len(Stage) if folded else 2 * len(Stage))
    with cursor_of(later_db) as c:
        assert dialect.reads.stage_counts(c, namespace=NS) == {
            **dict.fromkeys(Stage.values, 0),
            "success": 2,
            "running": 2,
            "enqueued": 1,
            "cancelled": 1,
        }
    assert_counts(later_db)


# -- tracing ----------------------------------------------------------------------------


def test_job_set_trace_marks_only_the_named_jobs_in_batches(later_db, dialect):
    """The enqueuing span's context lands on the jobs named (more of them than
    one statement takes), with no stage change; others stay NULL."""
    from later_django.db.jobs import TRACE_BATCH

    marked = [insert(later_db) for _ in range(TRACE_BATCH + 3)]
    other = insert(later_db)
    context = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_set_trace(c, marked, context)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_trace_context(c, job_id=marked[0]) == context
        assert dialect.jobs.job_trace_context(c, job_id=marked[-1]) == context
        assert dialect.jobs.job_trace_context(c, job_id=other) is None
        assert dialect.jobs.job_trace_context(c, job_id=new_job_id()) is None
    traced = later_db.scalar("SELECT COUNT(*) FROM later_job WHERE trace_context IS NOT NULL")
    assert traced == len(marked)
    assert stages(later_db, marked[0], other) == ["enqueued", "enqueued"]
    assert_counts(later_db)


# -- wake-ups ---------------------------------------------------------------------------


def test_job_ready_exists_sees_only_ready_jobs_of_its_namespace(later_db, dialect):
    def ready() -> bool:
        with cursor_of(later_db) as c:
            return dialect.jobs.job_ready_exists(c, namespace=NS)

    assert ready() is False
    insert(later_db, delay_ms=HOUR_MS)
    insert(later_db, namespace="other")
    assert ready() is False
    job_id = insert(later_db)
    assert ready() is True
    claim_one(later_db, job_id)
    assert ready() is False


# -- an operator's actions --------------------------------------------------------------


def test_job_retry_failed_and_run_now_change_only_the_stage_they_apply_to(later_db, dialect):
    failed = insert(later_db)
    job = claim_one(later_db, failed)
    child, _ = insert_child(later_db, failed)
    delayed = insert(later_db, delay_ms=HOUR_MS)
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_fail(c, owned(job), FailureWrite(error="boom", retention_ms=DAY_MS))
    assert stages(later_db, failed, child) == ["failed", "failed"]
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry_failed(c, namespace=NS, job_id=child) is None  # parent failed
        assert dialect.jobs.job_retry_failed(c, namespace=NS, job_id=failed) == 1
        assert dialect.jobs.job_retry_failed(c, namespace=NS, job_id=failed) is None
        assert dialect.jobs.job_run_now(c, namespace=NS, job_id=delayed) is True
        assert dialect.jobs.job_run_now(c, namespace=NS, job_id=failed) is False
    assert stages(later_db, failed, child, delayed) == ["enqueued", "waiting", "enqueued"]
    assert job_row(later_db, failed)["expires_ms"] is None
    assert_counts(later_db)


# -- fan-in (sql/fan_in.py) -------------------------------------------------------------


def test_job_insert_fan_in_follows_all_its_parents(later_db, dialect):
    """A fan-in child is failed after a parent that failed or was cancelled
    (waiting on it), ready after parents that all succeeded, else waiting on
    an unfinished parent, one not running first; its parent list is written
    with it. A parent missing from the namespace writes nothing, and the
    answer names it."""
    running, done, more, failed, cancelled = (insert(later_db, priority=p) for p in range(9, 4, -1))
    queued, elsewhere = insert(later_db), insert(later_db, namespace="other")
    claimed = {job.id: job for job in claim(later_db, limit=4)}
    assert set(claimed) == {running, done, more, failed}
    complete(later_db, [(done, 1), (more, 1)])
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_fail(c, owned(claimed[failed]), FailureWrite(error="x", retention_ms=1))
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=cancelled, retention_ms=DAY_MS)
    before = db_now(later_db)
    cases = {
        "not running first": ([running, queued, done], "waiting", queued),
        "running": ([done, running], "waiting", running),
        "all succeeded": ([done, more], "enqueued", None),
        "failed": ([running, failed, done], "failed", failed),
        "cancelled": ([queued, cancelled], "failed", cancelled),
    }
    children = {}
    for case, (parents, stage, waits_on) in cases.items():
        child, inserted = insert_fan_in(later_db, parents, retention_ms=HOUR_MS, timeout_ms=5_000)
        assert inserted == FanInInsert(stage=stage), case
        row = job_row(later_db, child)
        if waits_on is not None:
            assert row["parent_id"] == waits_on, case
        assert (row["last_error"] == PARENT_FAILED) == (stage == "failed"), case
        assert later_db.job_field(child, "timeout_ms") == 5_000
        children[child] = parents
    after = db_now(later_db)
    for child in children:
        row = job_row(later_db, child)
        assert before <= row["created_ms"] <= after
        if row["stage"] == "failed":
            assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert fan_in_rows(later_db) == sorted(
        (child, parent) for child, parents in children.items() for parent in parents
    )
    count = later_db.job_count()
    missing = new_job_id()
    assert insert_fan_in(later_db, [running, missing, elsewhere])[1] == FanInInsert(
        stage=None, missing=tuple(sorted([missing, elsewhere]))
    )
    assert later_db.job_count() == count
    assert len(fan_in_rows(later_db)) == sum(len(p) for p in children.values())
    assert_counts(later_db)


def test_job_settle_fan_in_resolves_a_child_its_parents_missed(later_db, dialect):
    """After its commit a waiting fan-in child looks at all its parents:
    none finished, nothing changes; the one it waits on finished, it waits
    on another; all succeeded, it is released; one failed, it fails with
    its descendants."""
    parents = [insert(later_db) for _ in range(6)]
    claim(later_db, limit=6)
    waiting = insert_fan_in(later_db, parents[0:2])[0]
    released = insert_fan_in(later_db, parents[2:4])[0]
    failing = insert_fan_in(later_db, parents[4:6])[0]
    grandchild = insert_child(later_db, failing)[0]
    untouched = job_row(later_db, waiting)

    def settle(child: str) -> str:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.jobs.job_settle_fan_in(c, job_id=child, retention_ms=DAY_MS)

    assert settle(waiting) == "waiting"
    assert job_row(later_db, waiting) == untouched
    first = untouched["parent_id"]
    finish_unseen(later_db, "success", first, *parents[2:4])
    last_of_failing = job_row(later_db, failing)["parent_id"]
    finish_unseen(later_db, "failed", *(set(parents[4:6]) - {last_of_failing}))
    before = db_now(later_db)
    assert [settle(waiting), settle(released), settle(failing)] == ["waiting", "released", "failed"]
    after = db_now(later_db)
    assert job_row(later_db, waiting)["parent_id"] == (set(parents[0:2]) - {first}).pop()
    assert stages(later_db, waiting, released, failing, grandchild) == [
        "waiting",
        "enqueued",
        "failed",
        "failed",
    ]
    assert before <= job_row(later_db, released)["run_at_ms"] <= after
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    assert settle(released) == "waiting", "no longer waiting: nothing to do"
    assert_counts(later_db)


def test_complete_many_resolves_fan_in_children_by_all_their_parents(later_db, dialect):
    """A batch's waiting fan-in children are released once every parent
    succeeded, wait on another parent while one has not (the newest of the
    running ones), and fail (with their descendants) after one that failed;
    a parent done while its child waits on another changes nothing.
    Continuations of one parent are released as ever, and counted with the
    fan-in children released."""
    a, b, c, d, e = (insert(later_db) for _ in range(5))
    claim(later_db, limit=5)
    plain = insert_child(later_db, a)[0]
    both = insert_fan_in(later_db, [a, b])[0]
    three = insert_fan_in(later_db, [a, b, c])[0]
    doomed = insert_fan_in(later_db, [d, e])[0]
    doomed_child = insert_child(later_db, doomed)[0]
    pointers = [job_row(later_db, child)["parent_id"] for child in (both, three, doomed)]
    assert pointers == [b, c, e], "each waits on its newest running parent"

    def done(job_id: str) -> int:
        return complete(later_db, [(job_id, 1)]).released

    assert done(c) == 0
    assert (job_row(later_db, three)["stage"], job_row(later_db, three)["parent_id"]) == (
        "waiting",
        b,
    )
    assert done(a) == 1
    assert stages(later_db, plain, both, three) == ["enqueued", "waiting", "waiting"]
    assert done(b) == 2
    finish_unseen(later_db, "failed", d)
    assert done(e) == 0
    assert stages(later_db, both, three, doomed, doomed_child) == [
        "enqueued",
        "enqueued",
        "failed",
        "failed",
    ]
    assert job_row(later_db, doomed_child)["last_error"] == PARENT_FAILED
    assert_counts(later_db)


def test_fan_in_children_fail_with_any_parent_and_revive_with_it(later_db, dialect):
    """A failing job fails its fan-in children whichever parent they wait
    on, and theirs; an operator's retry of it makes them wait on it again."""
    x, y = insert(later_db, delay_ms=HOUR_MS), insert(later_db)
    z = insert(later_db, delay_ms=DAY_MS)
    child = insert_fan_in(later_db, [x, y])[0]
    grandchild = insert_fan_in(later_db, [z, child])[0]
    assert [job_row(later_db, j)["parent_id"] for j in (child, grandchild)] == [x, z], (
        "each waits on its parent due last"
    )
    plain = insert_child(later_db, child)[0]
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_fail_descendants(c, job_id=y, retention_ms=DAY_MS)
    assert stages(later_db, x, y, z, child, grandchild, plain) == [
        "delayed",
        "enqueued",
        "delayed",
        "failed",
        "failed",
        "failed",
    ]
    finish_unseen(later_db, "failed", y)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry_failed(c, namespace=NS, job_id=y) == 3
    assert stages(later_db, y, child, grandchild, plain) == ["enqueued"] + ["waiting"] * 3
    assert [job_row(later_db, j)["parent_id"] for j in (child, grandchild, plain)] == [
        y,
        child,
        child,
    ]
    assert_counts(later_db)


def test_job_orphans_resolve_fan_in_children_by_all_their_parents(later_db, dialect):
    """A fan-in child is an orphan when the parent it waits on finished or a
    parent failed: resolved, it waits on another while one has not finished,
    is released once all succeeded (one pruned counts as succeeded), and
    fails after one that failed."""
    parents = [insert(later_db) for _ in range(6)]
    repointed = insert_fan_in(later_db, parents[0:2])[0]
    released = insert_fan_in(later_db, parents[2:4])[0]
    failed = insert_fan_in(later_db, parents[4:6])[0]
    pointers = {
        child: job_row(later_db, child)["parent_id"] for child in (repointed, released, failed)
    }
    finish_unseen(later_db, "success", pointers[repointed], pointers[released])
    later_db.execute(
        "DELETE FROM later_job WHERE id = %s", [(set(parents[2:4]) - {pointers[released]}).pop()]
    )
    finish_unseen(later_db, "failed", (set(parents[4:6]) - {pointers[failed]}).pop())
    with cursor_of(later_db) as c:
        orphans = dialect.jobs.job_orphans(c, namespace=NS, limit=10)
    assert sorted(orphans, key=lambda o: o.job_id) == sorted(
        [
            Orphan(job_id=repointed, parent_stage="success", fan_in=True),
            Orphan(job_id=released, parent_stage="success", fan_in=True),
            Orphan(job_id=failed, parent_stage="enqueued", fan_in=True),
        ],
        key=lambda o: o.job_id,
    )
    for orphan in orphans:
        with cursor_of(later_db, atomic=True) as c:
            dialect.jobs.job_resolve_orphan(c, orphan, retention_ms=HOUR_MS)
    assert stages(later_db, repointed, released, failed) == ["waiting", "enqueued", "failed"]
    assert (
        job_row(later_db, repointed)["parent_id"]
        == (set(parents[0:2]) - {pointers[repointed]}).pop()
    )
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_orphans(c, namespace=NS, limit=10) == []
    assert_counts(later_db)


def test_job_prune_deletes_a_fan_in_childs_parent_list(later_db, dialect):
    """Pruning a fan-in child deletes its parent list; pruning a parent
    keeps the lists it is on."""
    parents = [insert(later_db) for _ in range(2)]
    child = insert_fan_in(later_db, parents)[0]
    other = insert_fan_in(later_db, parents)[0]
    finish_unseen(later_db, "success", *parents, child)
    later_db.execute(
        "UPDATE later_job SET expires_ms = 0 WHERE id IN (%s, %s, %s)", [*parents, child]
    )
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_prune(c, namespace=NS, limit=10) == 3
    assert fan_in_rows(later_db) == sorted((other, parent) for parent in parents)


# -- the Django Tasks backend's results -------------------------------------------------


def test_task_results_are_written_by_the_completion_whose_fence_held(later_db, dialect):
    """A batch's task results are written with it, for the claims it
    completed only: the worker ids before the attempt plus the completing
    server's, the errors and the return value; a second write is an upsert."""
    done, taken = insert(later_db), insert(later_db)
    claim(later_db, limit=2)

    def end(job_id: str, earlier: str, value: str | None) -> TaskAttemptEnd:
        return TaskAttemptEnd(
            job_id=job_id, earlier_workers=earlier, errors='[{"e": 1}]', return_value=value
        )

    def rows() -> dict[str, tuple[object, ...]]:
        sql = "SELECT job_id, worker_ids, errors, return_value FROM later_task_result"
        return {str(row[0]): tuple(row[1:]) for row in later_db.rows(sql)}

    results = [end(done, '["a",', '{"x": 2}'), end(taken, "[", "3")]
    completion = complete(later_db, [(done, 1), (taken, 2)], results=results)
    assert completion.done_ids == [done], "the claim of attempt 2 is not held"
    assert rows() == {done: (f'["a","{OWNER}"]', '[{"e": 1}]', '{"x": 2}')}
    with cursor_of(later_db) as c:
        dialect.jobs.task_results_write(c, owner="server-b", ends=[end(done, "[", None)])
    assert rows() == {done: ('["server-b"]', '[{"e": 1}]', None)}


def test_a_batch_without_task_results_writes_none(later_db, dialect):
    job_id = insert(later_db)
    claim_one(later_db, job_id)
    assert complete(later_db, [(job_id, 1)]).done_ids == [job_id]
    assert later_db.scalar("SELECT COUNT(*) FROM later_task_result") == 0


# -- the database's clock: a stage is never stamped before the previous one -------------


def test_stage_changes_never_stamp_before_the_previous_change(later_db, dialect):
    """Each stage change is stamped no earlier than the row's previous
    change (a writer whose clock ran ahead, or that waited for the row),
    through every operation that changes a stage."""
    job_id = insert(later_db)
    ahead = db_now(later_db) + HOUR_MS

    def push_ahead(*job_ids: str) -> None:
        with cursor_of(later_db) as c:
            for each in job_ids:
                c.execute("UPDATE later_job SET changed_ms = %s WHERE id = %s", [ahead, each])

    def last_stamp(each: str) -> int:
        row = job_row(later_db, each)
        assert row["changed_ms"] == ahead, row
        return int(row["changed_ms"])

    push_ahead(job_id)
    job = claim_one(later_db, job_id)
    assert last_stamp(job_id) == job_row(later_db, job_id)["started_ms"]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_unclaim(c, owned(job))
    last_stamp(job_id)
    job = claim_one(later_db, job_id)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry(c, owned(job), RetryWrite(delay_ms=0, error="x"))
    last_stamp(job_id)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 1
    last_stamp(job_id)
    job = claim_one(later_db, job_id)
    child = insert_child(later_db, job_id)[0]
    push_ahead(child)
    assert complete(later_db, [(job_id, job.attempts)]) == Completion(done_ids=[job_id], released=1)
    assert last_stamp(job_id) == job_row(later_db, job_id)["finished_ms"]
    last_stamp(child)

    other = insert(later_db, delay_ms=HOUR_MS)
    push_ahead(other)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=other, retention_ms=1)
    last_stamp(other)
    failing = claim_one(later_db, child)
    grandchild = insert_child(later_db, child)[0]
    push_ahead(child, grandchild)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_fail(c, owned(failing), FailureWrite(error="x", retention_ms=1))
    last_stamp(child)
    last_stamp(grandchild)


def since_request(namespace: str, owner: str, queue: str = "default") -> ClaimRequest:
    return ClaimRequest(namespace=namespace, owner=owner, limit=0, lease_ms=0, queue=queue)


# -- queues -------------------------------------------------------------------------------


def test_a_claim_takes_only_its_queues_jobs_and_nothing_of_a_paused_queue(later_db, dialect):
    """Each queue is claimed apart (the default queue's jobs store NULL), by
    priority within it; a paused queue's claim, ready check and backlog find
    nothing while the others run on."""
    low = insert(later_db, priority=1)
    high_email = insert(later_db, priority=90, queue="emails")
    email = insert(later_db, queue="emails")
    with cursor_of(later_db) as c:
        dialect.jobs.job_insert_many(
            connections[later_db.alias], [new_job(queue="reports")], queued=True
        )
        dialect.jobs.job_insert_many(connections[later_db.alias], [new_job()])
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE queue = 'reports'") == 1
    assert [j.id for j in claim(later_db)] == [low]
    assert claim(later_db) != [], "the bulk default job"
    assert claim(later_db) == []
    with cursor_of(later_db, atomic=True) as c:
        dialect.cluster.queue_set_paused(c, namespace=NS, name="emails", paused=True)
    with cursor_of(later_db) as c:
        assert not dialect.jobs.job_ready_exists(c, namespace=NS, queue="emails")
        assert dialect.jobs.job_ready_exists(c, namespace=NS, queue="reports")
        assert not dialect.jobs.job_ready_exists(c, namespace=NS)
        assert dialect.reads.plain_ready(c, namespace=NS, queue="emails") == 0
    assert claim(later_db, queue="emails") == []
    with cursor_of(later_db, atomic=True) as c:
        dialect.cluster.queue_set_paused(c, namespace=NS, name="emails", paused=False)
    with cursor_of(later_db) as c:
        assert dialect.reads.plain_ready(c, namespace=NS, queue="emails") == 2
    assert [j.id for j in claim(later_db, queue="emails")] == [high_email]
    (taken,) = claim(later_db, queue="emails")
    assert taken.id == email
    with cursor_of(later_db) as c:
        emails = since_request(NS, OWNER, "emails")
        since = dialect.jobs.job_claimed_since(c, emails, within_ms=60_000)
        assert {claim_.job_id for claim_ in since} == {high_email, email}
        plain = dialect.jobs.job_claimed_since(c, since_request(NS, OWNER), within_ms=60_000)
        assert low in {claim_.job_id for claim_ in plain} and email not in {
            claim_.job_id for claim_ in plain
        }
