"""Claims: workers that ask at the same moment share one statement, on a
connection of their own, and get no more jobs than workers asked.

A job claimed for a worker that went away before taking it is kept as a
spare for the next worker while its lease is confirmed, and given back once
it is not (or at shutdown). A shared claim the supervisor abandoned
mid-statement may still have committed: the next claim first gives back
what it took, so no job waits for the stuck-job recovery without having run.

A queue with limits claims with the limited claim; once its rate limit is
spent, its workers wait without a claim for the next window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from later_django.db.rows import ClaimRequest, LimitedClaimRequest, OwnerFence
from later_django.db.sessions import WorkerSessions
from later_django.limits import QueueLimits
from later_django.threaded_store import ThreadedStore
from later_django.types import ClaimedJob
from later_django.worker.batching import Coalescer
from later_django.worker.lease_book import Claim, LeaseBook
from later_django.worker.notifier import Wakeup

logger = logging.getLogger(__name__)

MAX_CLAIM_BATCH = 255  # the most workers a server runs
SINCE_MARGIN_MS = 100  # how far before an abandoned claim's send its jobs are looked for


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimSetup:
    """What the claimers and the completer of a server share."""

    alias: str
    namespace: str
    owner: str
    store: ThreadedStore
    pool: ThreadPoolExecutor  # give-backs and reads off the claims' connection
    leases: LeaseBook
    prepare: bool  # whether the claims' session prepares later's statements


class ClaimerBase:
    """Claims on a connection of their own, and spares: jobs claimed for a
    worker that had not taken them yet, kept for the next one."""

    def __init__(self, setup: ClaimSetup) -> None:
        self.namespace, self.owner = setup.namespace, setup.owner
        self.store, self.pool, self.leases = setup.store, setup.pool, setup.leases
        self.sessions = WorkerSessions(setup.alias, prepare=setup.prepare)
        self._spares: deque[ClaimedJob] = deque()
        self._giving_back: set[asyncio.Task[bool]] = set()

    def _spare(self) -> ClaimedJob | None:
        """The first spare whose lease is still confirmed."""
        while self._spares:
            job = self._spares.popleft()
            if self.leases.confirmed((job.id, job.attempts)):
                return job
            # Kept aside past its lease's deadline: no longer safe to start,
            # so given back now rather than left to the stuck-job recovery.
            self._give_back_later(job)
        return None

    def _give_back_later(self, job: ClaimedJob) -> None:
        task = asyncio.create_task(self._give_back(job), name="later-give-back")
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    def drop(self, claim: Claim) -> None:
        """Forget a spare whose lease was given up."""
        for job in list(self._spares):
            if (job.id, job.attempts) == claim:
                self._spares.remove(job)

    async def release_spares(self) -> None:
        """Give back the jobs claimed for workers that stopped before taking
        them (at shutdown): they run again at once, elsewhere."""
        spares, self._spares = list(self._spares), deque()
        await self.give_back(spares)
        if self._giving_back:
            await asyncio.wait(self._giving_back)

    async def give_back(self, jobs: list[ClaimedJob]) -> int:
        """Give back ``jobs``, whose handlers this server stopped itself (they
        run again at once, the attempt not counted); return how many."""
        given = 0
        for job in jobs:
            given += await self._give_back(job)
            self.leases.release((job.id, job.attempts))
        return given

    async def _give_back(self, job: ClaimedJob) -> bool:
        try:
            return await self._unclaim(job.id, job.attempts)
        except Exception as exc:  # noqa: BLE001  its lease recovers it instead
            logger.warning("could not give back job %s: %s", job.id, exc)
            return False

    async def _unclaim(self, job_id: str, attempts: int) -> bool:
        fence = OwnerFence(job_id=job_id, attempts=attempts, owner=self.owner)
        return bool(await self.store.run(self.pool, lambda d, c: d.hot.unclaim(c, fence)))

    async def close(self) -> None:
        await self.sessions.close()


class Claimer(ClaimerBase):
    def __init__(
        self,
        setup: ClaimSetup,
        *,
        wake: Wakeup,
        queue: str = "default",
        limits: QueueLimits | None = None,
    ) -> None:
        super().__init__(setup)
        self.queue = queue
        self.wake = wake
        # The limits its claims keep; None: the plain claim.
        self.limits = limits
        self._claims: Coalescer[None, ClaimedJob | None] = Coalescer(
            self._claim_batch,
            max_batch=MAX_CLAIM_BATCH,
            on_abandoned=self._keep_spare,
        )
        # Until when (the loop's clock) the queue's rate limit is spent: no
        # claim is sent before, and a timer wakes the workers then.
        self._resume_at: float | None = None
        self._resume_timer: asyncio.TimerHandle | None = None
        # When the shared claim abandoned last was sent (time.monotonic()),
        # until the next claim has given back what it may have taken.
        self._abandoned_at: float | None = None

    async def claim(self) -> ClaimedJob | None:
        """Claim one job for the calling worker, or None when none is ready."""
        job = self._spare()
        if job is not None:
            return job
        if self._resume_at is not None:
            if asyncio.get_running_loop().time() < self._resume_at:
                return None  # the rate limit is spent until then: no claim could start a job
            self._resume_at = None
        return await self._claims.submit(None)

    async def _claim_batch(self, requests: list[None]) -> list[ClaimedJob | None]:
        # Never more than the workers asking: a claimed job must not wait idle.
        limit = len(requests)
        sent = asyncio.get_running_loop().time()
        if self.limits is None:
            jobs: list[ClaimedJob | None] = list(await self.sessions.claim(self._request(limit)))
            return await self._taken(jobs, limit, sent)
        # A queue with limits: the limited claim keeps them.
        request = LimitedClaimRequest(claim=self._request(limit), limits=self.limits)
        claimed = await self.sessions.claim_limited(request)
        jobs = list(claimed.jobs)
        if claimed.retry_in_ms is not None:
            self._wait_for_window(claimed.retry_in_ms / 1000)
        elif self.limits.keyed and 0 < len(jobs) < limit:
            # It may have passed over jobs of keys that reached their limit
            # within this claim: the workers it left without a job ask once
            # more. A claim that takes nothing wakes nobody, so a queue whose
            # ready jobs are all over their limits is not claimed in a loop.
            self.wake.wake(limit - len(jobs))
        return await self._taken(jobs, limit, sent)

    def _wait_for_window(self, delay: float) -> None:
        """Send no claim for ``delay`` seconds (the rate limit's window ends
        then), and wake the workers when they may claim again."""
        loop = asyncio.get_running_loop()
        self._resume_at = loop.time() + delay
        if self._resume_timer is not None:
            self._resume_timer.cancel()
        self._resume_timer = loop.call_later(delay, self.wake.wake)
        logger.debug(
            "queue %s: its rate limit is spent; the next window starts in %.3fs",
            self.queue,
            delay,
            extra={"action": "rate_limit_spent", "queue": self.queue},
        )

    async def _taken(
        self, jobs: list[ClaimedJob | None], limit: int, sent: float
    ) -> list[ClaimedJob | None]:
        """Hold the leases of the ``jobs`` a claim sent at ``sent`` took, for
        the ``limit`` workers that asked."""
        self.leases.hold(((job.id, job.attempts) for job in jobs if job is not None), sent)
        if self._abandoned_at is not None:
            # After this claim: its statement waited for the abandoned one to
            # be cancelled or to end, and the jobs it took are held now.
            await self._give_back_abandoned(self._abandoned_at)
            self._abandoned_at = None
        return jobs + [None] * (limit - len(jobs))

    def _request(self, limit: int) -> ClaimRequest:
        return ClaimRequest(
            namespace=self.namespace,
            owner=self.owner,
            limit=limit,
            lease_ms=self.leases.lease_ms,
            queue=self.queue,
        )

    def _keep_spare(self, job: ClaimedJob | None) -> None:
        """A job claimed for a worker that went away meanwhile: the next worker takes it."""
        if job is not None:
            self._spares.append(job)
            self.wake.wake(1)

    def _give_back_later(self, job: ClaimedJob) -> None:
        self.leases.release((job.id, job.attempts))
        super()._give_back_later(job)

    async def _give_back_abandoned(self, sent: float) -> None:
        """Give back the jobs a claim sent at ``sent`` took, if it committed.

        Its jobs are this queue's plain jobs claimed by this server since
        then that it holds no lease on: no other claim of the queue ran here
        while it hung. Raises when the database cannot tell; the next claim
        tries again."""

        def since_sent(dialect: Any, cursor: Any) -> list[Claim]:
            # Measured here, in the pool's thread as the statement runs: a
            # window measured before the call waited for a thread ends short
            # of the claim it looks for. The margin covers the time to the
            # statement's clock; claims of this server that it reaches back
            # to were held before ``sent`` and none can have lost its lease
            # so soon, so none is given back wrongly.
            within_ms = int((time.monotonic() - sent) * 1000) + SINCE_MARGIN_MS
            return list(dialect.hot.claimed_since(cursor, self._request(0), within_ms=within_ms))

        claims = await self.store.run(self.pool, since_sent)
        # Read here, on the loop: no claim of this server runs meanwhile.
        unheld = [claim for claim in claims if self.leases.until(claim) is None]
        given = [job_id for job_id, attempts in unheld if await self._unclaim(job_id, attempts)]
        if given:
            self.wake.wake(len(given))
            logger.warning(
                "gave back %d jobs an abandoned claim had taken: %s",
                len(given),
                ", ".join(given),
                extra={"action": "abandoned_claim_given_back"},
            )

    def hung_since(self) -> float | None:
        """When the shared claim now in the database started, if one is."""
        return self._claims.flush_started

    def reset(self) -> None:
        """Abandon a shared claim that never returned; the next one starts
        afresh, after giving back what the abandoned one may have taken."""
        started = self._claims.flush_started
        if started is not None and self._abandoned_at is None:
            # An earlier abandoned claim not settled yet was sent before.
            self._abandoned_at = started
        self._claims.reset()

    async def close(self) -> None:
        if self._resume_timer is not None:
            self._resume_timer.cancel()
        self._claims.reset()
        await super().close()
