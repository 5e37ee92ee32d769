"""Claims: workers that ask at the same moment share one statement, on a
connection of their own, and get no more jobs than workers asked.

A job claimed for a worker that went away before taking it is kept as a
spare for the next worker while its lease is confirmed, and given back at
shutdown.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from later_django.db.rows import OwnerFence
from later_django.db.sessions import HotPath
from later_django.store import Store
from later_django.types import ClaimedJob
from later_django.worker.batching import Coalescer
from later_django.worker.lease_book import Claim, LeaseBook
from later_django.worker.notifier import Wakeup

logger = logging.getLogger(__name__)

MAX_CLAIM_BATCH = 255  # the most workers a server runs


class Claimer:
    def __init__(
        self,
        *,
        alias: str,
        namespace: str,
        owner: str,
        store: Store,
        pool: ThreadPoolExecutor,
        leases: LeaseBook,
        wake: Wakeup,
    ) -> None:
        self.namespace = namespace
        self.owner = owner
        self.store = store
        self.pool = pool
        self.leases = leases
        self.wake = wake
        self.path = HotPath(alias)
        self._spares: deque[ClaimedJob] = deque()
        self._claims: Coalescer[None, ClaimedJob | None] = Coalescer(
            self._claim_batch, max_batch=MAX_CLAIM_BATCH, on_abandoned=self._keep_spare
        )

    async def claim(self) -> ClaimedJob | None:
        """Claim one job for the calling worker, or None when none is ready."""
        while self._spares:
            job = self._spares.popleft()
            if self.leases.confirmed((job.id, job.attempts)):
                return job
            # Kept aside past its lease's deadline: no longer safe to start.
            self.leases.release((job.id, job.attempts))
        return await self._claims.submit(None)

    async def _claim_batch(self, requests: list[None]) -> list[ClaimedJob | None]:
        # Never more than the workers asking: a claimed job must not wait idle.
        limit = len(requests)
        sent = asyncio.get_running_loop().time()
        jobs: list[ClaimedJob | None] = list(
            await self.path.claim(
                namespace=self.namespace,
                owner=self.owner,
                limit=limit,
                lease_ms=self.leases.lease_ms,
            )
        )
        self.leases.hold(((job.id, job.attempts) for job in jobs if job is not None), sent)
        return jobs + [None] * (limit - len(jobs))

    def _keep_spare(self, job: ClaimedJob | None) -> None:
        """A job claimed for a worker that went away meanwhile: the next worker takes it."""
        if job is not None:
            self._spares.append(job)
            self.wake.wake(1)

    def drop(self, claim: Claim) -> None:
        """Forget a spare whose lease was given up."""
        for job in list(self._spares):
            if (job.id, job.attempts) == claim:
                self._spares.remove(job)

    async def release_spares(self) -> None:
        """Give back jobs claimed for workers that stopped before taking them."""
        while self._spares:
            job = self._spares.popleft()
            try:
                await self.store.run(self.pool, functools.partial(self._unclaim, job))
            except Exception as exc:  # noqa: BLE001  its lease recovers it instead
                logger.warning("could not give back job %s: %s", job.id, exc)
            self.leases.release((job.id, job.attempts))

    def _unclaim(self, job: ClaimedJob, dialect: Any, cursor: Any) -> bool:
        fence = OwnerFence(job_id=job.id, attempts=job.attempts, owner=self.owner)
        return bool(dialect.job_unclaim(cursor, fence))

    def hung_since(self) -> float | None:
        """When the shared claim now in the database started, if one is."""
        return self._claims.flush_started

    def reset(self) -> None:
        """Abandon a shared claim that never returned; the next one starts afresh."""
        self._claims.reset()

    async def close(self) -> None:
        self._claims.reset()
        await self.path.close()
