"""Keyed jobs whose sync handler ran past its timeout: the outcome of each is
stored once the handler's thread has returned, not before.

The claim keeps a concurrency key by counting the key's running rows, and a
thread cannot be stopped: stored at its timeout, a job would free its key's
slot while its handler still runs. Held here, its row stays running (its
lease renewed) while its worker takes other jobs; the completer stores it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from later_django import registry
from later_django.types import ClaimedJob
from later_django.worker.completer import Completer, Ran, resolve
from later_django.worker.executor import Outcome

logger = logging.getLogger(__name__)


class Overruns:
    """The outcomes held until their handler's thread returns, each as the
    task that stores it then."""

    def __init__(self, completer: Completer, on_stored: Callable[[object], None]) -> None:
        self.completer = completer
        self.on_stored = on_stored  # called with each held outcome's store, once it is done
        self.held: set[asyncio.Task[None]] = set()

    @staticmethod
    def keyed(job: ClaimedJob) -> bool:
        handler = registry.handler_by_name(job.type_name)
        return handler is not None and handler.concurrency is not None

    def hold(self, job: ClaimedJob, outcome: Outcome, ran: Ran) -> None:
        """Store ``outcome`` of ``job`` (whose ``thread`` still runs) once
        its thread has returned."""
        logger.warning(
            "job %s attempt %d ran past its timeout; it keeps its concurrency key's "
            "slot until its sync handler's thread returns, and its outcome is stored then",
            job.id,
            job.attempt,
            extra={"action": "key_held", "job_id": job.id},
        )
        task = asyncio.ensure_future(self._store_once_returned(job, outcome, ran))
        self.held.add(task)
        task.add_done_callback(self.held.discard)

    async def _store_once_returned(self, job: ClaimedJob, outcome: Outcome, ran: Ran) -> None:
        thread = outcome.thread
        assert thread is not None
        loop = asyncio.get_running_loop()
        returned: asyncio.Future[None] = loop.create_future()

        def on_return(_: object) -> None:
            # In the handler's thread; a loop closed since has nobody waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(resolve, returned)

        thread.add_done_callback(on_return)
        await returned
        stored = self.completer.store_outcome(job, replace(outcome, thread=None), ran)
        stored.add_done_callback(self.on_stored)
