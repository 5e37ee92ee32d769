"""The enqueue store (``dialect.enqueue``): inserts of one job, of many, of a
continuation, of a unique job and of a fan-in child with its parent list;
settling a child after its commit; the trace context recorded on new jobs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections, transaction

from later_django.db.rows import (
    FailureWrite,
    FanInInsert,
)
from later_django.ids import new_job_id
from later_django.states import PARENT_FAILED
from later_django.types import NewJob
from tests.conformance.helpers import (
    DAY_MS,
    HOUR_MS,
    NS,
    assert_counts,
    claim,
    complete,
    cursor_of,
    db_now,
    fan_in_rows,
    finish_unseen,
    insert,
    insert_child,
    insert_fan_in,
    job_row,
    new_job,
    owned,
    stages,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


def test_insert_one_decides_ready_or_delayed_by_the_database_clock(later_db, dialect):
    """A job is ready unless it is due later than the database's now; its
    times are the database's, taken by the insert."""
    db = connections[later_db.alias]
    before = db_now(later_db)
    ready, delayed = new_job(priority=5, retry_policy='{"max": 2}'), new_job(delay_ms=HOUR_MS)
    past, future = new_job(run_at_ms=before - HOUR_MS), new_job(run_at_ms=before + DAY_MS)
    assert [
        dialect.enqueue.insert_one(db, job, prepare=True) for job in (ready, delayed, past, future)
    ] == [
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


def test_insert_many_writes_every_job_ready_or_none(later_db, dialect):
    """A bulk insert writes every job ready, in more than one batch where the
    database needs batches; an error while the jobs are built writes none."""
    db = connections[later_db.alias]
    jobs = [new_job(payload=bytes([n % 256]) * (n % 7), priority=n % 3) for n in range(1200)]
    before = db_now(later_db)
    with transaction.atomic(using=later_db.alias):
        dialect.enqueue.insert_many(db, iter(jobs))
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
        dialect.enqueue.insert_many(db, broken())
    assert later_db.job_count() == len(jobs)
    assert_counts(later_db)


def test_insert_unique_writes_once_per_key_and_returns_the_holder(later_db, dialect):
    """A job with a unique key is written while no unfinished job of its
    type holds the key; otherwise nothing is written and the holder's id
    comes back. A window also holds it over finished jobs; a unique
    continuation of a missing parent writes nothing and returns None."""

    def put(**fields: object):
        job = new_job(**fields)
        with cursor_of(later_db, atomic=True) as c:
            return job.id, dialect.enqueue.insert_unique(c, job, DAY_MS)

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


def test_insert_continuation_follows_its_parent(later_db, dialect):
    """A child waits for a parent that has not finished, is ready after one
    that succeeded, and fails after one that failed or was cancelled; with
    no parent in the namespace nothing is inserted."""
    running, succeeded, failed = insert(later_db), insert(later_db), insert(later_db)
    cancelled, elsewhere = insert(later_db), insert(later_db, namespace="other")
    first = claim(later_db, limit=3)
    by_id = {job.id: job for job in first}
    assert complete(later_db, [(succeeded, 1)]).done_ids == [succeeded]
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.hot.fail(c, owned(by_id[failed]), FailureWrite(error="x", retention_ms=1))
        assert dialect.control.cancel(c, namespace=NS, job_id=cancelled, retention_ms=DAY_MS)
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


def test_settle_child_releases_or_fails_a_child_its_parent_missed(later_db, dialect):
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
            settled.append(dialect.enqueue.settle_child(c, job_id=child, retention_ms=DAY_MS))
    after = db_now(later_db)
    assert settled == ["released", "failed", "waiting"]
    assert stages(later_db, *children, grandchild) == ["enqueued", "failed", "waiting", "failed"]
    released = job_row(later_db, children[0])
    assert before <= released["run_at_ms"] == released["changed_ms"] <= after
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.enqueue.settle_child(c, job_id=children[0], retention_ms=DAY_MS) == "waiting"
    assert_counts(later_db)


def test_set_trace_marks_only_the_named_jobs_in_batches(later_db, dialect):
    """The enqueuing span's context lands on the jobs named (more of them than
    one statement takes), with no stage change; others stay NULL."""
    from later_django.db.enqueue import TRACE_BATCH

    marked = [insert(later_db) for _ in range(TRACE_BATCH + 3)]
    other = insert(later_db)
    context = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    with cursor_of(later_db, atomic=True) as c:
        dialect.enqueue.set_trace(c, marked, context)
    with cursor_of(later_db) as c:
        assert dialect.hot.trace_context(c, job_id=marked[0]) == context
        assert dialect.hot.trace_context(c, job_id=marked[-1]) == context
        assert dialect.hot.trace_context(c, job_id=other) is None
        assert dialect.hot.trace_context(c, job_id=new_job_id()) is None
    traced = later_db.scalar("SELECT COUNT(*) FROM later_job WHERE trace_context IS NOT NULL")
    assert traced == len(marked)
    assert stages(later_db, marked[0], other) == ["enqueued", "enqueued"]
    assert_counts(later_db)


def test_insert_fan_in_follows_all_its_parents(later_db, dialect):
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
        dialect.hot.fail(c, owned(claimed[failed]), FailureWrite(error="x", retention_ms=1))
        assert dialect.control.cancel(c, namespace=NS, job_id=cancelled, retention_ms=DAY_MS)
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


def test_settle_fan_in_resolves_a_child_its_parents_missed(later_db, dialect):
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
            return dialect.enqueue.settle_fan_in(c, job_id=child, retention_ms=DAY_MS)

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
