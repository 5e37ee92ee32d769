"""The maintenance loop: runs every step each interval; one failing step never stops it."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db.backends.utils import CursorWrapper

from later_django.db.base import Dialect
from later_django.maintenance.steps import STEPS, StepContext
from later_django.store import Store

logger = logging.getLogger(__name__)

Step = Callable[[Dialect, CursorWrapper, StepContext], int]


class Maintenance:
    """Runs the maintenance steps in-process on a pool of its own."""

    def __init__(
        self, store: Store, pool: ThreadPoolExecutor, ctx: StepContext, interval: float
    ) -> None:
        self.store = store
        self.pool = pool
        self.ctx = ctx
        self.interval = interval
        self.steps: dict[str, Step] = dict(STEPS)
        self.last_tick = time.monotonic()
        self.ticks = 0

    async def run(self) -> None:
        while True:
            await self.run_once()
            # Jitter so a fleet of servers does not run in lockstep.
            await asyncio.sleep(self.interval * random.uniform(0.8, 1.2))  # noqa: S311

    async def run_step(self, name: str) -> int:
        """Run one step now, outside the regular tick."""
        return await self.store.run(self.pool, functools.partial(self._call, self.steps[name]))

    def _call(self, step: Step, dialect: Dialect, cursor: CursorWrapper) -> int:
        return step(dialect, cursor, self.ctx)

    async def run_once(self) -> dict[str, int | Exception]:
        """Run every step once; return each step's count or its error."""
        results: dict[str, int | Exception] = {}
        for name, step in self.steps.items():
            try:
                results[name] = await self.store.run(self.pool, functools.partial(self._call, step))
            except Exception as exc:  # noqa: BLE001  retried next tick
                results[name] = exc
                logger.error(
                    "maintenance step %s failed; retrying next cycle: %s",
                    name,
                    exc,
                    extra={"action": "maintenance_error", "step": name},
                )
        self.last_tick = time.monotonic()
        self.ticks += 1
        return results
