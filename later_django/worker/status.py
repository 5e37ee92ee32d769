"""The worker's status line: every minute, what this process did and what waits.

The counts are the outcomes the server stored since the last line; the
ready backlog comes from the stage counters. It writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

logger = logging.getLogger(__name__)

STATUS_INTERVAL = 60.0  # seconds between two status lines


@dataclass(slots=True)
class OutcomeCounts:
    """Outcomes stored since the last status line: the server adds, the reporter takes."""

    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    # Stuck jobs (their process died) this server's maintenance recovered.
    recovered: int = 0

    def add(self, kind: str) -> None:
        if kind == "succeeded":
            self.succeeded += 1
        elif kind == "failed":
            self.failed += 1
        elif kind == "retry":
            self.retried += 1

    def add_recovered(self, count: int) -> None:
        self.recovered += count

    def take(self) -> tuple[int, int, int, int]:
        """Return (succeeded, failed, retried, recovered) and start counting
        from zero."""
        counts = (self.succeeded, self.failed, self.retried, self.recovered)
        self.succeeded = self.failed = self.retried = self.recovered = 0
        return counts


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusResult:
    """What one status line said."""

    seconds: float
    succeeded: int
    failed: int
    retried: int
    recovered: int
    # Jobs ready to run in the namespace; None when the counters could not be read.
    ready: int | None
    workers: int

    @property
    def per_second(self) -> float:
        finished = self.succeeded + self.failed + self.retried
        return finished / self.seconds if self.seconds > 0 else 0.0


class StatusReporter:
    """Logs one INFO line per STATUS_INTERVAL, idle or not: an operator
    following a worker sees it is alive as well as what it does."""

    def __init__(
        self,
        counts: OutcomeCounts,
        ready_backlog: Callable[[], Awaitable[int]],
        worker_count: Callable[[], int],
    ) -> None:
        self.counts = counts
        self.ready_backlog = ready_backlog
        self.worker_count = worker_count
        self._since = time.monotonic()

    async def run(self) -> None:
        self._since = time.monotonic()
        while True:
            # Read at each turn, so a test can shorten it.
            await asyncio.sleep(STATUS_INTERVAL)
            await self.run_once()

    async def run_once(self) -> StatusResult:
        try:
            ready: int | None = await self.ready_backlog()
        except Exception as exc:  # noqa: BLE001  the line still says what ran
            logger.debug("could not read the ready backlog: %s", exc)
            ready = None
        now = time.monotonic()
        succeeded, failed, retried, recovered = self.counts.take()
        result = StatusResult(
            seconds=now - self._since,
            succeeded=succeeded,
            failed=failed,
            retried=retried,
            recovered=recovered,
            ready=ready,
            workers=self.worker_count(),
        )
        self._since = now
        logger.info(
            "last %.0fs: %d succeeded, %d failed, %d retried (%.1f jobs/s); "
            "%d stuck jobs recovered; %s ready; %d workers",
            result.seconds,
            result.succeeded,
            result.failed,
            result.retried,
            result.per_second,
            result.recovered,
            "unknown" if ready is None else ready,
            result.workers,
            extra={"action": "worker_status", **asdict(result), "per_second": result.per_second},
        )
        return result
