"""What a worker process tells the dashboard: counts and waits kept in memory
from the worker's events, written as one row about once a second, never a
write per job. ``FigureWriter`` is the worker extension that does it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from later_django import events
from later_django.dashboard.waits import Waits, encode
from later_django.db.rows import StatRow

if TYPE_CHECKING:
    from later_django.worker.extensions import ServerFacts

logger = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0  # seconds between two rows of one server's figures


class Recorder:
    """Counts starts and outcomes, and the dispatch wait of every job that
    finished: how long it sat due before a worker started it."""

    __slots__ = ("failed", "partition", "regular", "retried", "started", "succeeded")

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.started = 0
        self.succeeded = 0
        self.retried = 0
        self.failed = 0
        self.regular = Waits.empty()
        self.partition = Waits.empty()

    def finished(self, outcome: str, waited_ms: int, partitioned: bool) -> None:
        if outcome == "succeeded":
            self.succeeded += 1
        elif outcome == "retry":
            self.retried += 1
        elif outcome == "failed":
            self.failed += 1
        (self.partition if partitioned else self.regular).add(waited_ms)

    def take(self) -> StatRow | None:
        """What was recorded since the last take, or None if nothing was;
        starts afresh."""
        if not (self.started or self.succeeded or self.retried or self.failed):
            return None
        row = StatRow(
            started=self.started,
            succeeded=self.succeeded,
            retried=self.retried,
            failed=self.failed,
            regular_waits=encode(self.regular.counts),
            regular_sum_ms=self.regular.sum_ms,
            regular_max_ms=self.regular.max_ms,
            partition_waits=encode(self.partition.counts),
            partition_sum_ms=self.partition.sum_ms,
            partition_max_ms=self.partition.max_ms,
        )
        self._reset()
        return row


class FigureWriter:
    """Records one server's jobs from its events and writes them for the
    dashboard once a second while it works, and once more as it stops."""

    name = "dashboard"

    def __init__(self, server: ServerFacts) -> None:
        self.server = server
        self.recorder = Recorder()
        self._unsubscribe: list[Callable[[], None]] = [
            events.subscribe(self._on_started, events.JobStarted),
            events.subscribe(self._on_finished, events.JobFinished),
        ]

    def _on_started(self, event: events.JobStarted) -> None:
        if event.server_id == self.server.server_id:
            self.recorder.started += 1

    def _on_finished(self, event: events.JobFinished) -> None:
        if event.server_id == self.server.server_id:
            waited_ms = int(event.waited * 1000)
            self.recorder.finished(event.outcome, waited_ms, event.partitioned)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            await self.flush()

    async def flush(self) -> None:
        row = self.recorder.take()
        if row is None:
            return
        namespace, server_id = self.server.namespace, self.server.server_id
        try:
            await self.server.run_db(
                lambda d, c: d.reads.stat_insert(
                    c, namespace=namespace, server_id=server_id, row=row
                )
            )
        except Exception as exc:  # noqa: BLE001  a second of figures, not jobs
            logger.warning(
                "could not store the dashboard's figures: %s",
                exc,
                extra={"action": "dashboard_flush_error"},
            )

    async def stop(self) -> None:
        """Write the figures since the last row, and stop recording."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        await self.flush()
