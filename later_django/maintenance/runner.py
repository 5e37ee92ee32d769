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
        self,
        store: Store,
        pool: ThreadPoolExecutor,
        ctx: StepContext,
        interval: float,
        *,
        lease: float,
    ) -> None:
        self.store = store
        self.pool = pool
        self.ctx = ctx
        self.interval = interval
        self.steps: dict[str, Step] = dict(STEPS)
        self.last_tick = time.monotonic()
        self.ticks = 0
        self.lease = lease
        # A gap this long between two steps means this process, or the
        # database it writes to, stood still (a pause, a SQLite write lock
        # held by a frozen process, an outage).
        self.stall_after = max(lease / 2, 3 * interval)
        self._last_step_end: float | None = None
        self._hold_rescue_until = 0.0

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
            start = time.monotonic()
            self._note_stall(start)
            if name == "rescue_stuck" and start < self._hold_rescue_until:
                results[name] = 0
                continue
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
            finally:
                self._note_stall(time.monotonic(), started=start)
        self.last_tick = time.monotonic()
        self.ticks += 1
        return results

    def _note_stall(self, now: float, *, started: float | None = None) -> None:
        """Hold off stuck-job recovery for one lease after a stall.

        While nothing could write, no server could renew its leases either:
        every running job looks abandoned afterwards. Waiting one lease gives
        the live owners time to renew; jobs of dead ones are recovered after.
        """
        previous = started if started is not None else self._last_step_end
        self._last_step_end = now
        if previous is None or now - previous <= self.stall_after:
            return
        if now + self.lease > self._hold_rescue_until:
            logger.warning(
                "this process or its database stood still for %.1fs; stuck-job "
                "recovery waits %.1fs so live servers can renew their leases",
                now - previous,
                self.lease,
                extra={"action": "rescue_held"},
            )
            self._hold_rescue_until = now + self.lease
