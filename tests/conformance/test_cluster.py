"""The cluster (``dialect.cluster``): servers, the maintenance gate, named leases."""

from __future__ import annotations

from typing import Any

import pytest

from later_django.db.rows import (
    Heartbeat,
    HeldLease,
    LeaseRequest,
)
from tests.conformance.helpers import (
    HOUR_MS,
    LEASE_MS,
    NS,
    cursor_of,
    db_now,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


def server_row(later_db, server_id: str) -> tuple[Any, ...] | None:
    rows = later_db.rows(
        "SELECT namespace, hostname, pid, workers, started_ms, heartbeat_ms "
        "FROM later_server WHERE id = %s",
        [server_id],
    )
    return rows[0] if rows else None


# -- servers ----------------------------------------------------------------------------


def test_server_heartbeat_registers_then_refreshes(later_db, dialect):
    """The first heartbeat registers the server; later ones move its
    heartbeat and worker count on, on the database's clock."""
    beat = Heartbeat(server_id="s1", namespace=NS, hostname="host-a", pid=41, workers=4)
    before = db_now(later_db)
    with cursor_of(later_db) as c:
        dialect.cluster.server_heartbeat(c, beat)
    after = db_now(later_db)
    first = server_row(later_db, "s1")
    assert first is not None and first[:4] == (NS, "host-a", 41, 4)
    assert before <= first[4] == first[5] <= after
    age_by = 5_000
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_server SET heartbeat_ms = heartbeat_ms - %s", [age_by])
        dialect.cluster.server_heartbeat(
            c, Heartbeat(server_id="s1", namespace=NS, hostname="renamed", pid=7, workers=9)
        )
    second = server_row(later_db, "s1")
    assert second is not None and second[:5] == (NS, "host-a", 41, 9, first[4])
    assert second[5] >= before


def test_server_prune_and_remove(later_db, dialect):
    """Servers silent longer than the limit are pruned in their namespace;
    a server leaving removes itself."""
    with cursor_of(later_db) as c:
        for server_id, namespace in (("live", NS), ("silent", NS), ("away", "other")):
            beat = Heartbeat(
                server_id=server_id, namespace=namespace, hostname="h", pid=1, workers=1
            )
            dialect.cluster.server_heartbeat(c, beat)
        c.execute(
            "UPDATE later_server SET heartbeat_ms = heartbeat_ms - %s WHERE id <> 'live'",
            [60_000],
        )
        assert dialect.cluster.server_prune(c, namespace=NS, silent_for_ms=30_000) == 1
        assert dialect.cluster.server_prune(c, namespace=NS, silent_for_ms=30_000) == 0
        assert server_row(later_db, "silent") is None
        assert server_row(later_db, "away") is not None
        dialect.cluster.server_remove(c, server_id="live")
        assert server_row(later_db, "live") is None


# -- maintenance ------------------------------------------------------------------------


def test_maintenance_claim_runs_a_step_once_per_interval(later_db, dialect):
    """A step runs once per interval across a namespace, on the database's clock."""

    def claim_step(namespace: str = NS, step: str = "vacuum", interval_ms: int = HOUR_MS) -> bool:
        with cursor_of(later_db) as c:
            return dialect.cluster.maintenance_claim(
                c, namespace=namespace, step=step, interval_ms=interval_ms
            )

    before = db_now(later_db)
    assert claim_step() is True
    after = db_now(later_db)
    assert claim_step() is False
    assert [claim_step(namespace="other"), claim_step(step="other")] == [True, True]
    last_run = later_db.scalar(
        "SELECT last_run_ms FROM later_maintenance WHERE namespace = %s AND step = 'vacuum'",
        [NS],
    )
    assert before <= last_run <= after  # type: ignore[operator]
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_maintenance SET last_run_ms = last_run_ms - %s", [2 * HOUR_MS])
    assert claim_step() is True


# -- named leases -----------------------------------------------------------------------


def test_lease_acquire_and_release_one_holder_at_a_time(later_db, dialect):
    """One holder at a time, until the database's now plus the lease; the
    holder renews at its epoch, each new holder gets a higher one, and only
    the (owner, epoch) holding it lets it go."""

    def acquire(owner: str, name: str = "sampler") -> int | None:
        request = LeaseRequest(namespace=NS, name=name, owner=owner, ttl_ms=LEASE_MS)
        with cursor_of(later_db, atomic=True) as c:
            return dialect.cluster.lease_acquire(c, request)

    def release(owner: str, epoch: int) -> bool:
        lease = HeldLease(namespace=NS, name="sampler", owner=owner, epoch=epoch)
        with cursor_of(later_db) as c:
            return dialect.cluster.lease_release(c, lease)

    def expires() -> int:
        return int(later_db.scalar("SELECT expires_ms FROM later_lease WHERE name = 'sampler'"))  # type: ignore[arg-type]

    before = db_now(later_db)
    assert acquire("a") == 1
    after = db_now(later_db)
    assert before + LEASE_MS <= expires() <= after + LEASE_MS
    assert acquire("b") is None
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_lease SET expires_ms = expires_ms - %s", [10_000])
    assert acquire("a") == 1, "the holder renews and keeps its epoch"
    assert expires() >= before + LEASE_MS
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_lease SET expires_ms = expires_ms - %s", [2 * LEASE_MS])
    assert acquire("b") == 2
    assert acquire("a") is None
    assert [release("a", 1), release("b", 1)] == [False, False]
    assert release("b", 2) is True
    assert acquire("a") == 3, "released: free at once, still a higher epoch"
    assert acquire("b", name="other") == 1


# -- queues -----------------------------------------------------------------------------


def test_queue_set_paused_reports_only_real_changes_and_queue_paused_lists_them(later_db, dialect):
    """Pausing writes the queue's row the first time; pausing it again,
    resuming a running queue or one never paused changes nothing."""
    with cursor_of(later_db, atomic=True) as c:
        assert (
            dialect.cluster.queue_set_paused(c, namespace=NS, name="emails", paused=False) is False
        )
        assert dialect.cluster.queue_set_paused(c, namespace=NS, name="emails", paused=True) is True
        assert (
            dialect.cluster.queue_set_paused(c, namespace=NS, name="emails", paused=True) is False
        )
        assert dialect.cluster.queue_set_paused(c, namespace=NS, name="default", paused=True)
        assert dialect.cluster.queue_paused(c, namespace=NS) == {"emails", "default"}
        assert dialect.cluster.queue_paused(c, namespace="other") == set()
        assert dialect.cluster.queue_set_paused(c, namespace=NS, name="emails", paused=False)
        assert dialect.cluster.queue_paused(c, namespace=NS) == {"default"}


def test_server_heartbeat_records_the_queues_served(later_db, dialect):
    beat = Heartbeat(
        server_id="s-q", namespace=NS, hostname="h", pid=1, workers=2, queues="emails,default"
    )
    with cursor_of(later_db) as c:
        dialect.cluster.server_heartbeat(c, beat)
    assert later_db.scalar("SELECT queues FROM later_server WHERE id = 's-q'") == "emails,default"
