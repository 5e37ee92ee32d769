"""Group commit for the hot path: concurrent requests of many workers share one statement.

While one batch is in the database, the next one gathers; a lone request
goes out at once, so batching never adds latency, it only removes round
trips under load. A request whose caller went away is never dropped: the
caller of ``Coalescer`` decides what to do with its result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from later_django.exceptions import LaterError

Req = TypeVar("Req")
Res = TypeVar("Res")


class Coalescer(Generic[Req, Res]):
    """Runs ``flush(requests) -> results`` (one result per request, in order)
    for every request submitted while the previous flush was running."""

    def __init__(
        self,
        flush: Callable[[list[Req]], Awaitable[list[Res]]],
        *,
        max_batch: int,
        on_abandoned: Callable[[Res], None] | None = None,
    ) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._on_abandoned = on_abandoned
        self._pending: list[tuple[Req, asyncio.Future[Res]]] = []
        self._task: asyncio.Task[None] | None = None
        self.flush_started: float | None = None

    async def submit(self, request: Req) -> Res:
        return await self.submit_nowait(request)

    def submit_nowait(self, request: Req) -> asyncio.Future[Res]:
        """Queue ``request``; the returned future holds its result."""
        future: asyncio.Future[Res] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="later-coalescer")
        return future

    def reset(self) -> None:
        """Abandon a flush that never returned (e.g. a hung connection) so new
        requests get a fresh one; its waiters get a LaterError."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self.flush_started = None

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self.flush_started = time.monotonic()
            try:
                results = await self._flush([request for request, _ in batch])
            except asyncio.CancelledError:
                for _, future in batch + self._pending:
                    if not future.done():
                        future.set_exception(LaterError("abandoned a database call that hung"))
                self._pending = []
                raise
            except Exception as exc:  # noqa: BLE001  handed to every waiter
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            finally:
                self.flush_started = None
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
                elif self._on_abandoned is not None:
                    self._on_abandoned(result)
