"""The enqueue and lookup API on both databases: transactions, validation, bulk,
continuations, cancel, async twins and get_job."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import later_django as later
from later_django import codec
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest, FailureWrite, OwnerFence, RetryWrite, SuccessBatch
from later_django.db.sessions import WorkerSessions
from later_django.ids import new_job_id
from later_django.types import NewJob
from tests.helpers import history_times_ms, in_thread, job_row_locked, set_later, wait_until
from tests.jobapp.jobs import AsyncNoop, Item, Noop, Order

ULID = re.compile(r"^[0-9a-hjkmnp-tv-z]{26}$")
DAY_MS = 86_400_000


class Rollback(Exception):
    """Raised inside an atomic block to roll it back."""


def _claim(later_db, job_id, *, owner="worker-1"):
    """Claim exactly ``job_id`` (it must be the only or highest-priority ready job)."""
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        claimed = dialect_for(later_db.alias).hot.claim(
            c, ClaimRequest(namespace=conf.namespace, owner=owner, limit=1, lease_ms=30_000)
        )
    assert [job.id for job in claimed] == [job_id]
    return claimed[0]


def _complete(later_db, claimed, *, owner="worker-1"):
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        done = (
            dialect_for(later_db.alias)
            .hot.complete_many(
                c,
                SuccessBatch(
                    owner=owner, jobs=[(claimed.id, claimed.attempts)], retention_ms=DAY_MS
                ),
            )
            .done_ids
        )
    assert done == [claimed.id]


def _fail(later_db, claimed, *, error="boom", owner="worker-1"):
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        failed = dialect_for(later_db.alias).hot.fail(
            c,
            OwnerFence(job_id=claimed.id, attempts=claimed.attempts, owner=owner),
            FailureWrite(error=error, retention_ms=DAY_MS),
        )
    assert failed


def _retry(later_db, claimed, *, error, owner="worker-1"):
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        retried = dialect_for(later_db.alias).hot.retry(
            c,
            OwnerFence(job_id=claimed.id, attempts=claimed.attempts, owner=owner),
            RetryWrite(delay_ms=0, error=error, retry_policy=None),
        )
    assert retried


def _renew(later_db, job_id, *, owner="worker-1"):
    with connections[later_db.alias].cursor() as c:
        return dialect_for(later_db.alias).hot.renew(
            c, owner=owner, jobs=[(job_id, 1)], lease_ms=30_000
        )


def _lock_waiters(later_db, *, min_age_ms):
    """PostgreSQL sessions waiting for a lock in a transaction at least
    ``min_age_ms`` old."""
    return later_db.scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' "
        "AND clock_timestamp() - xact_start >= make_interval(secs => %s)",
        [min_age_ms / 1000],
    )


def _cancel_in_thread(later_db, job_id):
    """A thread (not started) that runs cancel(job_id); an event set once it
    sent its first statement, and the dict its result lands in."""
    result: dict[str, object] = {}
    began = threading.Event()

    def note_begin(execute, sql, params, many, context):
        began.set()
        return execute(sql, params, many, context)

    def cancel() -> None:
        try:
            with connections[later_db.alias].execute_wrapper(note_begin):
                result["cancelled"] = later.cancel(job_id)
        finally:
            connections.close_all()

    return threading.Thread(target=cancel), began, result


def _promote(later_db):
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        return dialect_for(later_db.alias).upkeep.promote_due(
            c, namespace=conf.namespace, limit=100
        )


# -- 1. transactions ---------------------------------------------------------


def test_enqueue_rolled_back_transaction_leaves_no_trace(later_db):
    """Every enqueue form inside a rolled-back atomic block writes no row and no count."""
    kept = later.enqueue(Noop(n=0))
    counts_before = later.stage_counts()
    with pytest.raises(Rollback), transaction.atomic(using=later_db.alias):
        inner = [
            later.enqueue(Noop(n=1)),
            later.enqueue_in(Noop(n=2)),
            *later.enqueue_many([Noop(n=3), Noop(n=4)]),
            later.enqueue_delayed(Noop(n=5), dt.timedelta(hours=1)),
            later.enqueue_continue(kept, Noop(n=6)),
        ]
        assert later_db.job_count() == 7  # visible inside the transaction
        raise Rollback
    assert later_db.job_count() == 1
    assert later.stage_counts() == counts_before
    assert all(later.get_job(job_id) is None for job_id in inner)


def test_enqueue_committed_transaction_is_visible(later_db):
    """Jobs enqueued in a committed atomic block are enqueued, in get_job and the counts."""
    with transaction.atomic(using=later_db.alias):
        first = later.enqueue_in(Noop(n=1))
        second = later.enqueue(AsyncNoop(n=2))
    for job_id in (first, second):
        info = later.get_job(job_id)
        assert info is not None
        assert info.stage == later.Stage.ENQUEUED
    assert later.stage_counts()["enqueued"] == 2
    assert later_db.stage_of(first) == "enqueued"


def test_enqueue_returns_a_lowercase_ulid_job_id(later_db):
    """enqueue returns a JobId: a 26-character lowercase ULID string."""
    job_id = later.enqueue(Noop())
    assert isinstance(job_id, later.JobId)
    assert ULID.match(job_id)


def test_enqueue_in_outside_atomic_raises_transaction_required(later_db):
    """enqueue_in without an open atomic block raises TransactionRequired, writing nothing."""
    with pytest.raises(later.TransactionRequired, match=re.escape(later_db.alias)):
        later.enqueue_in(Noop(n=1))
    assert later_db.job_count() == 0
    assert issubclass(later.TransactionRequired, later.LaterError)


def test_enqueue_in_atomic_on_another_database_raises_transaction_required(later_db):
    """An atomic block on a database other than LATER's does not satisfy enqueue_in."""
    others = [alias for alias in connections if alias != later_db.alias]
    assert others
    with pytest.raises(later.TransactionRequired), transaction.atomic(using=others[0]):
        later.enqueue_in(Noop(n=1))
    assert later_db.job_count() == 0


