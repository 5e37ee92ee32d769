"""The maintenance loop: runs every step each interval; one failing step never
stops it. Between ticks it promotes delayed and retried jobs the moment they
are due, so a job due between two ticks does not wait for the next one."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db.backends.utils import CursorWrapper

from later_django.db.base import Dialect
from later_django.maintenance.steps import STEPS, StepContext
from later_django.threaded_store import ThreadedStore

logger = logging.getLogger(__name__)

Step = Callable[[Dialect, CursorWrapper, StepContext], int]

# The wait between two ticks is the interval times a factor in this range.
JITTER = (0.8, 1.2)
# After a promotion found nothing although a job looked due (another server
# was promoting it), look again this much later instead of at once.
RECHECK_MS = 50


class Maintenance:
    """Runs the maintenance steps in-process on a pool of its own."""

    def __init__(
        self,
        store: ThreadedStore,
        pool: ThreadPoolExecutor,
        ctx: StepContext,
        interval: float,
        *,
        lease: float,
        wake: Callable[[int], Any],
        on_rescued: Callable[[int], None],
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
        self.wake = wake
        self._promotion: asyncio.TimerHandle | None = None
        # Told how many stuck jobs each tick recovered (the status line).
        self.on_rescued = on_rescued
        self._promoting: set[asyncio.Future[None]] = set()

    async def run(self) -> None:
        try:
            while True:
                await self.run_once()
                try:
                    await self._plan_promotion(promoted=1)
                except Exception as exc:  # noqa: BLE001  the next tick plans again
                    logger.debug("could not plan the next promotion: %s", exc)
                # Jitter so a fleet of servers does not run in lockstep.
                await asyncio.sleep(self.interval * random.uniform(*JITTER))  # noqa: S311
        finally:
            if self._promotion is not None:
                self._promotion.cancel()

    def promote_after(self, delay_ms: int) -> None:
        """Promote the jobs due ``delay_ms`` from now at that moment, unless
        the next tick comes first. One timer at a time: the earliest wins, and
        each promotion plans the next."""
        delay = max(delay_ms, 0) / 1000
        if delay >= self.interval * JITTER[1]:
            return  # the next tick plans it
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if self._promotion is not None:
            if self._promotion.when() <= when:
                return
            self._promotion.cancel()
        self._promotion = loop.call_at(when, self._start_promotion)

    def _start_promotion(self) -> None:
        self._promotion = None
        task = asyncio.ensure_future(self._promote_on_time())
        # Keep a reference until done: the loop holds tasks only weakly.
        self._promoting.add(task)
        task.add_done_callback(self._promoting.discard)

    async def _promote_on_time(self) -> None:
        try:
            promoted = await self.run_step("promote_due")
            if promoted:
                self.wake(promoted)
            await self._plan_promotion(promoted)
        except Exception as exc:  # noqa: BLE001  the next tick promotes them
            logger.debug("promotion between ticks failed: %s", exc)

    async def _plan_promotion(self, promoted: int) -> None:
        """Set the timer for the next delayed or retried job due before the
        next tick."""
        namespace = self.ctx.namespace

        def next_due_in(dialect: Dialect, cursor: CursorWrapper) -> int | None:
            return dialect.upkeep.next_due_in(cursor, namespace=namespace)

        due_in = await self.store.run(self.pool, next_due_in)
        if due_in is not None:
            self.promote_after(due_in if promoted or due_in > 0 else RECHECK_MS)

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
                results[name] = done = await self.store.run(
                    self.pool, functools.partial(self._call, step)
                )
                if name == "rescue_stuck" and done:
                    self.on_rescued(done)
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
