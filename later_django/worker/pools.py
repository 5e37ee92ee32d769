"""Every worker pool of one server: the plain queues' and the partition one.

The lease book tells them of claims given up or asked to cancel (they are
its ``ClaimHolders``); the supervisor watches their slots through them.
"""

from __future__ import annotations

from later_django.worker.lease_book import Claim
from later_django.worker.workers import WorkerPool, WorkerSlot


class WorkerPools:
    """The server's pools, in the order they were added."""

    def __init__(self) -> None:
        self.all: list[WorkerPool] = []

    def add(self, pool: WorkerPool) -> WorkerPool:
        self.all.append(pool)
        return pool

    @property
    def slots(self) -> list[WorkerSlot]:
        return [slot for pool in self.all for slot in pool.slots]

    @property
    def processed(self) -> int:
        return sum(pool.processed for pool in self.all)

    def replace(self, slot: WorkerSlot) -> WorkerSlot:
        pool = next(pool for pool in self.all if slot in pool.slots)
        return pool.replace(slot)

    def given_up(self, claim: Claim, why: str) -> None:
        """Drop ``claim`` if it is a spare, and stop its handler if one runs."""
        for pool in self.all:
            pool.claimer.drop(claim)
        for pool in self.all:
            pool.stop_handler_of(claim, why)

    def cancel_requested(self, claim: Claim) -> None:
        for pool in self.all:
            pool.cancel_handler_of(claim)