# -- 2. bad input --------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "where", "problem"),
    [
        (Order(id=1, items=[Item(name="pen", qty={1, 2})]), "payload.items[0].qty", "set"),
        (Order(id=1, note=object()), "payload.note", "object"),
        (Order(id=1, note=dt.datetime(2024, 1, 1)), "payload.note", "naive datetime"),
        (Noop(n=1 << 64), "payload.n", "64 bits"),
    ],
    ids=["set", "object", "naive-datetime", "huge-int"],
)
def test_enqueue_unsupported_value_raises_type_error_and_writes_nothing(
    later_db, payload, where, problem
):
    """An unsupported value anywhere in the payload is a TypeError naming its field."""
    later.enqueue(Noop())
    with pytest.raises(TypeError) as info:
        later.enqueue(payload)
    assert where in str(info.value)
    assert problem in str(info.value)
    assert later_db.job_count() == 1


def test_enqueue_oversize_payload_raises_payload_too_large(later_db, settings):
    """A payload above MAX_PAYLOAD_BYTES is refused, naming the limit; nothing is written."""
    set_later(settings, MAX_PAYLOAD_BYTES=100)
    later.enqueue(Order(id=1, note="x" * 50))  # under the limit
    with pytest.raises(later.PayloadTooLarge) as info:
        later.enqueue(Order(id=2, note="x" * 200))
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, ValueError)
    assert "MAX_PAYLOAD_BYTES" in str(info.value)
    assert "100" in str(info.value)
    with pytest.raises(later.PayloadTooLarge):
        later.enqueue_delayed(Order(id=3, note="x" * 200), dt.timedelta(seconds=1))
    assert later_db.job_count() == 1


def test_enqueue_delayed_at_naive_datetime_raises_value_error(later_db):
    """A naive datetime for enqueue_delayed_at is refused, naming the argument."""
    with pytest.raises(ValueError, match=r"when=.*naive datetime"):
        later.enqueue_delayed_at(Noop(), dt.datetime(2030, 1, 1))
    with pytest.raises(TypeError, match="when must be a datetime"):
        later.enqueue_delayed_at(Noop(), "2030-01-01T00:00:00+00:00")
    assert later_db.job_count() == 0


def test_enqueue_continue_unknown_parent_raises_job_not_found(later_db):
    """A continuation of a job that does not exist raises JobNotFound, writing nothing."""
    later.enqueue(Noop())
    missing = new_job_id()
    with pytest.raises(later.JobNotFound, match=missing):
        later.enqueue_continue(missing, Noop(n=1))
    assert later_db.job_count() == 1
    assert later.stage_counts()["waiting"] == 0


def test_enqueue_continue_parent_of_another_namespace_raises_job_not_found(later_db, settings):
    """A parent in another namespace is unknown to this one."""
    set_later(settings, NAMESPACE="elsewhere")
    parent = later.enqueue(Noop())
    set_later(settings, NAMESPACE="default")
    with pytest.raises(later.JobNotFound):
        later.enqueue_continue(parent, Noop(n=1))
    assert later_db.job_count() == 1


def test_enqueue_continue_malformed_parent_raises_value_error(later_db):
    """A parent that is not a job id raises ValueError naming the argument."""
    with pytest.raises(ValueError, match="parent="):
        later.enqueue_continue("not-a-job-id", Noop())
    assert later_db.job_count() == 0


@pytest.mark.parametrize("priority", [-101, 101, 1000])
def test_enqueue_priority_out_of_range_raises_value_error(later_db, priority):
    """Every enqueue form refuses a priority outside -100..100, writing nothing."""
    parent = later.enqueue(Noop())
    calls = [
        lambda: later.enqueue(Noop(), priority=priority),
        lambda: later.enqueue_many([Noop(), Noop()], priority=priority),
        lambda: later.enqueue_delayed(Noop(), dt.timedelta(seconds=1), priority=priority),
        lambda: later.enqueue_delayed_at(Noop(), dt.datetime.now(dt.UTC), priority=priority),
        lambda: later.enqueue_continue(parent, Noop(), priority=priority),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=rf"priority={priority} is out of range.*-100\.\.100"):
            call()
    assert later_db.job_count() == 1


