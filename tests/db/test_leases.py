"""Named leases and leadership (later_django/leases.py), on SQLite and PostgreSQL.

The database decides who leads: one holder at a time, a higher epoch for
every new holder, expiry on the database's clock, and a released lease free
for the next server at once.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connections, transaction

from later_django.db import dialect_for
from later_django.db.rows import HeldLease, LeaseRequest
from later_django.leases import Leader
from later_django.maintenance.steps import StepContext, vacuum

TTL_MS = 30_000


def _acquire(later_db: Any, owner: str, name: str = "sampler") -> int | None:
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        return dialect_for(later_db.alias).cluster.lease_acquire(
            c, LeaseRequest(namespace="default", name=name, owner=owner, ttl_ms=TTL_MS)
        )


# Only the holder of this epoch renews: nobody took the lease since. Writes
# made under a lease are fenced the same way.
RENEW_SQL = """
UPDATE later_lease SET expires_ms = {now} + %s
WHERE namespace = %s AND name = %s AND owner = %s AND epoch = %s
"""


def _renew(dialect: Any, cursor: Any, *, owner: str, epoch: int, **lease: Any) -> bool:
    sql = RENEW_SQL.replace("{now}", dialect.vendor_sql.now)
    cursor.execute(sql, [TTL_MS, lease["namespace"], lease["name"], owner, epoch])
    return bool(cursor.rowcount == 1)


def _expire(later_db: Any, name: str = "sampler") -> None:
    with connections[later_db.alias].cursor() as cursor:
        cursor.execute(
            "UPDATE later_lease SET expires_ms = expires_ms - %s WHERE name = %s",
            [2 * TTL_MS, name],
        )


def test_lease_one_holder_and_a_higher_epoch_for_each_new_one(later_db):
    """While a lease is live only its holder gets it (and keeps its epoch);
    once it expired the next holder gets a higher epoch, and the one before
    can neither renew nor release it."""
    dialect = dialect_for(later_db.alias)
    assert _acquire(later_db, "a") == 1
    assert _acquire(later_db, "b") is None
    assert _acquire(later_db, "a") == 1, "the holder renews and keeps its epoch"
    _expire(later_db)
    assert _acquire(later_db, "b") == 2
    assert _acquire(later_db, "a") is None
    with connections[later_db.alias].cursor() as cursor:
        common = {"namespace": "default", "name": "sampler"}
        assert not _renew(dialect, cursor, owner="a", epoch=1, **common)
        assert not dialect.cluster.lease_release(cursor, HeldLease(owner="a", epoch=1, **common))
        assert _renew(dialect, cursor, owner="b", epoch=2, **common)
        assert dialect.cluster.lease_release(cursor, HeldLease(owner="b", epoch=2, **common))
    assert _acquire(later_db, "a") == 3, "released: free at once, still a higher epoch"
    # Names and namespaces are independent.
    assert _acquire(later_db, "b", name="other") == 1


def test_lease_contenders_at_once_get_one_holder(later_db):
    """Servers asking for the same lease at the same moment: exactly one
    gets it."""
    contenders = 8
    start = threading.Barrier(contenders)
    won: list[str] = []

    def contend(owner: str) -> None:
        try:
            start.wait(10)
            if _acquire(later_db, owner) is not None:
                won.append(owner)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contend, args=(f"s{i}",)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(won) == 1, won
    stored = later_db.rows("SELECT owner, epoch FROM later_lease WHERE name = 'sampler'")
    assert stored == [(won[0], 1)]


def test_leader_releases_at_shutdown_for_the_next_server(later_db):
    """A server that stops lets its leases go: the next one leads at once."""
    dialect = dialect_for(later_db.alias)
    first = Leader(namespace="default", owner="first", ttl_ms=TTL_MS)
    second = Leader(namespace="default", owner="second", ttl_ms=TTL_MS)
    with connections[later_db.alias].cursor() as cursor:
        lead = first.lead(dialect, cursor, "vacuum")
        assert lead is not None and lead.epoch == 1
        assert first.current("vacuum") == lead
        assert second.lead(dialect, cursor, "vacuum") is None
        assert first.release_all(dialect, cursor) == 1
        assert first.current("vacuum") is None
        taken = second.lead(dialect, cursor, "vacuum")
    assert taken is not None and taken.epoch == 2


def test_vacuum_runs_on_the_leading_server_only(later_db):
    """VACUUM is led: of two servers due to run it, only the lease holder does."""
    dialect = dialect_for(later_db.alias)
    if not dialect.needs_vacuum:
        pytest.skip("VACUUM is a step of databases that need it (needs_vacuum)")

    def context(owner: str) -> StepContext:
        return StepContext(
            alias=later_db.alias,
            namespace="default",
            retention_ms=TTL_MS,
            stuck_grace_ms=1000,
            server_ttl_ms=60_000,
            vacuum_interval_ms=1,
            leader=Leader(namespace="default", owner=owner, ttl_ms=TTL_MS),
            missed_grace_ms=60_000,
            schedule_ahead_ms=1000,
        )

    one, two = context("one"), context("two")
    ran = []
    for ctx in (one, two, one):
        with connections[later_db.alias].cursor() as cursor:
            ran.append(vacuum(dialect, cursor, ctx))
        with connections[later_db.alias].cursor() as cursor:
            # Let the interval pass for the next call.
            cursor.execute("UPDATE later_maintenance SET last_run_ms = 0")
    assert ran == [1, 0, 1]
