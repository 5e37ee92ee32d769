"""Partition pollers: the workers of a server that run partition heads.

A server with LATER["TOPICS"] runs partition workers beside its plain ones
(their own WorkerPool; the same executor, lease book and completer). They
claim through a PartitionClaimer, which knows which partitions this server
wins (rendezvous hashing over the live topic servers), which have a ready
head, and which it holds the lease of with a head in flight: a partition
runs one job at a time, so it is not claimed again until that head's outcome
is stored. A head's success may claim the next head in the same statement
(``wants_next``), but not while another partition waits for a worker, so
every partition gets its turn. Leases and fencing: docs/explanation/design.md
("Partitions").
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from typing import Any

from later_django.db.rows import PartitionClaimRequest
from later_django.partitions.hashing import owner_of
from later_django.states import Stage
from later_django.types import ClaimedJob, PartitionLane
from later_django.worker.claimer import ClaimerBase, ClaimSetup
from later_django.worker.lease_book import Claim
from later_django.worker.notifier import Wakeup

logger = logging.getLogger(__name__)

Key = tuple[str, int]  # (topic, partition)
LOST = "its partition's lease was lost (another server took the partition over)"
# A claim reserved a partition but has not claimed its head yet.
RESERVED: Claim = ("", 0)


class PartitionWakeup(Wakeup):
    """The partition workers' wake-ups, and whether one brought news.

    Only a wake-up from outside (a commit, a poll, a membership change) makes
    the next claim that finds nothing queued look over the partitions;
    ``requeued`` (a partition of ours free again) wakes a worker without one.
    Otherwise every worker that found nothing would look after every job."""

    def __init__(self) -> None:
        super().__init__()
        self.news = True  # nothing seen yet

    def wake(self, count: int | None = None) -> None:
        self.news = True
        super().wake(count)

    def requeued(self) -> None:
        super().wake(1)


class PartitionClaimer(ClaimerBase):
    def __init__(
        self,
        setup: ClaimSetup,
        *,
        wake: PartitionWakeup,
        partition_lease_ms: int,
        server_ttl_ms: int,
    ) -> None:
        # Claims and looks for ready heads go through its own connection, as
        # the claims of plain jobs; membership and releases through the store.
        super().__init__(setup)
        self.wake = wake
        self.partition_lease_ms = partition_lease_ms
        self.server_ttl_ms = server_ttl_ms
        self.servers: list[str] = [self.owner]  # live topic servers, this one included
        self.held: dict[Key, int] = {}  # partition leases held: their epoch
        self.busy: dict[Key, Claim] = {}  # partitions with a head in flight here
        self._ready: deque[Key] = deque()
        self.stopping = False  # claim no next head with a success
        # Partitions whose lease another live server held at our last try:
        # not tried again before the next refresh (it lets go of what it no
        # longer wins there), so a scan does not retry a write in vain.
        self._blocked: set[Key] = set()
        # For the metrics: (family, topic, outcome) -> count; read on scrape.
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self._scan_lock = asyncio.Lock()

    def wins(self, key: Key) -> bool:
        return owner_of(self.namespace, key[0], key[1], self.servers) == self.owner

    # -- claims -------------------------------------------------------------------
    async def claim(self) -> ClaimedJob | None:
        """Claim the ready head of a partition this server wins and runs
        nothing in, or return None when there is none."""
        # Its spares: next heads a success claimed, not started yet.
        spare = self._spare()
        if spare is not None:
            return spare
        for _ in range(2):
            while self._ready:
                key = self._ready.popleft()
                if key in self.busy or key in self._blocked or not self.wins(key):
                    continue
                self.busy[key] = RESERVED
                try:
                    job = await self._claim_in(key)
                finally:
                    if self.busy.get(key) == RESERVED:
                        del self.busy[key]
                if job is not None:
                    return job
            if not self.wake.news or not await self._scan():
                return None
        return None

    async def _claim_in(self, key: Key) -> ClaimedJob | None:
        lane = PartitionLane(self.namespace, key[0], key[1])
        sent = asyncio.get_running_loop().time()
        result = await self.sessions.partition_claim(
            PartitionClaimRequest(
                lane=lane,
                owner=self.owner,
                partition_lease_ms=self.partition_lease_ms,
                job_lease_ms=self.leases.lease_ms,
                server_ttl_ms=self.server_ttl_ms,
            )
        )
        if result is None:
            self.held.pop(key, None)  # another live server holds it
            self._blocked.add(key)
            return None
        epoch, job = result
        self.held[key] = epoch
        self.counts["claims", key[0], ""] += 1
        if job is None:
            return None
        self.counts["heads", key[0], ""] += 1
        claim = (job.id, job.attempts)
        self.leases.hold([claim], sent)
        self.busy[key] = claim
        return job

    async def _scan(self) -> bool:
        """Look for partitions with a ready head; return whether any is won here."""
        if self._scan_lock.locked():
            async with self._scan_lock:  # a look in flight answers for this one too
                return bool(self._ready)
        async with self._scan_lock:
            self.wake.news = False  # a wake-up during the look brings news again
            heads = await self.sessions.partition_heads(namespace=self.namespace)
            found = [(head.topic, head.partition) for head in heads if head.stage == Stage.ENQUEUED]
            ready = [
                key
                for key in found
                if key not in self.busy and key not in self._blocked and self.wins(key)
            ]
            self._ready.extend(key for key in ready if key not in self._ready)
            return bool(self._ready)

    def noticed(self, key: Key) -> None:
        """A commit announced ``key``'s partition (a job of it became ready,
        or its head finished): queue it if this server wins it. One whose
        head runs or is being stored here is queued again when that ends."""
        if key in self.busy or key in self._blocked or not self.wins(key):
            return
        if key not in self._ready:
            self._ready.append(key)
        self.wake.requeued()

    # -- outcomes -----------------------------------------------------------------
    def wants_next(self, job: ClaimedJob) -> bool:
        """Should the success of ``job`` (a partition head) claim its
        partition's next head too? Not while another partition waits here
        for a worker, once the partition is won elsewhere, or at shutdown."""
        lane = job.lane
        if lane is None or self.stopping or self._ready:
            return False
        key = (lane.topic, lane.partition)
        return key not in self._blocked and self.wins(key)

    def next_head(self, job: ClaimedJob) -> None:
        """A head's success claimed ``job``, its partition's next head: the
        next free worker runs it. (Its partition stays busy: the head's own
        done() finds another claim there and leaves it.)"""
        lane = job.lane
        assert lane is not None
        key = (lane.topic, lane.partition)
        self.busy[key] = (job.id, job.attempts)
        self.counts["heads", key[0], ""] += 1
        self._spares.append(job)
        self.wake.requeued()

    def done(self, job: ClaimedJob) -> None:
        """The outcome of ``job`` (a partition head) is stored, or given up:
        its partition may run its next head."""
        lane = job.lane
        if lane is None:
            return
        key = (lane.topic, lane.partition)
        if self.busy.get(key) == (job.id, job.attempts):
            del self.busy[key]
            # Behind the partitions already waiting for a worker: with more
            # partitions than workers, each gets its turn.
            self._ready.append(key)
            self.wake.requeued()

    def drop(self, claim: Claim) -> None:
        """``claim``'s job lease was given up: its partition is free here (its
        head stays running until the stuck-job recovery requeues it)."""
        super().drop(claim)
        for key, held in list(self.busy.items()):
            if held == claim:
                del self.busy[key]

    async def _give_back(self, job: ClaimedJob) -> bool:
        given = await super()._give_back(job)
        self.leases.release((job.id, job.attempts))
        self.done(job)
        return given

    # -- membership and partition leases ----------------------------------------------
    async def refresh(self) -> None:
        """Read the live topic servers, renew the leases held, stop what runs
        under a lease lost, and let go of partitions now won elsewhere."""
        servers, renewed = await self.store.run(self.pool, self._refresh_in, atomic=True)
        self.servers = servers if self.owner in servers else [*servers, self.owner]
        self._blocked.clear()
        for key, epoch in list(self.held.items()):
            kept = renewed.get(key) == epoch
            self.counts["renewals", key[0], "renewed" if kept else "lost"] += 1
            if not kept:
                del self.held[key]
                claim = self.busy.get(key)
                if claim is not None and claim != RESERVED:
                    logger.warning(
                        "partition %s/%d: lease lost; stopping its head %s",
                        key[0],
                        key[1],
                        claim[0],
                        extra={"action": "partition_lost", "job_id": claim[0]},
                    )
                    self.leases.give_up(claim, LOST)
        gone = [key for key in self.held if key not in self.busy and not self.wins(key)]
        for key in gone:
            await self._release(key)
        self.wake.wake()

    def _refresh_in(self, dialect: Any, cursor: Any) -> tuple[list[str], dict[Key, int]]:
        servers = dialect.partitions.topic_servers(
            cursor, namespace=self.namespace, ttl_ms=self.server_ttl_ms
        )
        renewed = dialect.partitions.partition_renew(
            cursor, namespace=self.namespace, owner=self.owner, lease_ms=self.partition_lease_ms
        )
        return servers, {(lane.topic, lane.partition): lane.epoch for lane in renewed}

    async def _release(self, key: Key) -> None:
        self.held.pop(key, None)
        await self.store.run(
            self.pool,
            lambda d, c: d.partitions.partition_release(
                c, namespace=self.namespace, owner=self.owner, partition=key
            ),
        )

    def release_all(self, dialect: Any, cursor: Any) -> None:
        """Let go of every partition lease (a graceful stop): the winners
        among the remaining servers take them at once."""
        dialect.partitions.partition_release(cursor, namespace=self.namespace, owner=self.owner)
        self.held.clear()

    async def run_refresh(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001  the next round retries
                logger.error(
                    "could not refresh partition ownership: %s",
                    exc,
                    extra={"action": "partition_refresh_error"},
                )