def test_enqueue_priority_bounds_are_accepted(later_db):
    """Priorities -100 and 100 are stored as given."""
    low = later.enqueue(Noop(), priority=-100)
    high = later.enqueue(Noop(), priority=100)
    assert later.get_job(low).priority == -100
    assert later.get_job(high).priority == 100


@pytest.mark.parametrize("priority", [True, 1.5, "1"], ids=repr)
def test_enqueue_priority_of_wrong_type_raises_type_error(later_db, priority):
    """A priority that is not an int is a TypeError naming the argument."""
    with pytest.raises(TypeError, match="priority must be an int"):
        later.enqueue(Noop(), priority=priority)
    assert later_db.job_count() == 0


def test_enqueue_delayed_negative_delay_raises_value_error(later_db):
    """A negative delay is refused, naming the argument; nothing is written."""
    with pytest.raises(ValueError, match="delay=.* is negative"):
        later.enqueue_delayed(Noop(), dt.timedelta(seconds=-1))
    with pytest.raises(TypeError, match="delay must be a datetime.timedelta"):
        later.enqueue_delayed(Noop(), 5)
    assert later_db.job_count() == 0


def test_enqueue_delayed_zero_delay_and_past_time_are_ready_at_once(later_db):
    """A zero delay or a time in the past makes the job enqueued, not delayed."""
    zero = later.enqueue_delayed(Noop(), dt.timedelta(0))
    past = later.enqueue_delayed_at(Noop(), dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    future = later.enqueue_delayed_at(Noop(), dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    assert later_db.stage_of(zero) == "enqueued"
    assert later_db.stage_of(past) == "enqueued"
    assert later_db.stage_of(future) == "delayed"


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (Order(id=1, note={1, 2}), TypeError, "payload.note"),
        (Order(id=1, note="x" * 500), later.PayloadTooLarge, "MAX_PAYLOAD_BYTES"),
        (object(), TypeError, "object"),
        ("not a dataclass", TypeError, "str"),
    ],
    ids=["unsupported-value", "too-large", "unregistered-object", "str"],
)
def test_enqueue_many_with_one_bad_payload_writes_none(later_db, settings, bad, error, message):
    """One bad payload among good ones refuses the whole batch."""
    set_later(settings, MAX_PAYLOAD_BYTES=200)
    payloads = [Noop(n=1), Order(id=2), bad, Noop(n=4)]
    with pytest.raises(error, match=message):
        later.enqueue_many(payloads)
    assert later_db.job_count() == 0
    assert later.stage_counts()["enqueued"] == 0


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (Order(id=1, note={1, 2}), TypeError, "payload.note"),
        (Order(id=1, note="x" * 500), later.PayloadTooLarge, "MAX_PAYLOAD_BYTES"),
        (Order(id="one"), TypeError, "Order"),  # type: ignore[arg-type]
        ("not a dataclass", TypeError, "payload must be a dataclass instance, got str"),
        (Item(name="unregistered", qty=1), later.NotRegistered, "has no @job handler"),
    ],
    ids=["unsupported-value", "too-large", "wrong-type", "str", "unregistered"],
)
def test_enqueue_many_error_names_the_index_of_the_bad_payload(
    later_db, settings, bad, error, message
):
    """The error of a bad item in the middle says which one (payloads[3]), keeps
    its class and its own message; nothing is written, and the caller's atomic
    block stays usable."""
    set_later(settings, MAX_PAYLOAD_BYTES=200)
    with pytest.raises(error) as alone:
        later.enqueue(bad)
    payloads = [Noop(n=0), Order(id=1), Noop(n=2), bad, Noop(n=4), Noop(n=5)]
    with transaction.atomic(using=later_db.alias):
        kept = later.enqueue(Noop(n=-1))
        with pytest.raises(error) as raised:
            later.enqueue_many(payloads)
        after = later.enqueue(Noop(n=-2))
    assert type(raised.value) is type(alone.value)
    assert str(raised.value) == f"payloads[3]: {alone.value}"
    assert message in str(raised.value)
    assert {row[0] for row in later_db.rows("SELECT id FROM later_job")} == {kept, after}
    with pytest.raises(error, match=r"^payloads\[3\]: "):
        later.enqueue_many(payloads)
    assert later_db.job_count() == 2
    assert later.stage_counts()["enqueued"] == 2


def test_enqueue_many_failing_late_in_a_big_batch_leaves_the_callers_transaction_usable(
    later_db,
):
    """Rows are written while later ones are still encoded: a bad payload after
    the first thousand rolls back only the batch, not the caller's atomic block."""
    payloads: list[object] = [Noop(n=i) for i in range(1500)]
    payloads[1200] = Order(id=1, note={1, 2})
    with transaction.atomic(using=later_db.alias):
        kept = later.enqueue(Noop(n=-1))
        with pytest.raises(TypeError, match="payload.note"):
            later.enqueue_many(payloads)
        after = later.enqueue(Noop(n=-2))
    assert {row[0] for row in later_db.rows("SELECT id FROM later_job")} == {kept, after}
    assert later.stage_counts()["enqueued"] == 2


