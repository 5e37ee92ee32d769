"""Operations on ``later_server`` (running worker processes) and
``later_maintenance`` (interval-gated maintenance steps)."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import Heartbeat
from later_django.db.sql import servers as servers_sql
from later_django.db.statements import Statements


class ServerOperations(Statements):
    """Heartbeats, removal and pruning of servers, and the maintenance gate."""

    def server_heartbeat(self, cursor: CursorWrapper, beat: Heartbeat) -> None:
        """Record that the server runs now (registering it the first time)."""
        cursor.execute(
            self._sql(servers_sql.SERVER_HEARTBEAT_SQL),
            [beat.server_id, beat.namespace, beat.hostname, beat.pid, beat.workers, beat.topics],
        )

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
