"""The partition store (``dialect.partitions``): topics and sequential
partition mode (sequences, partition leases and heads, an operator's
actions on a partition).
"""

from __future__ import annotations

import pytest

from later_django.db import dialect_for
from later_django.db.rows import (
    HeadFailure,
    HeadSuccesses,
    Heartbeat,
    PartitionCompletion,
    PartitionSlot,
)
from later_django.ids import new_job_id
from later_django.types import PartitionLane
from tests.conformance.helpers import (
    DAY_MS,
    HOUR_MS,
    LEASE_MS,
    NS,
    ORDERS,
    assert_counts,
    claim,
    claim_head,
    complete_head,
    complete_heads,
    cursor_of,
    heads_of,
    insert,
    insert_partitioned,
    new_job,
    stages,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


def beat(later_db, server_id: str, *, topics: bool = True) -> None:
    with cursor_of(later_db) as c:
        heartbeat = Heartbeat(
            server_id=server_id, namespace=NS, hostname="h", pid=1, workers=1, topics=topics
        )
        dialect_for(later_db.alias).cluster.server_heartbeat(c, heartbeat)


def head_failure(job_id: str | None) -> HeadFailure:
    return HeadFailure(lane=ORDERS, error="boom", retention_ms=DAY_MS, job_id=job_id)


# -- topics -----------------------------------------------------------------------------


def test_topic_register_once_and_partitions(later_db, dialect):
    """A topic is registered once; its partition count is never changed by
    registering it again."""
    with cursor_of(later_db) as c:
        assert dialect.partitions.topic_partitions(c, namespace=NS) == {}
        assert (
            dialect.partitions.topic_register(c, namespace=NS, name="orders", partitions=4) is True
        )
        assert (
            dialect.partitions.topic_register(c, namespace=NS, name="orders", partitions=8) is False
        )
        assert (
            dialect.partitions.topic_register(c, namespace=NS, name="events", partitions=1) is True
        )
        assert dialect.partitions.topic_partitions(c, namespace=NS) == {"orders": 4, "events": 1}
        # Another namespace registers its own.
        assert (
            dialect.partitions.topic_register(c, namespace="other", name="orders", partitions=2)
            is True
        )
        assert dialect.partitions.topic_partitions(c, namespace="other") == {"orders": 2}


# -- sequential partition mode ----------------------------------------------------------


def test_partition_jobs_get_gapless_sequences_and_stay_out_of_plain_reach(later_db, dialect):
    """Sequences count from 0 per partition; a rolled-back one is reused. A
    partition job is counted in its stage but never claimed, announced as
    ready or counted as plain backlog (the lane rule, docs/explanation/design.md)."""
    first, seq0 = insert_partitioned(later_db)
    with pytest.raises(RuntimeError), cursor_of(later_db, atomic=True) as c:
        dialect.partitions.partition_next_sequence(c, ORDERS)
        raise RuntimeError("roll back")
    delayed, seq1 = insert_partitioned(later_db, delay_ms=HOUR_MS)
    _, other_seq = insert_partitioned(later_db, PartitionLane(NS, "orders", 4))
    assert (seq0, seq1, other_seq) == (0, 1, 0)
    assert stages(later_db, first, delayed) == ["enqueued", "delayed"]
    parent = insert(later_db)
    child = new_job(parent_id=parent)
    with cursor_of(later_db, atomic=True) as c:
        sequence = dialect.partitions.partition_next_sequence(c, ORDERS)
        slot = PartitionSlot(ORDERS, sequence)
        assert dialect.partitions.insert_partitioned(c, child, slot, DAY_MS) == "waiting"
        missing = new_job(parent_id=new_job_id())
        assert (
            dialect.partitions.insert_partitioned(c, missing, slot._replace(sequence=99), DAY_MS)
            is None
        )
    with cursor_of(later_db) as c:
        assert dialect.reads.plain_ready(c, namespace=NS) == 1  # the parent only
        assert dialect.reads.stage_counts(c, namespace=NS)["enqueued"] == 3
    assert [job.id for job in claim(later_db, limit=10)] == [parent]
    with cursor_of(later_db) as c:
        assert dialect.hot.ready_exists(c, namespace=NS) is False
        assert dialect.reads.plain_ready(c, namespace=NS) == 0
    assert_counts(later_db)


def test_partition_claim_takes_the_ready_head_under_a_fenced_lease(later_db, dialect):
    """The lease goes to one live owner at a time with a higher epoch per new
    holder; only a ready head is claimed; heads and stats follow."""
    head, _ = insert_partitioned(later_db)
    second, _ = insert_partitioned(later_db)
    beat(later_db, "a")  # a live server: its lease is not taken before it expires
    with cursor_of(later_db) as c:
        heads = {
            (h.topic, h.partition): h for h in dialect.partitions.partition_heads(c, namespace=NS)
        }
    assert heads[("orders", 3)].job_id == head and heads[("orders", 3)].stage == "enqueued"
    assert heads_of(later_db) == list(heads.values())  # the worker's look: the same
    epoch, job = claim_head(later_db, "a")
    assert job is not None and job.id == head and job.lane == ORDERS._replace(epoch=epoch)
    assert claim_head(later_db, "b") is None  # a's lease is live
    assert claim_head(later_db, "a") == (epoch, None)  # the head runs: nothing to claim
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_fence(c, job.lane, owner="a") is True
        assert dialect.partitions.partition_fence(c, job.lane, owner="b") is False
        assert dialect.partitions.partition_renew(
            c, namespace=NS, owner="a", lease_ms=LEASE_MS
        ) == [ORDERS._replace(epoch=epoch)]
        stats = dialect.partitions.partition_stats(c, namespace=NS)
    assert [(s.partition, s.next_sequence, s.head_sequence, s.owner, s.depth) for s in stats] == [
        (3, 2, 0, "a", 2)
    ]
    stale = job._replace(lane=job.lane._replace(epoch=epoch - 1))
    for done, stored in ((stale, False), (job, True), (job, False)):
        completion = PartitionCompletion(job=done, owner="a", retention_ms=DAY_MS)
        with cursor_of(later_db, atomic=not dialect.partitions.writes_one_statement) as c:
            assert dialect.partitions.partition_complete(c, completion) is stored
        # The worker's own path (the asyncio connection's, where there is
        # one) agrees: nothing is stored twice, a stale epoch never.
        assert complete_head(later_db, completion) is False
    assert stages(later_db, head) == ["success"]
    _, next_head = claim_head(later_db, "a")
    assert next_head is not None and next_head.id == second
    completion = PartitionCompletion(job=next_head, owner="a", retention_ms=DAY_MS)
    assert complete_head(later_db, completion) is True
    assert stages(later_db, second) == ["success"]
    with cursor_of(later_db, atomic=True) as c:
        dialect.partitions.partition_release(c, namespace=NS, owner="a")
        assert dialect.partitions.partition_fence(c, job.lane, owner="a") is False
    taken = claim_head(later_db, "b")
    assert taken is not None and taken[0] == epoch + 1 and taken[1] is None


def successes(*heads, chain=None, owner="a") -> HeadSuccesses:
    return HeadSuccesses(
        owner=owner,
        heads=list(heads),
        chain=[True] * len(heads) if chain is None else chain,
        retention_ms=DAY_MS,
        job_lease_ms=LEASE_MS,
    )


def test_heads_succeed_in_one_batch_and_claim_their_partitions_next_heads(later_db, dialect):
    """One call stores the heads of several partitions and claims, for the
    partitions it is asked to, each one's next head if it is ready: in
    sequence order, under the same partition lease (epoch), with a job lease
    of the caller's."""
    lanes = [PartitionLane(NS, "orders", p) for p in (3, 4, 5)]
    a = [insert_partitioned(later_db, lanes[0])[0] for _ in range(3)]
    b = [insert_partitioned(later_db, lanes[1])[0]]
    b.append(insert_partitioned(later_db, lanes[1], delay_ms=HOUR_MS)[0])  # not ready
    c = [insert_partitioned(later_db, lanes[2])[0] for _ in range(2)]
    beat(later_db, "a")
    heads = [claim_head(later_db, "a", lane=lane)[1] for lane in lanes]
    assert [head.id for head in heads] == [a[0], b[0], c[0]]
    stored = complete_heads(later_db, successes(*heads, chain=[True, True, False]))
    assert sorted(stored.done_ids) == sorted([a[0], b[0], c[0]]) and stored.released == 0
    (next_head,) = stored.next_heads  # b's next is delayed; c's was not asked for
    assert next_head.id == a[1] and next_head.lane == heads[0].lane
    assert next_head.attempts == 1 and next_head.attempt == 1
    assert stages(later_db, *a, *b, *c) == [
        "success",
        "running",
        "enqueued",
        "success",
        "delayed",
        "success",
        "enqueued",
    ]
    assert later_db.rows(f"SELECT lease_owner FROM later_job WHERE id = '{a[1]}'") == [("a",)]
    # Head after head: the chain goes on in order, then stops at the end.
    stored = complete_heads(later_db, successes(next_head))
    assert stored.done_ids == [a[1]] and [h.id for h in stored.next_heads] == [a[2]]
    last = complete_heads(later_db, successes(stored.next_heads[0]))
    assert last.done_ids == [a[2]] and last.next_heads == []
    assert stages(later_db, *a) == ["success"] * 3
    assert_counts(later_db)


def test_a_batch_stores_only_heads_whose_claim_and_partition_lease_hold(later_db, dialect):
    """A head behind a stale epoch, another owner's lease, or a claim no
    longer its own is neither stored nor followed by a claim of its next
    head; the others of the batch are."""
    lanes = [PartitionLane(NS, "orders", p) for p in (3, 4, 5)]
    jobs = {lane: [insert_partitioned(later_db, lane)[0] for _ in range(2)] for lane in lanes}
    beat(later_db, "a")
    beat(later_db, "b")
    heads = [claim_head(later_db, "a", lane=lane)[1] for lane in lanes]
    stale = heads[0]._replace(lane=heads[0].lane._replace(epoch=heads[0].lane.epoch - 1))
    lost = heads[1]._replace(attempts=heads[1].attempts + 1)  # another attempt's claim
    stored = complete_heads(later_db, successes(stale, lost, heads[2]))
    assert stored.done_ids == [heads[2].id]
    assert [h.id for h in stored.next_heads] == [jobs[lanes[2]][1]]
    assert stages(later_db, *jobs[lanes[0]], *jobs[lanes[1]]) == [
        "running",
        "enqueued",
        "running",
        "enqueued",
    ]
    # Another server's lease: released by a, taken by b.
    with cursor_of(later_db, atomic=True) as c:
        dialect.partitions.partition_release(
            c, namespace=NS, owner="a", partition=("orders", lanes[0].partition)
        )
    assert claim_head(later_db, "b", lane=lanes[0]) is not None
    assert complete_heads(later_db, successes(heads[0])) == ([], 0, [])
    assert stages(later_db, heads[0].id) == ["running"]
    assert_counts(later_db)


def test_a_continuation_the_batch_releases_runs_next_once(later_db, dialect):
    """A partition's next job waiting on the head just stored becomes ready
    with it; it is then the partition's head, claimed once: by the same
    call, or by the next claim of the partition."""
    first, _ = insert_partitioned(later_db)
    child, _ = insert_partitioned(later_db, parent_id=first)
    beat(later_db, "a")
    _, head = claim_head(later_db, "a")
    stored = complete_heads(later_db, successes(head))
    assert stored.done_ids == [first] and stored.released == 1
    if not stored.next_heads:
        stored = stored._replace(next_heads=[claim_head(later_db, "a")[1]])
    assert [h.id for h in stored.next_heads] == [child]
    assert claim_head(later_db, "a")[1] is None  # running: not claimed twice
    assert stages(later_db, first, child) == ["success", "running"]
    assert_counts(later_db)


def test_partition_stats_covers_every_partition_of_a_registered_topic(later_db, dialect):
    """One row per partition of each topic registered in the namespace, the
    partitions that never had a job included (sequence 0, no head, no
    lease), and per partition that had a job in a topic no longer registered;
    another namespace's topics are not read."""
    with cursor_of(later_db) as c:
        dialect.partitions.topic_register(c, namespace=NS, name="orders", partitions=4)
        dialect.partitions.topic_register(c, namespace=NS, name="events", partitions=2)
        dialect.partitions.topic_register(c, namespace="other", name="audit", partitions=3)
    insert_partitioned(later_db)
    insert_partitioned(later_db)
    insert_partitioned(later_db, PartitionLane(NS, "legacy", 5))
    beat(later_db, "a")
    epoch, _ = claim_head(later_db, "a")
    with cursor_of(later_db) as c:
        stats = dialect.partitions.partition_stats(c, namespace=NS)
    rows = [
        (s.topic, s.partition, s.next_sequence, s.head_sequence, s.head_stage, s.owner, s.epoch)
        for s in stats
    ]
    assert rows == [
        ("events", 0, 0, None, None, None, 0),
        ("events", 1, 0, None, None, None, 0),
        ("legacy", 5, 1, 0, "enqueued", None, 0),
        ("orders", 0, 0, None, None, None, 0),
        ("orders", 1, 0, None, None, None, 0),
        ("orders", 2, 0, None, None, None, 0),
        ("orders", 3, 2, 0, "running", "a", epoch),
    ]
    assert [s.depth for s in stats] == [0, 0, 1, 0, 0, 0, 2]
    empty = [s for s in stats if s.head_sequence is None]
    assert {(s.head_run_at_ms, s.lease_expires_ms) for s in empty} == {(None, 0)}


def test_topic_servers_are_the_live_servers_that_poll_topics(later_db, dialect):
    for server_id, topics in (("s1", True), ("s2", False), ("s3", True)):
        beat(later_db, server_id, topics=topics)
    with cursor_of(later_db) as c:
        assert dialect.partitions.topic_servers(c, namespace=NS, ttl_ms=LEASE_MS) == ["s1", "s3"]


def test_place_of_tells_a_jobs_topic_and_partition(later_db, dialect):
    partitioned, _ = insert_partitioned(later_db)
    plain = insert(later_db)
    with cursor_of(later_db) as c:
        assert dialect.partitions.place_of(c, namespace=NS, job_id=partitioned) == ("orders", 3)
        assert dialect.partitions.place_of(c, namespace=NS, job_id=plain) == (None, None)
        assert dialect.partitions.place_of(c, namespace="other", job_id=plain) is None
        assert dialect.partitions.place_of(c, namespace=NS, job_id="0" * 26) is None


# -- an operator's actions on a partition -----------------------------------------------


def test_force_fail_of_a_finished_job_changes_nothing(later_db, dialect):
    """force_fail with the id of a head that finished meanwhile returns None
    and touches no lease, epoch or job: the next head, running now, keeps
    its lease and its success is stored (an operator's stale page)."""
    first, _ = insert_partitioned(later_db)
    second, _ = insert_partitioned(later_db)
    beat(later_db, "a")
    epoch, job = claim_head(later_db, "a")
    done = PartitionCompletion(job=job, owner="a", retention_ms=DAY_MS)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_complete(c, done) is True
    epoch, running = claim_head(later_db, "a")
    assert running is not None and running.id == second
    lease = later_db.rows(
        "SELECT owner, epoch, lease_expires_ms FROM later_partition WHERE topic = 'orders'"
    )
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_force_fail_head(c, head_failure(first)) is None
    assert (
        later_db.rows(
            "SELECT owner, epoch, lease_expires_ms FROM later_partition WHERE topic = 'orders'"
        )
        == lease
    )
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_fence(c, running.lane, owner="a") is True
        ok = PartitionCompletion(job=running, owner="a", retention_ms=DAY_MS)
        assert dialect.partitions.partition_complete(c, ok) is True
    assert stages(later_db, first, second) == ["success", "success"]


def test_force_fail_and_truncate_act_on_one_partition(later_db, dialect):
    """force_fail fails the head whatever its stage (and its waiting
    children) and moves the epoch on; truncate keeps the newest finished."""
    ids = [insert_partitioned(later_db)[0] for _ in range(4)]
    epoch, job = claim_head(later_db, "a")
    with cursor_of(later_db, atomic=True) as c:
        wrong = HeadFailure(lane=ORDERS, error="boom", retention_ms=DAY_MS, job_id=ids[1])
        assert (
            dialect.partitions.partition_force_fail_head(c, wrong) is None
        )  # ids[1] is not the head
        assert dialect.partitions.partition_fence(c, job.lane, owner="a") is True  # untouched
        failed = dialect.partitions.partition_force_fail_head(c, head_failure(ids[0]))
        assert failed == ids[0]
        assert dialect.partitions.partition_fence(c, job.lane, owner="a") is False
    assert stages(later_db, *ids) == ["failed", "enqueued", "enqueued", "enqueued"]
    for _ in range(2):
        with cursor_of(later_db, atomic=True) as c:
            dialect.partitions.partition_force_fail_head(c, head_failure(None))
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_truncate_history(c, ORDERS, 1) == 2
        nothing = HeadFailure(lane=PartitionLane(NS, "none", 0), error="x", retention_ms=1)
        assert dialect.partitions.partition_force_fail_head(c, nothing) is None
    assert [row[0] for row in later_db.rows("SELECT id FROM later_job ORDER BY sequence")] == ids[
        2:
    ]
    assert_counts(later_db)
