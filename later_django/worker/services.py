"""The tasks of one server, owned by one TaskGroup: named services that are
restarted with a backoff when they crash, and the worker tasks.

Nothing a task raises can tear the group down: services restart, workers
record their crash for the supervisor. Closing the group waits for what is
left and cancels it past a grace period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

SERVICE_RESTART_MAX = 30.0  # cap, in seconds, of a crashed service's restart backoff


class ServiceGroup:
    def __init__(self) -> None:
        self._group: asyncio.TaskGroup | None = None
        self._host: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._services: dict[str, asyncio.Task[None]] = {}
        self._factories: dict[str, Callable[[], Awaitable[None]]] = {}

    async def open(self) -> None:
        ready = asyncio.Event()
        self._host = asyncio.create_task(self._hold(ready), name="later-server")
        await ready.wait()

    async def _hold(self, ready: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            ready.set()
            await self._closing.wait()

    def create_task(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        assert self._group is not None, "start() the server first"
        return self._group.create_task(coro, name=name)

    def start(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        """Run ``factory()`` as the service ``name``, restarted whenever it crashes."""
        self._factories[name] = factory
        self._services[name] = self.create_task(
            self._restarting(name, factory), name=f"later-{name}"
        )

    async def stop(self, name: str) -> None:
        task = self._services.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def stop_all(self) -> None:
        for name in list(self._services):
            await self.stop(name)

    def restart(self, name: str) -> None:
        task = self._services.pop(name, None)
        if task is not None:
            task.cancel()
        self.start(name, self._factories[name])

    def task(self, name: str) -> asyncio.Task[None] | None:
        return self._services.get(name)

    async def close(self, grace: float) -> None:
        """End the group once its tasks are done; cancel any left after ``grace``."""
        self._closing.set()
        if self._host is not None:
            await asyncio.wait([self._host], timeout=grace)
            self._host.cancel()

    @staticmethod
    async def _restarting(name: str, factory: Callable[[], Awaitable[None]]) -> None:
        delay = 0.5
        while True:
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception(
                    "later service %s crashed; restarting in %.1fs",
                    name,
                    delay,
                    extra={"action": "service_crash", "service": name},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, SERVICE_RESTART_MAX)
