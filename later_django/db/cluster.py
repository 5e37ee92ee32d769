"""The cluster's own rows: ``later_server`` (running worker processes),
``later_maintenance`` (interval-gated maintenance steps) and ``later_lease``
(named leases: who leads a cluster-wide duty)."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import Heartbeat, HeldLease, LeaseRequest
from later_django.db.sql import leases as leases_sql
from later_django.db.sql import servers as servers_sql
from later_django.db.statements import Operations


class Cluster(Operations):
    """Heartbeats, removal and pruning of servers, the maintenance gate, and
    named leases (sql/leases.py's rule)."""

    def server_heartbeat(self, cursor: CursorWrapper, beat: Heartbeat) -> None:
        """Record that the server runs now (registering it the first time)."""
        cursor.execute(
            self._sql(servers_sql.SERVER_HEARTBEAT_SQL),
            [
                beat.server_id,
                beat.namespace,
                beat.hostname,
                beat.pid,
                beat.workers,
                beat.topics,
                beat.queues,
                beat.version,
            ],
        )

    # -- queues ---------------------------------------------------------------------------
    def queue_set_paused(
        self, cursor: CursorWrapper, *, namespace: str, name: str, paused: bool
    ) -> bool:
        """Pause or resume queue ``name`` for every server; return whether
        that changed its state."""
        if paused:
            cursor.execute(self._sql(servers_sql.QUEUE_PAUSE_SQL), [namespace, name])
            return cursor.fetchone() is not None
        cursor.execute(self._sql(servers_sql.QUEUE_RESUME_SQL), [namespace, name])
        return bool(cursor.rowcount == 1)

    def queue_paused(self, cursor: CursorWrapper, *, namespace: str) -> set[str]:
        """The queues of ``namespace`` paused now."""
        cursor.execute(self._sql(servers_sql.QUEUE_PAUSED_SQL), [namespace])
        return {str(row[0]) for row in cursor.fetchall()}

    def server_remove(self, cursor: CursorWrapper, *, server_id: str) -> None:
        cursor.execute(self._sql(servers_sql.SERVER_REMOVE_SQL), [server_id])

    def server_prune(self, cursor: CursorWrapper, *, namespace: str, silent_for_ms: int) -> int:
        """Delete servers of ``namespace`` silent for more than ``silent_for_ms``."""
        cursor.execute(self._sql(servers_sql.SERVER_PRUNE_SQL), [namespace, silent_for_ms])
        return int(cursor.rowcount)

    def maintenance_claim(
        self, cursor: CursorWrapper, *, namespace: str, step: str, interval_ms: int
    ) -> bool:
        """Record that ``step`` runs now, unless it ran less than ``interval_ms``
        ago anywhere in the namespace; return whether this caller should run it."""
        cursor.execute(self._sql(servers_sql.MAINTENANCE_CLAIM_SQL), [namespace, step, interval_ms])
        return cursor.fetchone() is not None

    # -- named leases -----------------------------------------------------------------
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
        """Let ``lease`` go now, if it is still held at its epoch."""
        cursor.execute(
            self._sql(leases_sql.LEASE_RELEASE_SQL), [lease.namespace, lease.name, lease.epoch]
        )
        return bool(cursor.rowcount == 1)
