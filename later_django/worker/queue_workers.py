"""The workers of one queue on a server: its own claims, wake-ups and pool.

A server serves each of its queues apart (``--queues emails=4,default=8``):
a queue's workers claim only its jobs, are woken only for them, are never
more than its count, and autoscale on their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from later_django.worker.claimer import Claimer
from later_django.worker.notifier import Wakeup
from later_django.worker.workers import WorkerPool


@dataclass(eq=False)
class QueueWorkers:
    """One served queue, ``name`` as declared in LATER["QUEUES"], and the
    parts its workers use."""

    name: str
    workers: int
    wake: Wakeup
    claimer: Claimer
    pool: WorkerPool
    autoscale: tuple[int, int] | None = None

    @property
    def worker_count(self) -> int:
        return self.pool.count

    async def add_worker(self) -> int:
        self.pool.spawn()
        return self.pool.count

    async def remove_worker(self) -> int:
        """Stop one worker after its current job; at least one remains."""
        if self.pool.count > 1:
            await self.pool.remove_one()
        return self.pool.count

    async def ready_backlog(self) -> int:
        """This queue's jobs ready now (0 while it is paused), from the counters;
        none for a queue with limits while a worker here waits for work (a
        limit holds them back: more workers would only wait too)."""
        if self.claimer.limits is not None and any(slot.idle for slot in self.pool.slots):
            return 0
        namespace, name = self.claimer.namespace, self.name
        return int(
            await self.claimer.store.run(
                self.claimer.pool,
                lambda d, c: d.reads.plain_ready(c, namespace=namespace, queue=name),
            )
        )


def worker_count(queues: list[QueueWorkers]) -> int:
    return sum(queue.pool.count for queue in queues)


async def ready_backlog(queues: list[QueueWorkers]) -> int:
    """Jobs of the served queues ready to run now (none of a paused queue),
    read from the counters."""
    return sum([await queue.ready_backlog() for queue in queues])
