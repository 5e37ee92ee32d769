"""Maintenance of jobs (``dialect.upkeep``): due jobs made ready, stuck jobs
found, orphans resolved, finished jobs pruned, the wait for the next due
job, the stage counters' folding.
"""

from __future__ import annotations

import pytest

from later_django.db.rows import (
    Orphan,
    RetryWrite,
    StuckJob,
    TaskAttemptEnd,
)
from later_django.states import PARENT_FAILED, Stage
from tests.conformance.helpers import (
    HOUR_MS,
    LEASE_MS,
    NS,
    OWNER,
    age,
    assert_counts,
    claim,
    claim_one,
    complete,
    cursor_of,
    db_now,
    fan_in_rows,
    finish_unseen,
    insert,
    insert_child,
    insert_fan_in,
    job_row,
    owned,
    stages,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


def test_promote_due_makes_due_jobs_ready(later_db, dialect):
    """Delayed and requeued jobs whose time came become ready, at most
    ``limit`` a call; those not due yet wait."""
    due = [insert(later_db, delay_ms=HOUR_MS) for _ in range(3)]
    later_one = insert(later_db, delay_ms=HOUR_MS)
    requeued = insert(later_db)
    job = claim_one(later_db, requeued)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.hot.retry(c, owned(job), RetryWrite(delay_ms=HOUR_MS, error="x"))
    for job_id in (*due, requeued):
        age(later_db, "run_at_ms", job_id, 2 * HOUR_MS)
    with cursor_of(later_db) as c:
        assert dialect.upkeep.promote_due(c, namespace="other", limit=10) == 0
        assert dialect.upkeep.promote_due(c, namespace=NS, limit=2) == 2
        assert dialect.upkeep.promote_due(c, namespace=NS, limit=10) == 2
        assert dialect.upkeep.promote_due(c, namespace=NS, limit=10) == 0
    assert stages(later_db, *due, requeued, later_one) == ["enqueued"] * 4 + ["delayed"]
    assert_counts(later_db)


def test_stuck_lists_running_jobs_whose_lease_expired_long_enough(later_db, dialect):
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
        stuck = dialect.upkeep.stuck(c, namespace=NS, expired_for_ms=10_000, limit=10)
        assert dialect.upkeep.stuck(c, namespace=NS, expired_for_ms=10_000, limit=1) == stuck[:1]
        assert dialect.upkeep.stuck(c, namespace=NS, expired_for_ms=60_000, limit=10) == []
        assert dialect.upkeep.stuck(c, namespace="other", expired_for_ms=0, limit=10) == []
    assert stuck == [
        StuckJob(
            id=b, type_name="conformance.Job", attempts=2, retry_policy='{"max": 1}', attempt=1
        ),
        StuckJob(id=a, type_name="conformance.Job", attempts=1, retry_policy=None, attempt=1),
    ]


def test_orphans_are_resolved_by_their_parents_end(later_db, dialect):
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
        orphans = dialect.upkeep.orphans(c, namespace=NS, limit=10)
        assert dialect.upkeep.orphans(c, namespace="other", limit=10) == []
        assert len(dialect.upkeep.orphans(c, namespace=NS, limit=1)) == 1
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
            dialect.upkeep.resolve_orphan(c, orphan, retention_ms=HOUR_MS)
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
        assert dialect.upkeep.orphans(c, namespace=NS, limit=10) == []
    assert_counts(later_db)


def test_prune_deletes_finished_jobs_past_their_retention(later_db, dialect):
    """Only finished jobs whose expiry passed go, at most ``limit`` a call,
    and the task results of those that go with them."""
    gone = [insert(later_db) for _ in range(3)]
    kept, running = insert(later_db), insert(later_db)
    claim(later_db, limit=5)
    for job_id in (gone[0], kept):
        with cursor_of(later_db) as c:
            end = TaskAttemptEnd(job_id=job_id, earlier_workers="[", errors="[]", return_value="1")
            dialect.hot.task_results_write(c, owner=OWNER, ends=[end])
    ready = insert(later_db)
    assert len(complete(later_db, [(job_id, 1) for job_id in gone], retention_ms=0).done_ids) == 3
    assert complete(later_db, [(kept, 1)], retention_ms=HOUR_MS).done_ids == [kept]
    with cursor_of(later_db) as c:
        assert dialect.upkeep.prune(c, namespace="other", limit=10) == 0
        assert dialect.upkeep.prune(c, namespace=NS, limit=2) == 2
        assert dialect.upkeep.prune(c, namespace=NS, limit=10) == 1
        assert dialect.upkeep.prune(c, namespace=NS, limit=10) == 0
    remaining = {str(r[0]) for r in later_db.rows("SELECT id FROM later_job")}
    assert remaining == {kept, running, ready}
    assert later_db.rows("SELECT job_id FROM later_task_result") == [(kept,)]
    assert_counts(later_db)


def test_next_due_in_is_the_wait_for_the_first_delayed_or_requeued_job(later_db, dialect):
    """None while no job of the namespace waits for its time; else the first
    delayed or requeued job's run_at minus the database's now (not above
    zero once it is due). Ready jobs and other namespaces do not count."""

    def due_in(namespace: str = NS) -> tuple[int, int | None, int]:
        before = db_now(later_db)
        with cursor_of(later_db) as c:
            value = dialect.upkeep.next_due_in(c, namespace=namespace)
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
        assert dialect.hot.retry(c, owned(job), RetryWrite(delay_ms=HOUR_MS, error="x"))
    assert_due_in(job_row(later_db, retried)["run_at_ms"])
    age(later_db, "run_at_ms", retried, 2 * HOUR_MS)
    assert assert_due_in(job_row(later_db, retried)["run_at_ms"]) < 0, "overdue"
    other_run_at = later_db.scalar(
        "SELECT run_at_ms FROM later_job WHERE namespace = 'other' AND stage = 'delayed'"
    )
    assert 0 < assert_due_in(int(other_run_at), namespace="other") <= 60_000


def test_stage_counts_has_every_stage_and_counter_compact_keeps_them(later_db, dialect):
    """Counts cover every stage, zero included, and stay exact when the
    counter rows are folded together (into at most one row a stage)."""
    with cursor_of(later_db) as c:
        assert dialect.reads.stage_counts(c, namespace=NS) == dict.fromkeys(Stage.values, 0)
    ids = [insert(later_db) for _ in range(6)] + [insert(later_db, namespace="other")]
    claim(later_db, limit=4)
    complete(later_db, [(ids[0], 1), (ids[1], 1)])
    with cursor_of(later_db, atomic=True) as c:
        dialect.control.cancel(c, namespace=NS, job_id=ids[5], retention_ms=1)
    assert_counts(later_db)
    with cursor_of(later_db, atomic=True) as c:
        c.execute("SELECT COUNT(*) FROM later_stage_count WHERE namespace = %s", [NS])
        rows_before = int(c.fetchone()[0])
        folded = dialect.upkeep.counter_compact(c, namespace=NS)
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


def test_orphans_resolve_fan_in_children_by_all_their_parents(later_db, dialect):
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
        orphans = dialect.upkeep.orphans(c, namespace=NS, limit=10)
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
            dialect.upkeep.resolve_orphan(c, orphan, retention_ms=HOUR_MS)
    assert stages(later_db, repointed, released, failed) == ["waiting", "enqueued", "failed"]
    assert (
        job_row(later_db, repointed)["parent_id"]
        == (set(parents[0:2]) - {pointers[repointed]}).pop()
    )
    with cursor_of(later_db) as c:
        assert dialect.upkeep.orphans(c, namespace=NS, limit=10) == []
    assert_counts(later_db)


def test_prune_deletes_a_fan_in_childs_parent_list(later_db, dialect):
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
        assert dialect.upkeep.prune(c, namespace=NS, limit=10) == 3
    assert fan_in_rows(later_db) == sorted((other, parent) for parent in parents)
