"""A server's rows in the cluster: its heartbeat in later_server, the topics
it registers, and its leave at shutdown. It runs no job and wakes no worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from later_django.conf import conf
from later_django.db.rows import Heartbeat
from later_django.leases import Leader
from later_django.partitions.reserved import registered_topics
from later_django.threaded_store import ThreadedStore
from later_django.version import __version__
from later_django.worker.partitions import PartitionClaimer
from later_django.worker.queue_workers import QueueWorkers, worker_count

if TYPE_CHECKING:
    from later_django.worker.plan import ServerPlan

# The server's logger: operators filter its heartbeat errors under that name
# (docs/how-to/operations.md, "Logging").
logger = logging.getLogger("later_django.worker.server")


class Membership:
    def __init__(
        self,
        plan: ServerPlan,
        *,
        store: ThreadedStore,
        pool: ThreadPoolExecutor,
        leader: Leader,
        partitions: PartitionClaimer,
        queues: list[QueueWorkers],
    ) -> None:
        self.plan = plan
        self.store = store
        self.pool = pool
        self.leader = leader
        self.partitions = partitions
        self.queues = queues

    @property
    def served_queues(self) -> str:
        """The queues served, as later_server records them: "emails,default"."""
        return ",".join(queue.name for queue in self.queues)

    async def heartbeat(self) -> None:
        plan = self.plan
        row = Heartbeat(
            server_id=plan.server_id,
            namespace=plan.namespace,
            hostname=socket.gethostname()[:255],
            pid=os.getpid(),
            workers=worker_count(self.queues),
            topics=plan.topics,
            queues=self.served_queues,
            version=__version__[:64],
        )
        await self.store.run(self.pool, lambda d, c: d.cluster.server_heartbeat(c, row))

    async def run_heartbeats(self) -> None:
        interval = conf.seconds("PARTITION_HEARTBEAT_INTERVAL")
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except Exception as exc:  # noqa: BLE001
                logger.error("heartbeat failed: %s", exc, extra={"action": "heartbeat_error"})

    async def register_topics(self) -> None:
        """Register the topics (a changed partition count is refused)."""
        topics, namespace = registered_topics(), self.plan.namespace
        await self.store.run(
            self.pool,
            lambda d, c: [
                d.partitions.topic_register(c, namespace=namespace, name=name, partitions=count)
                for name, count in topics.items()
            ],
            atomic=True,
        )

    async def leave(self) -> None:
        """Leave the cluster: another server leads at its next tick, and takes
        this one's partitions at once."""
        try:
            await self.store.run(self.pool, self._deregister)
        except Exception as exc:  # noqa: BLE001  best effort: the rows expire anyway
            logger.warning("could not deregister server %s: %s", self.plan.server_id, exc)

    def _deregister(self, dialect: Any, cursor: Any) -> None:
        self.leader.release_all(dialect, cursor)
        if self.plan.topics:
            self.partitions.release_all(dialect, cursor)
        dialect.cluster.server_remove(cursor, server_id=self.plan.server_id)
