"""The read models (``dialect.reads``): what the dashboard reads, its figures,
lists and lookups.
"""

from __future__ import annotations

import pytest

from later_django.db.rows import (
    Heartbeat,
    JobQuery,
    LogCommit,
    LogConsumerKey,
    LogFence,
    LogLeaseRequest,
    StatRow,
)
from tests.conformance.helpers import (
    DAY_MS,
    HOUR_MS,
    LEASE_MS,
    NS,
    OWNER,
    age,
    claim_one,
    cursor_of,
    db_now,
    finish_unseen,
    insert,
    insert_child,
    insert_partitioned,
    log_append,
    log_topic,
    new_job,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


def stat(started: int = 1, waits: str = '{"5":1}') -> StatRow:
    return StatRow(started, started, 0, 0, waits, 3, 3, "{}", 0, 0)


# -- the dashboard's figures ------------------------------------------------------------


def test_stat_rows_are_read_by_window_and_pruned_by_age(later_db, dialect):
    with cursor_of(later_db) as c:
        dialect.reads.stat_insert(c, namespace=NS, server_id="s1", row=stat(2))
        dialect.reads.stat_insert(c, namespace="other", server_id="s9", row=stat(7))
        dialect.reads.stat_insert(c, namespace=NS, server_id="s2", row=stat(3))
        c.execute("UPDATE later_dashboard_stat SET at_ms = at_ms - 120000 WHERE server_id = 's2'")
        readings = dialect.reads.stats_since(c, namespace=NS, window_ms=60_000)
        assert [r.stat for r in readings] == [stat(2)]
        assert db_now(later_db) - 5_000 <= readings[0].at_ms <= db_now(later_db)
        assert len(dialect.reads.stats_since(c, namespace=NS, window_ms=180_000)) == 2
        assert (
            dialect.reads.dashboard_prune(
                c, namespace=NS, stats_for_ms=60_000, samples_for_ms=DAY_MS
            )
            == 1
        )
        assert [
            r.stat.started for r in dialect.reads.stats_since(c, namespace=NS, window_ms=DAY_MS)
        ] == [2]
        assert len(dialect.reads.stats_since(c, namespace="other", window_ms=DAY_MS)) == 1


def test_samples_are_taken_from_the_counters_once_a_millisecond_and_thinned(later_db, dialect):
    """A sample is the counters' backlog by kind; a second one in the same
    millisecond is dropped; reads give one point per step, each the largest."""
    insert(later_db)
    insert(later_db)
    insert(later_db, delay_ms=HOUR_MS)
    with cursor_of(later_db) as c:
        assert dialect.reads.sample_take(c, namespace=NS) == 1
        (sample,) = dialect.reads.samples_since(c, namespace=NS, window_ms=60_000, step_ms=60_000)
        assert (sample.ready, sample.scheduled, sample.running, sample.waiting) == (2, 1, 0, 0)
        assert sample.partitioned == 0
        c.execute("UPDATE later_queue_sample SET at_ms = at_ms - 1000, ready = 9")
        assert dialect.reads.sample_take(c, namespace=NS) == 1
        points = dialect.reads.samples_since(c, namespace=NS, window_ms=60_000, step_ms=3_600_000)
        assert len(points) <= 2 and max(p.ready for p in points) == 9
        c.execute("UPDATE later_queue_sample SET at_ms = at_ms - %s", [8 * DAY_MS])
        assert (
            dialect.reads.dashboard_prune(
                c, namespace=NS, stats_for_ms=60_000, samples_for_ms=7 * DAY_MS
            )
            == 2
        )
        assert (
            dialect.reads.samples_since(c, namespace=NS, window_ms=9 * DAY_MS, step_ms=60_000) == []
        )


def test_lane_counts_split_the_counters_by_lane(later_db, dialect):
    insert(later_db)
    with cursor_of(later_db) as c:
        counts = dialect.reads.lane_counts(c, namespace=NS)
    assert [(n.lane, n.stage, n.n) for n in counts if n.n] == [("", "enqueued", 1)]


# -- the dashboard's lists and lookups --------------------------------------------------


def test_live_servers_and_their_running_jobs(later_db, dialect):
    job_id = insert(later_db)
    claim_one(later_db, job_id)
    with cursor_of(later_db) as c:
        beat = Heartbeat(server_id=OWNER, namespace=NS, hostname="h", pid=5, workers=3)
        dialect.cluster.server_heartbeat(c, beat)
        dialect.cluster.server_heartbeat(
            c, Heartbeat(server_id="old", namespace=NS, hostname="h", pid=6, workers=1)
        )
        c.execute("UPDATE later_server SET heartbeat_ms = heartbeat_ms - 60000 WHERE id = 'old'")
        (server,) = dialect.reads.live_servers(c, namespace=NS, within_ms=15_000)
        (running,) = dialect.reads.running_jobs(c, namespace=NS, limit=10)
    assert (server.id, server.pid, server.workers, server.topics) == (OWNER, 5, 3, False)
    assert (running.id, running.owner, running.topic) == (job_id, OWNER, None)


def test_job_detail_and_children_never_read_the_payload(later_db, dialect):
    parent = insert(later_db, payload=b"secret")
    children = [insert_child(later_db, parent)[0] for _ in range(3)]
    with cursor_of(later_db) as c:
        detail = dialect.reads.job_detail(c, namespace=NS, job_id=parent)
        assert dialect.reads.job_detail(c, namespace="other", job_id=parent) is None
        listed = dialect.reads.job_children(c, job_id=parent, limit=2)
    assert detail is not None and detail.id == parent and detail.stage == "enqueued"
    assert b"secret" not in repr(detail).encode()
    assert [j.id for j in listed] == sorted(children)[:2]


def test_job_parents_and_children_of_a_fan_in_job(later_db, dialect):
    """A fan-in job's parents in id order, a pruned one without its job; a
    parent's children include fan-in children waiting on another parent."""
    parents = sorted(insert(later_db) for _ in range(3))
    job = new_job(parent_id=parents[0], parents=tuple(parents))
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.enqueue.insert_fan_in(c, job, DAY_MS).stage == "waiting"
    plain = insert_child(later_db, parents[1])[0]
    later_db.execute("DELETE FROM later_job WHERE id = %s", [parents[2]])
    with cursor_of(later_db) as c:
        listed = dialect.reads.job_parents(c, job_id=job.id)
        assert dialect.reads.job_parents(c, job_id=plain) == []
        children = dialect.reads.job_children(c, job_id=parents[1], limit=5)
    assert [p.id for p in listed] == parents
    assert [p.job.id if p.job else None for p in listed] == [*parents[:2], None]
    assert [child.id for child in children] == sorted([job.id, plain])


def test_job_page_reads_a_stage_in_order_page_by_page_with_filters(later_db, dialect):
    """Pages of a list join up, in the list's order; a filter the index
    cannot serve looks at a bounded stretch and says where it stopped."""
    ids = [insert(later_db, priority=i % 2, type_name=f"t{i % 3}") for i in range(7)]
    expected = sorted(ids, key=lambda j: (-(ids.index(j) % 2), j))
    seen, after = [], None
    with cursor_of(later_db) as c:
        while True:
            query = JobQuery(namespace=NS, stage="enqueued", after=after, page_size=3)
            page = dialect.reads.job_page(c, query)
            seen += [j.id for j in page.jobs]
            if page.after is None:
                break
            after = page.after
        assert seen == expected
        narrow = JobQuery(namespace=NS, stage="enqueued", type_name="t0", scan_limit=2, page_size=5)
        first = dialect.reads.job_page(c, narrow)
        assert first.scanned_out and first.after is not None
        assert all(j.type_name == "t0" for j in first.jobs)
        with pytest.raises(ValueError, match="does not belong to this list"):
            dialect.reads.job_page(c, JobQuery(namespace=NS, stage="enqueued", after=("x",)))


def test_log_consumers_show_each_groups_place_and_the_partitions_end(later_db, dialect):
    log_topic(later_db, dialect)
    log_append(later_db, dialect, [b"a", b"b", b"c"])
    key = LogConsumerKey(namespace=NS, topic="events", group="billing", partition=0)
    with cursor_of(later_db) as c:
        assert dialect.reads.log_consumers(c, namespace=NS) == []
        acquired = dialect.log.log_consumer_acquire(
            c, LogLeaseRequest(key=key, member="m1", ttl_ms=LEASE_MS)
        )
        assert acquired is not None
        fence = LogFence(key=key, epoch=acquired.epoch)
        assert dialect.log.log_consumer_commit(
            c, LogCommit(fence=fence, next_offset=1, ttl_ms=LEASE_MS)
        )
        (row,) = dialect.reads.log_consumers(c, namespace=NS)
        assert dialect.reads.log_consumers(c, namespace="other") == []
    assert (row.topic, row.group, row.partition, row.member, row.epoch) == (
        "events",
        "billing",
        0,
        "m1",
        acquired.epoch,
    )
    assert (row.committed_offset, row.next_offset) == (1, 3)
    assert row.expires_ms > db_now(later_db)


def test_queue_states_lists_every_queue_ever_paused_with_its_state(later_db, dialect):
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.reads.queue_states(c, namespace=NS) == []
        dialect.cluster.queue_set_paused(c, namespace=NS, name="emails", paused=True)
        dialect.cluster.queue_set_paused(c, namespace=NS, name="alpha", paused=True)
        dialect.cluster.queue_set_paused(c, namespace=NS, name="alpha", paused=False)
        dialect.cluster.queue_set_paused(c, namespace="other", name="zeta", paused=True)
        now = db_now(later_db)
        states = dialect.reads.queue_states(c, namespace=NS)
    assert [(s.name, s.paused) for s in states] == [("alpha", False), ("emails", True)]
    assert all(now - 60_000 <= s.changed_ms <= now for s in states)


# -- later_health ------------------------------------------------------------------------


def test_server_beats_reads_every_server_of_the_namespace_with_the_clock(later_db, dialect):
    """Fresh and silent servers alike, each with its version (None for a
    server of a release before versions), and the database's clock even
    when there is no server."""
    with cursor_of(later_db) as c:
        empty = dialect.reads.server_beats(c, namespace=NS)
        assert empty.servers == ()
        assert abs(empty.now_ms - db_now(later_db)) < 5_000
        dialect.cluster.server_heartbeat(
            c,
            Heartbeat(
                server_id="new", namespace=NS, hostname="h1", pid=5, workers=2, version="2.0"
            ),
        )
        dialect.cluster.server_heartbeat(
            c, Heartbeat(server_id="old", namespace=NS, hostname="h2", pid=6, workers=1)
        )
        dialect.cluster.server_heartbeat(
            c, Heartbeat(server_id="elsewhere", namespace="other", hostname="h1", pid=7, workers=1)
        )
        c.execute("UPDATE later_server SET heartbeat_ms = heartbeat_ms - 60000 WHERE id = 'old'")
        beats = dialect.reads.server_beats(c, namespace=NS)
    assert [(s.id, s.hostname, s.pid, s.version) for s in beats.servers] == [
        ("new", "h1", 5, "2.0"),
        ("old", "h2", 6, None),
    ]
    new, old = beats.servers
    assert 0 <= beats.now_ms - new.heartbeat_ms < 5_000
    assert 60_000 <= beats.now_ms - old.heartbeat_ms < 65_000


def test_counter_drift_is_empty_while_the_triggers_count_and_names_a_broken_counter(
    later_db, dialect
):
    """Jobs of every stage but success, plain and of a named queue and of a
    partition, agree with their counters; a counter row written by hand is
    named with its stage, lane, count and rows. The success counter is not
    compared: reading those rows would read the table."""
    insert(later_db)
    insert(later_db, queue="emails")
    insert(later_db, delay_ms=HOUR_MS)
    insert_partitioned(later_db)
    running = insert(later_db, priority=9)
    claim_one(later_db, running)
    parent = insert(later_db, delay_ms=HOUR_MS)
    insert_child(later_db, parent)
    failed, cancelled, succeeded = (insert(later_db, delay_ms=HOUR_MS) for _ in range(3))
    finish_unseen(later_db, "failed", failed)
    finish_unseen(later_db, "cancelled", cancelled)
    finish_unseen(later_db, "success", succeeded)
    insert(later_db, namespace="other")
    with cursor_of(later_db) as c:
        assert dialect.reads.counter_drift(c, namespace=NS) == []
        # Counters set by hand: each key's rows replaced by one (PostgreSQL
        # keeps delta rows, SQLite one row per key).
        for namespace, stage, lane, n in (
            (NS, "enqueued", "q:emails", 3),
            (NS, "success", "", 5),
            ("other", "failed", "", 1),
        ):
            c.execute(
                "DELETE FROM later_stage_count WHERE namespace = %s AND stage = %s AND lane = %s",
                [namespace, stage, lane],
            )
            c.execute(
                "INSERT INTO later_stage_count (namespace, stage, lane, n) VALUES (%s, %s, %s, %s)",
                [namespace, stage, lane, n],
            )
        drift = dialect.reads.counter_drift(c, namespace=NS)
    assert [(d.stage, d.lane, d.counted, d.found) for d in drift] == [
        ("enqueued", "q:emails", 3, 1)
    ]
    assert later_db.scalar("SELECT COUNT(*) FROM later_job WHERE stage = 'waiting'") == 1


def test_running_unleased_finds_jobs_overdue_for_rescue_or_without_a_lease(later_db, dialect):
    """A running job whose lease is live, or expired less than ``overdue_ms``
    ago, is fine; one expired longer, or without a lease, is counted and
    shown with its owner and how long ago its lease expired."""
    first, second = insert(later_db, priority=2), insert(later_db, priority=1)
    claim_one(later_db, first)
    claim_one(later_db, second)
    with cursor_of(later_db) as c:
        assert dialect.reads.running_unleased(c, namespace=NS, overdue_ms=60_000).count == 0
        age(later_db, "lease_expires_ms", first, LEASE_MS + 30_000)
        assert dialect.reads.running_unleased(c, namespace=NS, overdue_ms=60_000).count == 0
        age(later_db, "lease_expires_ms", first, 60_000)
        c.execute(
            "UPDATE later_job SET lease_owner = NULL, lease_expires_ms = NULL WHERE id = %s",
            [second],
        )
        found = dialect.reads.running_unleased(c, namespace=NS, overdue_ms=60_000)
        assert dialect.reads.running_unleased(c, namespace="other", overdue_ms=0).count == 0
    assert found.count == 2
    by_id = {job.id: job for job in found.examples}
    assert by_id[first].owner == OWNER
    assert 90_000 <= by_id[first].expired_for_ms < 95_000  # type: ignore[operator]
    assert (by_id[second].owner, by_id[second].expired_for_ms) == (None, None)