def test_enqueue_many_failing_late_outside_a_transaction_writes_nothing(later_db):
    payloads: list[object] = [Noop(n=i) for i in range(1500)]
    payloads[-1] = "not a dataclass"
    with pytest.raises(TypeError, match="str"):
        later.enqueue_many(payloads)
    assert later_db.job_count() == 0
    assert later.stage_counts()["enqueued"] == 0


def test_enqueue_many_of_nothing_writes_nothing(later_db):
    """An empty batch returns no ids and writes nothing."""
    assert later.enqueue_many([]) == []
    assert later_db.job_count() == 0


def test_enqueue_past_djangos_cursor_is_logged_and_refused_in_a_broken_transaction(later_db):
    """The single insert runs on the driver's connection (both vendors), yet
    Django's query log records it, and an atomic block broken by an earlier
    error refuses it as Django's cursor would."""
    db = connections[later_db.alias]
    with CaptureQueriesContext(db) as queries:
        job_id = later.enqueue(Noop(n=1))
    assert [q["sql"].lstrip()[:20].upper() for q in queries.captured_queries] == [
        "INSERT INTO LATER_JO"
    ]
    counts = later.stage_counts()
    with transaction.atomic(using=later_db.alias):
        # An error leaving an inner block without a savepoint breaks the outer one.
        with pytest.raises(DatabaseError):
            with transaction.atomic(using=later_db.alias, savepoint=False), db.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table")
        with pytest.raises(TransactionManagementError):
            later.enqueue(Noop(n=2))
    assert later.stage_counts() == counts
    assert later_db.stage_of(job_id) == "enqueued"


# -- 4. bulk ---------------------------------------------------------------------


def test_enqueue_many_writes_ten_thousand_jobs_in_batches(later_db):
    """10,000 payloads: ids in payload order, all rows present, batched writes
    (multi-row INSERTs on SQLite, one COPY on PostgreSQL)."""
    payloads = [Noop(n=i) for i in range(10_000)]
    with CaptureQueriesContext(connections[later_db.alias]) as queries:
        ids = later.enqueue_many(payloads)
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith(("INSERT INTO LATER_JOB", "COPY LATER_JOB"))
    ]
    assert 1 <= len(writes) <= 20, writes
    assert len(ids) == 10_000
    assert len(set(ids)) == 10_000
    assert all(isinstance(job_id, later.JobId) for job_id in ids)
    stored = dict(later_db.rows("SELECT id, payload FROM later_job"))
    assert set(stored) == set(ids)
    assert [codec.decode(bytes(stored[job_id]), Noop).n for job_id in ids] == list(range(10_000))
    assert later.stage_counts()["enqueued"] == 10_000


# -- 6. continuations ------------------------------------------------------------


def test_enqueue_continue_of_succeeded_parent_is_enqueued(later_db):
    """A child of a parent that already succeeded is ready at once."""
    parent = later.enqueue(Noop(), priority=100)
    _complete(later_db, _claim(later_db, parent))
    child = later.enqueue_continue(parent, Noop(n=1))
    info = later.get_job(child)
    assert info.stage == "enqueued"
    assert info.parent_id == parent
    assert info.last_error is None


@pytest.mark.parametrize("how", ["failed", "cancelled"])
def test_enqueue_continue_of_failed_or_cancelled_parent_is_failed(later_db, how):
    """A child of a failed or cancelled parent is stored failed with 'parent failed'."""
    parent = later.enqueue(Noop(), priority=100)
    if how == "failed":
        _fail(later_db, _claim(later_db, parent))
    else:
        assert later.cancel(parent)
    assert later_db.stage_of(parent) == how
    child = later.enqueue_continue(parent, Noop(n=1))
    info = later.get_job(child)
    assert info.stage == "failed"
    assert info.last_error == "parent failed"
    assert info.finished_at is not None and info.expires_at is not None
    assert later.stage_counts()["failed"] == (2 if how == "failed" else 1)


@pytest.mark.parametrize("parent_stage", ["enqueued", "running", "delayed", "requeued"])
def test_enqueue_continue_of_unfinished_parent_is_waiting(later_db, parent_stage):
    """A child of a parent that has not finished waits for it."""
    if parent_stage == "delayed":
        parent = later.enqueue_delayed(Noop(), dt.timedelta(hours=1))
    else:
        parent = later.enqueue(Noop(), priority=100)
    if parent_stage in ("running", "requeued"):
        claimed = _claim(later_db, parent)
        if parent_stage == "requeued":
            _retry(later_db, claimed, error="try again")
    assert later_db.stage_of(parent) == parent_stage
    child = later.enqueue_continue(parent, Noop(n=1))
    assert later.get_job(child).stage == "waiting"
    assert later.stage_counts()["waiting"] == 1


