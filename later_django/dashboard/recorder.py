"""What a worker process tells the dashboard: counts and waits kept in
memory as jobs run, and written as one row about once a second, never a
write per job. Used on the worker's event loop thread only."""

from __future__ import annotations

import time

from later_django.dashboard.waits import Waits, encode
from later_django.db.rows import StatRow


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

    def finished(
        self, outcome: str, run_at_ms: int, handler_seconds: float, partitioned: bool
    ) -> None:
        if outcome == "succeeded":
            self.succeeded += 1
        elif outcome == "retry":
            self.retried += 1
        else:
            self.failed += 1
        waited_ms = int((time.time() - handler_seconds) * 1000) - run_at_ms
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
