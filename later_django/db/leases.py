"""Operations on ``later_lease``: named leases with an owner, an epoch that
grows with every new holder, and an expiry on the database's clock."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import HeldLease, LeaseRequest
from later_django.db.sql import leases as leases_sql
from later_django.db.statements import Statements


class LeaseOperations(Statements):
    """Taking and letting go of named leases."""

    def lease_acquire(self, cursor: CursorWrapper, request: LeaseRequest) -> int | None:
        """Take or renew a lease; return its epoch, or None while another
        owner holds it. A new holder gets a higher epoch than any before it."""
        cursor.execute(
            self._sql(leases_sql.LEASE_ACQUIRE_SQL),
            [request.namespace, request.name, request.owner, request.ttl_ms],
        )
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def lease_release(self, cursor: CursorWrapper, lease: HeldLease) -> bool:
        """Let ``lease`` go now, if it is still held as (owner, epoch)."""
        cursor.execute(
            self._sql(leases_sql.LEASE_RELEASE_SQL),
            [lease.namespace, lease.name, lease.owner, lease.epoch],
        )
        return bool(cursor.rowcount == 1)