def test_enqueue_continue_child_is_released_when_parent_completes(later_db):
    """Completing the parent enqueues its waiting child; the grandchild keeps waiting."""
    parent = later.enqueue(Noop(), priority=100)
    claimed = _claim(later_db, parent)
    child = later.enqueue_continue(parent, Noop(n=1))
    grandchild = later.enqueue_continue(child, Noop(n=2))
    assert later_db.stage_of(child) == "waiting"
    _complete(later_db, claimed)
    assert later_db.stage_of(parent) == "success"
    assert later_db.stage_of(child) == "enqueued"
    assert later_db.stage_of(grandchild) == "waiting"
    assert [change.stage for change in later.get_job(child).history] == ["waiting", "enqueued"]
    assert later.stage_counts() == {
        **dict.fromkeys(later.Stage, 0),
        "success": 1,
        "enqueued": 1,
        "waiting": 1,
    }


def test_enqueue_continue_children_fail_when_parent_is_cancelled(later_db):
    """Cancelling a parent fails its waiting children and grandchildren."""
    parent = later.enqueue_delayed(Noop(), dt.timedelta(hours=1))
    children = [later.enqueue_continue(parent, Noop(n=i)) for i in range(2)]
    grandchild = later.enqueue_continue(children[0], Noop(n=9))
    bystander = later.enqueue(Noop(n=10))
    assert later.cancel(parent)
    assert later_db.stage_of(parent) == "cancelled"
    for job_id in [*children, grandchild]:
        info = later.get_job(job_id)
        assert info.stage == "failed"
        assert info.last_error == "parent failed"
    assert later_db.stage_of(bystander) == "enqueued"
    assert later.stage_counts() == {
        **dict.fromkeys(later.Stage, 0),
        "cancelled": 1,
        "failed": 3,
        "enqueued": 1,
    }


def test_enqueue_continue_children_fail_when_parent_fails(later_db):
    """A parent failing terminally fails its waiting descendants with 'parent failed'."""
    parent = later.enqueue(Noop(), priority=100)
    claimed = _claim(later_db, parent)
    child = later.enqueue_continue(parent, Noop(n=1))
    grandchild = later.enqueue_continue(child, Noop(n=2))
    _fail(later_db, claimed, error="handler exploded")
    assert later.get_job(parent).last_error == "handler exploded"
    assert later.get_job(child).last_error == "parent failed"
    assert later.get_job(grandchild).last_error == "parent failed"
    assert later.stage_counts()["failed"] == 3


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

    async def finish_parent() -> list[tuple[str, int]]:
        path = WorkerSessions(later_db.alias, prepare=True)
        try:
            claimed = await path.claim(
                ClaimRequest(namespace="default", owner="w", limit=1, lease_ms=30_000)
            )
            assert [job.id for job in claimed] == [parent]
            thread.start()
            await asyncio.to_thread(added.wait, 10)
            renewed = await asyncio.wait_for(in_thread(_renew, later_db, parent, owner="w"), 3)
            # Each finish fails the test if it waits for the caller (past 3 s)
            # or does not finish the parent.
            if parent_outcome == "success":
                completion = await asyncio.wait_for(
                    path.complete_many(owner="w", jobs=[(parent, 1)], retention_ms=60_000), 3
                )
                done = completion.done_ids
                assert done == [parent]
            else:
                await asyncio.wait_for(in_thread(_fail, later_db, claimed[0], owner="w"), 3)
            return renewed
        finally:
            await path.close()

    thread = threading.Thread(target=caller)
    renewed = asyncio.run(finish_parent())
    assert renewed == [(parent, 1)], "renewal did not wait for the caller"
    commit.set()
    thread.join(10)
    expected = "enqueued" if parent_outcome == "success" else "failed"
    # No maintenance runs here: the child is settled by its own commit.
    wait_until(
        lambda: later_db.stage_of(child[0]) == expected,
        3,
        lambda: f"child {expected}, is {later_db.stage_of(child[0])}",
    )


def test_cancel_asks_a_running_job_to_stop_and_refuses_finished_ones(later_db):
    """A running job is only marked (its server stops it, see
    test_worker_server); finished or unknown jobs: False, nothing changes."""
    running = later.enqueue(Noop(), priority=100)
    _claim(later_db, running)
    done = later.enqueue(Noop(), priority=100)
    _complete(later_db, _claim(later_db, done, owner="worker-2"), owner="worker-2")
    counts = later.stage_counts()
    assert later.cancel(running) is True
    asked = "SELECT cancel_requested_ms FROM later_job WHERE id = %s"
    first = later_db.scalar(asked, [running])
    assert first is not None
    assert later.cancel(running) is True
    assert later_db.scalar(asked, [running]) == first  # the first request's time is kept
    assert later.cancel(done) is False
    assert later.cancel(new_job_id()) is False
    assert later.stage_counts() == counts
    assert later_db.stage_of(running) == "running"
    assert later_db.scalar(asked, [done]) is None


