"""The cluster's own rows: ``later_server`` (running worker processes),
``later_maintenance`` (interval-gated maintenance steps) and ``later_lease``
(named leases: who leads a cluster-wide duty)."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import Heartbeat, HeldLease, LeaseRequest
from later_django.db.sql import servers as servers_sql
from later_django.db.statements import Operations


class Cluster(Operations):
    """Heartbeats, removal and pruning of servers, the maintenance gate, and
    named leases (sql/leases.py's rule)."""

    def server_heartbeat(self, cursor: CursorWrapper, beat: Heartbeat) -> None:
        """Record that the server runs now (registering it the first time)."""
        self._run(
            cursor,
            servers_sql.SERVER_HEARTBEAT,
            server_id=beat.server_id,
            namespace=beat.namespace,
            hostname=beat.hostname,
            pid=beat.pid,
            workers=beat.workers,
            topics=beat.topics,
            queues=beat.queues,
            version=beat.version,
        )

    # -- queues ---------------------------------------------------------------------------
    def queue_set_paused(
        self, cursor: CursorWrapper, *, namespace: str, name: str, paused: bool
    ) -> bool:
        """Pause or resume queue ``name`` for every server; return whether
        that changed its state."""
        if paused:
            self._run(cursor, servers_sql.QUEUE_PAUSE, namespace=namespace, name=name)
            return cursor.fetchone() is not None
        self._run(cursor, servers_sql.QUEUE_RESUME, namespace=namespace, name=name)
        return bool(cursor.rowcount == 1)

    def queue_paused(self, cursor: CursorWrapper, *, namespace: str) -> set[str]:
        """The queues of ``namespace`` paused now."""
        self._run(cursor, servers_sql.QUEUE_PAUSED, namespace=namespace)
        return {str(row[0]) for row in cursor.fetchall()}

    def server_remove(self, cursor: CursorWrapper, *, server_id: str) -> None:
        self._run(cursor, servers_sql.SERVER_REMOVE, server_id=server_id)

    def server_prune(self, cursor: CursorWrapper, *, namespace: str, silent_for_ms: int) -> int:
        """Delete servers of ``namespace`` silent for more than ``silent_for_ms``."""
        self._run(
            cursor, servers_sql.SERVER_PRUNE, namespace=namespace, silent_for_ms=silent_for_ms
        )
        return int(cursor.rowcount)

    def maintenance_claim(
        self, cursor: CursorWrapper, *, namespace: str, step: str, interval_ms: int
    ) -> bool:
        """Record that ``step`` runs now, unless it ran less than ``interval_ms``
        ago anywhere in the namespace; return whether this caller should run it."""
        self._run(
            cursor,
            servers_sql.MAINTENANCE_CLAIM,
            namespace=namespace,
            step=step,
            interval_ms=interval_ms,
        )
        return cursor.fetchone() is not None

    # -- named leases -----------------------------------------------------------------
    def lease_acquire(self, cursor: CursorWrapper, request: LeaseRequest) -> int | None:
        """Take or renew a lease; return its epoch, or None while another
        owner holds it. A new holder gets a higher epoch than any before it."""
        self._run(
            cursor,
            servers_sql.LEASE_ACQUIRE,
            namespace=request.namespace,
            name=request.name,
            owner=request.owner,
            ttl_ms=request.ttl_ms,
        )
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def lease_release(self, cursor: CursorWrapper, lease: HeldLease) -> bool:
        """Let ``lease`` go now, if it is still held at its epoch."""
        self._run(
            cursor,
            servers_sql.LEASE_RELEASE,
            namespace=lease.namespace,
            name=lease.name,
            epoch=lease.epoch,
        )
        return bool(cursor.rowcount == 1)
