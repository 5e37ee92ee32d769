"""The worker's hot path (``dialect.hot``): claims and batch completions (on
a cursor everywhere, the asyncio pair where declared), the writes under a
claim's fence, a requested cancel, the reads between claims and the Tasks
backend's results; and the database's clock under every stage change.
"""

from __future__ import annotations

import asyncio

import pytest
from django.db import connections

from later_django.db.rows import (
    ClaimRequest,
    Completion,
    ExpiredFence,
    FailureWrite,
    LeftAs,
    OwnerFence,
    RetryWrite,
    SuccessBatch,
    TaskAttemptEnd,
)
from later_django.ids import new_job_id
from later_django.states import PARENT_CANCELLED, PARENT_FAILED
from later_django.types import Claim, ClaimedJob
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
        (job,) = dialect.hot.claim(c, request)
        done = dialect.hot.complete_many(
            c, SuccessBatch(owner=OWNER, jobs=[(job.id, job.attempts)], retention_ms=DAY_MS)
        )
    assert (job.id, done.done_ids) == (job_id, [job_id])
    assert stages(later_db, job_id) == ["success"]
    assert_counts(later_db)
    if not dialect.supports_async_connection:
        with cursor_of(later_db) as c:
            with pytest.raises(NotImplementedError):
                asyncio.run(dialect.hot.aclaim(c, request, prepare=True))
            with pytest.raises(NotImplementedError):
                asyncio.run(
                    dialect.hot.acomplete_many(
                        c, SuccessBatch(owner=OWNER, jobs=[], retention_ms=1), prepare=True
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


def test_renew_extends_only_the_claims_still_held(later_db, dialect):
    """A renewal returns the claims its owner still holds, at the attempt
    held, and moves their leases to the database's now plus the lease."""
    a, b = insert(later_db), insert(later_db)
    claim(later_db, limit=2, lease_ms=1_000)
    with cursor_of(later_db) as c:
        assert dialect.hot.renew(c, owner=OWNER, jobs=[], lease_ms=LEASE_MS) == []
        assert dialect.hot.renew(c, owner="server-b", jobs=[(a, 1)], lease_ms=LEASE_MS) == []
        before = db_now(later_db)
        renewed = dialect.hot.renew(
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


def test_unclaim_gives_a_claim_back_as_if_never_made(later_db, dialect):
    """Only the claim's own owner and attempt give it back: ready again,
    the attempt not counted, while attempts (the fence) keeps growing, so
    the given-back claim's writes never match the next claim."""
    job_id = insert(later_db)
    job = claim_one(later_db, job_id)
    with cursor_of(later_db) as c:
        assert dialect.hot.unclaim(c, owned(job, owner="server-b")) is False
        assert dialect.hot.unclaim(c, OwnerFence(job_id=job_id, attempts=2, owner=OWNER)) is False
        assert stages(later_db, job_id) == ["running"]
        assert dialect.hot.unclaim(c, owned(job)) is True
        assert dialect.hot.unclaim(c, owned(job)) is False
    row = job_row(later_db, job_id)
    assert (row["stage"], row["attempts"], row["uncounted"]) == ("enqueued", 1, 1)
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    again = claim_one(later_db, job_id)
    assert (again.attempts, again.attempt) == (2, 1)
    with cursor_of(later_db) as c:
        stale = [(job_id, job.attempts)]
        assert dialect.hot.renew(c, owner=OWNER, jobs=stale, lease_ms=LEASE_MS) == []
        assert dialect.hot.unclaim(c, owned(job)) is False
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
        assert dialect.enqueue.insert_continuation(c, child, DAY_MS) == "enqueued"
    assert [job.timeout_ms for job in claim(later_db)] == [700]
    head, _ = insert_partitioned(later_db, timeout_ms=2500)
    _, job = claim_head(later_db, "a")
    assert job is not None and (job.id, job.timeout_ms) == (head, 2500)
    assert_counts(later_db)


def test_a_cancel_request_marks_only_a_running_job_and_its_owner_finds_it(later_db, dialect):
    """control.cancel marks a running job once (its first time kept);
    hot.cancel_requested lists the owner's marked claims only."""
    mine, theirs = insert(later_db), insert(later_db)
    job = claim_one(later_db, mine)
    claim_one(later_db, theirs, owner="server-b")
    ready = insert(later_db)
    with cursor_of(later_db) as c:
        assert dialect.hot.cancel_requested(c, namespace=NS, owner=OWNER) == []
        assert (
            dialect.control.cancel(c, namespace="other", job_id=mine, retention_ms=DAY_MS) is False
        )
        assert dialect.control.cancel(c, namespace=NS, job_id=mine, retention_ms=DAY_MS) is True
        assert dialect.control.cancel(c, namespace=NS, job_id=theirs, retention_ms=DAY_MS) is True
        assert dialect.hot.cancel_requested(c, namespace=NS, owner=OWNER) == [(mine, job.attempts)]
    assert job_row(later_db, ready)["stage"] == "enqueued"
    assert_counts(later_db)


def test_a_running_job_asked_to_stop_ends_cancelled_never_retried(later_db, dialect):
    """Once a cancel is requested, a retry, a snooze or a failure of the
    claim does not pass; hot.cancel_running ends it cancelled under the claim's fence
    (owner, or the rescuer's expired one) and fails its waiting
    continuations as "parent cancelled". Without a request it changes nothing."""
    asked, unasked = insert(later_db), insert(later_db)
    child, _ = insert_child(later_db, asked)
    job, other = claim_one(later_db, asked), claim_one(later_db, unasked)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.hot.cancel_running(c, owned(other), DAY_MS) is False
        assert dialect.control.cancel(c, namespace=NS, job_id=asked, retention_ms=DAY_MS) is True
        retry = RetryWrite(delay_ms=0, error="boom", retry_policy=None)
        assert dialect.hot.retry(c, owned(job), retry) is False
        assert dialect.hot.snooze(c, owned(job), 0) is False
        failure = FailureWrite(error="boom", retention_ms=DAY_MS)
        assert dialect.hot.fail(c, owned(job), failure) is False
        assert dialect.hot.unclaim(c, owned(job)) is False
        assert dialect.hot.cancel_running(c, owned(job, owner="server-b"), DAY_MS) is False
        assert dialect.hot.cancel_running(c, owned(job), DAY_MS) is True
        assert dialect.hot.cancel_running(c, owned(job), DAY_MS) is False
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
        assert dialect.control.cancel(c, namespace=NS, job_id=unasked, retention_ms=DAY_MS) is True
    age(later_db, "lease_expires_ms", unasked, LEASE_MS + HOUR_MS)
    with cursor_of(later_db, atomic=True) as c:
        (stuck,) = dialect.upkeep.stuck(c, namespace=NS, expired_for_ms=HOUR_MS, limit=10)
        assert (stuck.id, stuck.cancel_requested) == (unasked, True)
        fence = ExpiredFence(job_id=unasked, attempts=other.attempts, expired_for_ms=HOUR_MS)
        assert dialect.hot.cancel_running(c, fence, DAY_MS) is True
    assert stages(later_db, unasked) == ["cancelled"]
    assert_counts(later_db)


def test_snooze_delays_a_claim_uncounted_under_its_fence(later_db, dialect):
    """A snooze is fenced like a retry: only the claim's owner and attempt
    move the job back to delayed, due after the delay by the database's
    clock, the claim not counted as an attempt."""
    job_id = insert(later_db)
    job = claim_one(later_db, job_id)
    before = db_now(later_db)
    with cursor_of(later_db) as c:
        assert dialect.hot.snooze(c, owned(job, owner="server-b"), HOUR_MS) is False
        assert stages(later_db, job_id) == ["running"]
        assert dialect.hot.snooze(c, owned(job), HOUR_MS) is True
        assert dialect.hot.snooze(c, owned(job), HOUR_MS) is False
    after = db_now(later_db)
    row = job_row(later_db, job_id)
    assert (row["stage"], row["attempts"], row["uncounted"]) == ("delayed", 1, 1)
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    assert before + HOUR_MS <= row["run_at_ms"] <= after + HOUR_MS
    assert row["history"].split(";")[-2].startswith("delayed@")
    age(later_db, "run_at_ms", job_id, HOUR_MS + 1)
    with cursor_of(later_db) as c:
        assert dialect.upkeep.promote_due(c, namespace=NS, limit=10) == 1
    again = claim_one(later_db, job_id)
    assert (again.attempts, again.attempt) == (2, 1)
    assert_counts(later_db)


def test_claimed_since_lists_an_owners_recent_running_plain_claims(later_db, dialect):
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
        within = dialect.hot.claimed_since(c, since_request(NS, OWNER), within_ms=30_000)
        assert within == [(recent, second.attempts)]
        both = dialect.hot.claimed_since(c, since_request(NS, OWNER), within_ms=120_000)
        assert sorted(both) == sorted([(old, first.attempts), (recent, second.attempts)])
        assert dialect.hot.claimed_since(c, since_request(NS, "server-b"), within_ms=120_000) == []
        assert dialect.hot.claimed_since(c, since_request("other", OWNER), within_ms=120_000) == []


def test_stage_after_tells_where_a_claim_left_its_job(later_db, dialect):
    """None while the claim runs or once a later claim took the job; else
    the stage and the error its outcome stored."""
    job_id = insert(later_db)
    first = claim_one(later_db, job_id)
    with cursor_of(later_db) as c:
        assert dialect.hot.stage_after(c, (job_id, first.attempts)) is None  # running
    with cursor_of(later_db, atomic=True) as c:
        retry = RetryWrite(delay_ms=0, error="x", retry_policy=None)
        assert dialect.hot.retry(c, owned(first), retry)
    with cursor_of(later_db) as c:
        left = dialect.hot.stage_after(c, (job_id, first.attempts))
        assert left == LeftAs(stage="requeued", last_error="x")
        dialect.upkeep.promote_due(c, namespace=NS, limit=10)
    second = claim_one(later_db, job_id)
    assert complete(later_db, [(job_id, second.attempts)]).done_ids == [job_id]
    with cursor_of(later_db) as c:
        assert dialect.hot.stage_after(c, (job_id, first.attempts)) is None  # taken again
        left = dialect.hot.stage_after(c, (job_id, second.attempts))
        assert left == LeftAs(stage="success", last_error="x")  # the error of attempt 1 stays
        assert dialect.hot.stage_after(c, ("0" * 26, 1)) is None


def test_retry_requeues_under_the_owner_or_expiry_fence(later_db, dialect):
    """A retry needs the claim's owner and attempt, or (the rescuer) a lease
    expired long enough; it is due its delay after the database's now."""
    job_id = insert(later_db, retry_policy='{"old": 1}')
    job = claim_one(later_db, job_id)
    retry = RetryWrite(delay_ms=HOUR_MS, error="boom", retry_policy='{"new": 2}')

    def write(fence: OwnerFence | ExpiredFence, write: RetryWrite = retry) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.hot.retry(c, fence, write)

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
        assert dialect.upkeep.promote_due(c, namespace=NS, limit=10) == 1
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


def test_fail_fails_the_claim_and_its_waiting_descendants(later_db, dialect):
    """A failure is fenced as a retry is, and fails every waiting descendant
    with "parent failed"."""
    job_id, other = insert(later_db), insert(later_db)
    job, rescued = claim(later_db, limit=2)
    child = insert_child(later_db, job_id)[0]
    grandchild = insert_child(later_db, child)[0]
    failure = FailureWrite(error="boom", retention_ms=HOUR_MS)

    def write(fence: OwnerFence | ExpiredFence) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.hot.fail(c, fence, failure)

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


def test_ready_exists_sees_only_ready_jobs_of_its_namespace(later_db, dialect):
    def ready() -> bool:
        with cursor_of(later_db) as c:
            return dialect.hot.ready_exists(c, namespace=NS)

    assert ready() is False
    insert(later_db, delay_ms=HOUR_MS)
    insert(later_db, namespace="other")
    assert ready() is False
    job_id = insert(later_db)
    assert ready() is True
    claim_one(later_db, job_id)
    assert ready() is False


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
        dialect.hot.task_results_write(c, owner="server-b", ends=[end(done, "[", None)])
    assert rows() == {done: ('["server-b"]', '[{"e": 1}]', None)}


def test_a_batch_without_task_results_writes_none(later_db, dialect):
    job_id = insert(later_db)
    claim_one(later_db, job_id)
    assert complete(later_db, [(job_id, 1)]).done_ids == [job_id]
    assert later_db.scalar("SELECT COUNT(*) FROM later_task_result") == 0


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
        assert dialect.hot.unclaim(c, owned(job))
    last_stamp(job_id)
    job = claim_one(later_db, job_id)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.hot.retry(c, owned(job), RetryWrite(delay_ms=0, error="x"))
    last_stamp(job_id)
    with cursor_of(later_db) as c:
        assert dialect.upkeep.promote_due(c, namespace=NS, limit=10) == 1
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
        assert dialect.control.cancel(c, namespace=NS, job_id=other, retention_ms=1)
    last_stamp(other)
    failing = claim_one(later_db, child)
    grandchild = insert_child(later_db, child)[0]
    push_ahead(child, grandchild)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.hot.fail(c, owned(failing), FailureWrite(error="x", retention_ms=1))
    last_stamp(child)
    last_stamp(grandchild)


def since_request(namespace: str, owner: str, queue: str = "default") -> ClaimRequest:
    return ClaimRequest(namespace=namespace, owner=owner, limit=0, lease_ms=0, queue=queue)


def test_a_claim_takes_only_its_queues_jobs_and_nothing_of_a_paused_queue(later_db, dialect):
    """Each queue is claimed apart (the default queue's jobs store NULL), by
    priority within it; a paused queue's claim, ready check and backlog find
    nothing while the others run on."""
    low = insert(later_db, priority=1)
    high_email = insert(later_db, priority=90, queue="emails")
    email = insert(later_db, queue="emails")
    with cursor_of(later_db) as c:
        dialect.enqueue.insert_many(
            connections[later_db.alias], [new_job(queue="reports")], queued=True
        )
        dialect.enqueue.insert_many(connections[later_db.alias], [new_job()])
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE queue = 'reports'") == 1
    assert [j.id for j in claim(later_db)] == [low]
    assert claim(later_db) != [], "the bulk default job"
    assert claim(later_db) == []
    with cursor_of(later_db, atomic=True) as c:
        dialect.cluster.queue_set_paused(c, namespace=NS, name="emails", paused=True)
    with cursor_of(later_db) as c:
        assert not dialect.hot.ready_exists(c, namespace=NS, queue="emails")
        assert dialect.hot.ready_exists(c, namespace=NS, queue="reports")
        assert not dialect.hot.ready_exists(c, namespace=NS)
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
        since = dialect.hot.claimed_since(c, emails, within_ms=60_000)
        assert {claim_.job_id for claim_ in since} == {high_email, email}
        plain = dialect.hot.claimed_since(c, since_request(NS, OWNER), within_ms=60_000)
        assert low in {claim_.job_id for claim_ in plain} and email not in {
            claim_.job_id for claim_ in plain
        }