def test_cancel_of_a_job_retried_while_it_looks_cancels_the_retry(later_db):
    """cancel() found the job running, and its worker's retry committed
    before the request did: the job, waiting to run again, is cancelled,
    and cancel() says so (False is for finished jobs only)."""
    job_id = later.enqueue(Noop(), priority=100)
    child = later.enqueue_continue(job_id, Noop(n=1))
    claimed = _claim(later_db, job_id)
    canceller, began, result = _cancel_in_thread(later_db, job_id)
    with job_row_locked(later_db, job_id) as write:
        canceller.start()
        assert began.wait(10), "the cancel sent no statement"
        if not dialect_for(later_db.alias).single_writer:
            # Its request of a running job waits for the row the retry holds.
            wait_until(
                lambda: _lock_waiters(later_db, min_age_ms=0),
                10,
                "the cancel to wait for the job's row",
            )
        write(
            "UPDATE later_job SET stage = 'requeued', run_at_ms = run_at_ms + 3600000, "
            "lease_owner = NULL, lease_expires_ms = NULL WHERE id = %s AND attempts = %s",
            [job_id, claimed.attempts],
        )
    canceller.join(10)
    assert result == {"cancelled": True}
    assert later_db.stage_of(job_id) == "cancelled"
    assert later_db.job_field(job_id, "cancel_requested_ms") is None
    assert later_db.stage_of(child) == "failed"


def test_a_failure_after_a_cancel_request_ends_cancelled_and_a_retry_clears_the_request(
    later_db,
):
    """A cancel requested while the attempt ran wins over its failure for
    good; a failed job that still carries a request (as an earlier release
    stored it) loses it when an operator retries it, so its next attempt's
    retry is a retry, not a cancel."""
    dialect = dialect_for(later_db.alias)
    job_id = later.enqueue(Noop(), priority=100)
    claimed = _claim(later_db, job_id)
    assert later.cancel(job_id) is True
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        failed = dialect.hot.fail(
            c,
            OwnerFence(job_id=job_id, attempts=claimed.attempts, owner="worker-1"),
            FailureWrite(error="boom", retention_ms=DAY_MS),
        )
    assert failed is False, "a failure does not pass a cancel request"
    assert later_db.stage_of(job_id) == "running"

    leftover = later.enqueue(Noop(n=2), priority=100)
    later_db.execute(
        "UPDATE later_job SET stage = 'failed', finished_ms = 1, last_error = 'boom', "
        "cancel_requested_ms = 1 WHERE id = %s",
        [leftover],
    )
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        assert dialect.control.retry_failed(c, namespace=conf.namespace, job_id=leftover) == 0
    assert later_db.job_field(leftover, "cancel_requested_ms") is None
    retried = _claim(later_db, leftover)
    _retry(later_db, retried, error="again")
    assert later_db.stage_of(leftover) == "requeued"


def test_stage_time_never_goes_back_behind_a_writer_that_waited(later_db):
    """A write that waited for another writer of the job stamps its stage
    change no earlier than that writer's, so history stays in order."""
    job_id = later.enqueue_delayed(Noop(), dt.timedelta(hours=1))
    writer, began, result = _cancel_in_thread(later_db, job_id)
    with job_row_locked(later_db, job_id) as write:
        writer.start()
        assert began.wait(10), "the cancel sent no statement"
        if not dialect_for(later_db.alias).single_writer:
            # The cancel waits for the row, in a transaction that began well
            # before the write below (one writer at a time: it waits to begin).
            wait_until(
                lambda: _lock_waiters(later_db, min_age_ms=50),
                10,
                "the cancel to wait for the job's row",
            )
        other_ms = int(time.time() * 1000)
        write(
            "UPDATE later_job SET changed_ms = %s, history = history || %s WHERE id = %s",
            [other_ms, f"delayed@{other_ms};", job_id],
        )
    writer.join(10)
    assert result == {"cancelled": True}
    stage, _, history = later_db.job_row(job_id)
    assert stage == "cancelled"
    stamps = history_times_ms(history)
    assert stamps == sorted(stamps), history
    assert stamps[-1] >= other_ms, (
        f"the cancel was stamped {other_ms - stamps[-1]} ms before the write it waited for"
    )


# -- 9. async twins --------------------------------------------------------------


def test_async_twins_enqueue_read_and_cancel(later_db):
    """aenqueue, aenqueue_many, aenqueue_delayed(_at), aenqueue_continue, aget_job,
    astage_counts and acancel behave like their sync twins."""
    seen: dict[str, object] = {}

    async def scenario() -> None:
        try:
            seen["first"] = await later.aenqueue(AsyncNoop(n=1), priority=5)
            seen["many"] = await later.aenqueue_many([Noop(n=2), Noop(n=3)])
            delayed = await later.aenqueue_delayed(Noop(n=4), dt.timedelta(hours=1))
            seen["at"] = await later.aenqueue_delayed_at(
                Noop(n=5), dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
            )
            child = await later.aenqueue_continue(delayed, Noop(n=6))
            with pytest.raises(later.TransactionRequired):
                await later.aenqueue_in(Noop(n=7))
            with pytest.raises(later.JobNotFound):
                await later.aenqueue_continue(new_job_id(), Noop(n=8))
            seen["info"] = await later.aget_job(seen["first"])
            seen["missing"] = await later.aget_job(new_job_id())
            seen["counts_before"] = await later.astage_counts()
            seen["cancelled"] = await later.acancel(delayed)
            seen["cancelled_again"] = await later.acancel(delayed)
            seen["counts_after"] = await later.astage_counts()
            seen["child"] = await later.aget_job(child)
        finally:
            # The async twins ran on asgiref's worker thread: close its connections.
            await sync_to_async(connections.close_all)()

    asyncio.run(scenario())
    assert len(seen["many"]) == 2 and all(ULID.match(job_id) for job_id in seen["many"])
    info = seen["info"]
    assert info.id == seen["first"] and info.stage == "enqueued" and info.priority == 5
    assert info.type_name == "tests.jobapp.jobs.AsyncNoop"
    assert seen["missing"] is None
    before = seen["counts_before"]
    assert (before["enqueued"], before["delayed"], before["waiting"]) == (3, 2, 1)
    assert seen["cancelled"] is True and seen["cancelled_again"] is False
    after = seen["counts_after"]
    assert (after["cancelled"], after["delayed"], after["failed"]) == (1, 1, 1)
    assert seen["child"].stage == "failed" and seen["child"].last_error == "parent failed"
    assert later_db.stage_of(seen["at"]) == "delayed"
    assert later_db.job_count() == 6


def test_aenqueue_in_from_async_code_raises_transaction_required_naming_itself(later_db):
    """Async code holds no atomic block: the error names aenqueue_in, says why,
    and points to enqueue_in under sync_to_async or to aenqueue."""

    async def scenario() -> None:
        try:
            await later.aenqueue_in(Noop(n=1))
        finally:
            await sync_to_async(connections.close_all)()

    with pytest.raises(later.TransactionRequired) as raised:
        asyncio.run(scenario())
    message = str(raised.value)
    assert message.startswith("aenqueue_in() found no open transaction.atomic(")
    assert "async code cannot hold one" in message
    assert "enqueue_in() in one sync function" in message
    assert "sync_to_async()" in message
    assert "aenqueue()" in message
    assert later_db.job_count() == 0


def test_enqueue_in_through_sync_to_async_commits_with_the_writes_around_it(later_db):
    """The way docs/reference/enqueue.md gives async code: one sync function holds the
    block, enqueue_in inside it, awaited through sync_to_async."""

    def place(n: int, fail: bool) -> str:
        with transaction.atomic(using=later_db.alias):
            job_id = later.enqueue_in(Noop(n=n))
            if fail:
                raise Rollback
        return job_id

    async def scenario() -> str:
        try:
            with pytest.raises(Rollback):
                await sync_to_async(place)(1, True)
            return await sync_to_async(place)(2, False)
        finally:
            await sync_to_async(connections.close_all)()

    kept = asyncio.run(scenario())
    assert [row[0] for row in later_db.rows("SELECT id FROM later_job")] == [kept]


def test_aenqueue_in_under_async_to_sync_joins_the_callers_block(later_db):
    """aenqueue_in runs on the calling sync thread when a coroutine is driven by
    async_to_sync inside an atomic block, so it joins that block."""
    from asgiref.sync import async_to_sync

    async def enqueue_from_async(n: int) -> str:
        return await later.aenqueue_in(Noop(n=n))

    with pytest.raises(Rollback):
        with transaction.atomic(using=later_db.alias):
            async_to_sync(enqueue_from_async)(1)
            assert later_db.job_count() == 1
            raise Rollback
    assert later_db.job_count() == 0
    with transaction.atomic(using=later_db.alias):
        kept = async_to_sync(enqueue_from_async)(2)
    assert [row[0] for row in later_db.rows("SELECT id FROM later_job")] == [kept]


# -- 10. get_job -----------------------------------------------------------------


def test_get_job_reports_history_attempts_and_last_error(later_db):
    """get_job returns every stage change with aware times, attempts and the last error."""
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    job_id = later.enqueue(Noop(), priority=100)
    _retry(later_db, _claim(later_db, job_id), error="first failure")
    assert _promote(later_db) == 1
    _fail(later_db, _claim(later_db, job_id), error="second failure")
    after = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)

    info = later.get_job(job_id)
    assert info.id == job_id
    assert info.type_name == "tests.jobapp.jobs.Noop"
    assert info.stage == "failed"
    assert info.attempts == 2
    assert info.last_error == "second failure"
    assert info.parent_id is None
    assert [change.stage for change in info.history] == [
        "enqueued",
        "running",
        "requeued",
        "enqueued",
        "running",
        "failed",
    ]
    times = [change.at for change in info.history]
    assert all(isinstance(change, later.StageChange) for change in info.history)
    assert all(at.tzinfo is not None and at.utcoffset() == dt.timedelta(0) for at in times)
    assert times == sorted(times)
    assert before <= times[0] and times[-1] <= after
    for moment in (info.created_at, info.run_at, info.started_at, info.finished_at):
        assert moment is not None and moment.tzinfo is not None
    assert info.expires_at > info.finished_at


def test_get_job_reports_parent_of_a_continuation(later_db):
    """A continuation's JobInfo names its parent; a plain job has none."""
    parent = later.enqueue(Noop())
    child = later.enqueue_continue(parent, Order(id=1))
    info = later.get_job(child)
    assert info.parent_id == parent
    assert isinstance(info.parent_id, later.JobId)
    assert info.type_name == "tests.jobapp.jobs.Order"
    assert info.attempts == 0 and info.last_error is None and info.started_at is None
    assert [change.stage for change in info.history] == ["waiting"]


def test_get_job_of_unknown_id_returns_none(later_db, settings):
    """An id that was never enqueued, or was enqueued in another namespace, gives None."""
    later.enqueue(Noop())
    assert later.get_job(new_job_id()) is None
    base = dict(settings.LATER)
    settings.LATER = {**base, "NAMESPACE": "elsewhere"}
    foreign = later.enqueue(Noop())
    assert later.get_job(foreign) is not None
    settings.LATER = base
    assert later.get_job(foreign) is None


def test_get_job_accepts_an_uppercase_id(later_db):
    """Ids are case-insensitive, like ULIDs."""
    job_id = later.enqueue(Noop())
    assert later.get_job(job_id.upper()).id == job_id


@pytest.mark.parametrize("bad", ["", "nope", "0" * 25, "u" * 26, "0" * 27], ids=repr)
def test_get_job_of_malformed_id_raises_value_error(bad):
    """A string that cannot be a job id raises ValueError naming the argument."""
    with pytest.raises(ValueError, match="job_id=.* is not a job id"):
        later.get_job(bad)


def test_stage_counts_lists_every_stage(later_db):
    """stage_counts has a key for every stage, zero where there are no jobs."""
    assert later.stage_counts() == dict.fromkeys(later.Stage, 0)
    later.enqueue(Noop())
    assert later.stage_counts() == {**dict.fromkeys(later.Stage, 0), "enqueued": 1}


@pytest.mark.parametrize("prepared", [True, False])
def test_prepared_statements_follow_the_setting(later_db, settings, prepared):
    """PostgreSQL prepares the enqueue INSERT on the caller's connection only
    when LATER['PREPARED_STATEMENTS'] allows it (a pooler may not keep them)."""
    set_later(settings, PREPARED_STATEMENTS=prepared)
    connections[later_db.alias].close()  # a fresh session: nothing prepared yet
    job_id = later.enqueue(Noop(n=1))
    assert later_db.stage_of(job_id) == "enqueued"
    if later_db.vendor == "postgresql":
        statements = later_db.rows("SELECT statement FROM pg_prepared_statements")
        inserts = [s for (s,) in statements if "INSERT INTO later_job" in str(s)]
        assert bool(inserts) is prepared, statements


INSERT_CHECK_COLUMNS = (
    "id, namespace, type_name, payload, stage, priority, attempts, retry_policy, "
    "parent_id, created_ms, run_at_ms, changed_ms, history"
)
# Characters the bulk write must escape (COPY's text format on PostgreSQL).
awkward_text = st.text(
    alphabet=st.sampled_from(["a", "\t", "\n", "\r", "\\", "N", "é", "\u2028", " ", "x"]),
    min_size=1,
    max_size=12,
)


@hypothesis_settings(
    deadline=None, max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    namespace=awkward_text,
    type_name=awkward_text,
    policy=st.one_of(st.none(), awkward_text),
    payloads=st.lists(st.binary(max_size=20), min_size=2, max_size=5),
)
def test_bulk_insert_stores_every_value_as_given(later_db, namespace, type_name, policy, payloads):
    """Whatever a namespace, handler name or stored policy holds (tabs,
    newlines, backslashes, \\N), a batch stores exactly those values."""
    jobs = [
        NewJob(
            id=new_job_id(),
            namespace=namespace,
            type_name=type_name,
            payload=payload,
            priority=-3,
            retry_policy=policy,
        )
        for payload in payloads
    ]
    with transaction.atomic(using=later_db.alias):
        dialect_for(later_db.alias).enqueue.insert_many(connections[later_db.alias], jobs)
    try:
        stored = later_db.rows(f"SELECT {INSERT_CHECK_COLUMNS} FROM later_job ORDER BY id")
        expected = [
            (j.id, namespace, type_name, j.payload, "enqueued", -3, 0, policy, None) for j in jobs
        ]
        assert [(*row[:3], bytes(row[3]), *row[4:9]) for row in stored] == expected  # type: ignore[arg-type]
        # Times are the database's, one per batch, the same in every column.
        times = {(row[9], row[10], row[11], row[12]) for row in stored}
        assert len(times) == 1
        created, run_at, changed, history = times.pop()
        assert created == run_at == changed
        assert history == f"enqueued@{created};"
    finally:
        with connections[later_db.alias].cursor() as cursor:
            cursor.execute("DELETE FROM later_job")
