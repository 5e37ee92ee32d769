"""JobContext: what a handler receives besides its payload, and the
LATER["CONTEXT"] factory's result it carries as ``app``."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Unpack

from django.utils.module_loading import import_string

from later_django import enqueue as api
from later_django.conf import conf
from later_django.ids import JobId
from later_django.options import EnqueueKeywords
from later_django.partitions import api as partitions
from later_django.recurring import api as recurring
from later_django.types import RecurringSchedule

_CANCEL_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext:
    """The running job's id and attempt, the app context, and the enqueue API.

    ``attempt`` counts from 1. ``app`` is the result of LATER["CONTEXT"],
    built once per worker process. The enqueue methods write through the
    handler's own thread connection, so a handler can chain work. Each is
    the public call of the same name: the same options, checks and path.
    """

    job_id: JobId
    attempt: int
    app: Any = None
    # Made on first use: most jobs never look, and an Event costs a lock.
    _cancel: threading.Event | None = field(default=None, init=False, repr=False, compare=False)
    # A Django Tasks attempt's end (db.rows.TaskAttemptEnd), handed over by
    # its handler: the worker writes it with the attempt's outcome.
    _attempt_end: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def cancel_requested(self) -> threading.Event:
        """Set when the worker stopped this attempt or stopped waiting for
        it (its timeout passed, cancel() asked it to stop, its lease was
        lost or not renewed in time, the shutdown deadline passed): a sync
        handler, which cannot be stopped, should check it between steps and
        return."""
        event = self._cancel
        if event is None:
            with _CANCEL_LOCK:
                event = self._cancel
                if event is None:
                    event = threading.Event()
                    object.__setattr__(self, "_cancel", event)
        return event

    def enqueue(self, payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
        return api.enqueue(payload, **options)

    def enqueue_in(self, payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
        return api.enqueue_in(payload, **options)

    def enqueue_many(
        self, payloads: list[object], **options: Unpack[EnqueueKeywords]
    ) -> list[JobId]:
        return api.enqueue_many(payloads, **options)

    def enqueue_delayed(
        self, payload: object, delay: dt.timedelta, *, priority: int | None = None
    ) -> JobId:
        return api.enqueue_delayed(payload, delay, priority=priority)

    def enqueue_delayed_at(
        self, payload: object, when: dt.datetime, *, priority: int | None = None
    ) -> JobId:
        return api.enqueue_delayed_at(payload, when, priority=priority)

    def enqueue_continue(
        self, parent: str, payload: object, *, priority: int | None = None
    ) -> JobId:
        return api.enqueue_continue(parent, payload, priority=priority)

    def enqueue_continue_all(
        self, parents: Iterable[str], payload: object, *, priority: int | None = None
    ) -> JobId:
        return api.enqueue_continue_all(parents, payload, priority=priority)

    def cancel(self, job_id: str) -> bool:
        return api.cancel(job_id)

    async def aenqueue(self, payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
        return await api.aenqueue(payload, **options)

    async def aenqueue_in(self, payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
        return await api.aenqueue_in(payload, **options)

    async def aenqueue_many(
        self, payloads: list[object], **options: Unpack[EnqueueKeywords]
    ) -> list[JobId]:
        return await api.aenqueue_many(payloads, **options)

    async def aenqueue_delayed(
        self, payload: object, delay: dt.timedelta, *, priority: int | None = None
    ) -> JobId:
        return await api.aenqueue_delayed(payload, delay, priority=priority)

    async def aenqueue_delayed_at(
        self, payload: object, when: dt.datetime, *, priority: int | None = None
    ) -> JobId:
        return await api.aenqueue_delayed_at(payload, when, priority=priority)

    async def aenqueue_continue(
        self, parent: str, payload: object, *, priority: int | None = None
    ) -> JobId:
        return await api.aenqueue_continue(parent, payload, priority=priority)

    async def aenqueue_continue_all(
        self, parents: Iterable[str], payload: object, *, priority: int | None = None
    ) -> JobId:
        return await api.aenqueue_continue_all(parents, payload, priority=priority)

    async def acancel(self, job_id: str) -> bool:
        return await api.acancel(job_id)

    def enqueue_recurring(
        self, identifier: str, payload: object, cron: str, *, tz: object = None, priority: int = 0
    ) -> JobId | None:
        return recurring.enqueue_recurring(identifier, payload, cron, tz=tz, priority=priority)

    def enqueue_recurring_sequential(
        self, identifier: str, payload: object, cron: str, *, tz: object = None, priority: int = 0
    ) -> JobId | None:
        return recurring.enqueue_recurring_sequential(
            identifier, payload, cron, tz=tz, priority=priority
        )

    async def aenqueue_recurring_sequential(
        self, identifier: str, payload: object, cron: str, *, tz: object = None, priority: int = 0
    ) -> JobId | None:
        return await recurring.aenqueue_recurring_sequential(
            identifier, payload, cron, tz=tz, priority=priority
        )

    def enqueue_recurring_continue(
        self, parent: str, payload: object, *, priority: int | None = None
    ) -> JobId:
        """Chain ``payload`` to ``parent`` (usually ``self.job_id``), an
        occurrence of a sequential recurring job or a job chained to one."""
        return partitions.enqueue_recurring_continue(parent, payload, priority=priority)

    async def aenqueue_recurring_continue(
        self, parent: str, payload: object, *, priority: int | None = None
    ) -> JobId:
        return await partitions.aenqueue_recurring_continue(parent, payload, priority=priority)

    def remove_recurring(self, identifier: str) -> bool:
        return recurring.remove_recurring(identifier)

    def list_recurring(self) -> list[RecurringSchedule]:
        return recurring.list_recurring()

    async def aenqueue_recurring(
        self, identifier: str, payload: object, cron: str, *, tz: object = None, priority: int = 0
    ) -> JobId | None:
        return await recurring.aenqueue_recurring(
            identifier, payload, cron, tz=tz, priority=priority
        )

    async def aremove_recurring(self, identifier: str) -> bool:
        return await recurring.aremove_recurring(identifier)

    async def alist_recurring(self) -> list[RecurringSchedule]:
        return await recurring.alist_recurring()

    def enqueue_to_partition(self, payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
        return partitions.enqueue_to_partition(payload, **options)

    def enqueue_to_partition_delayed(
        self, payload: object, delay: dt.timedelta, *, priority: int | None = None
    ) -> JobId:
        return partitions.enqueue_to_partition_delayed(payload, delay, priority=priority)

    def enqueue_continue_to_partition(
        self, parent: str, payload: object, *, priority: int | None = None
    ) -> JobId:
        return partitions.enqueue_continue_to_partition(parent, payload, priority=priority)

    def enqueue_to_partition_in(self, payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
        return partitions.enqueue_to_partition_in(payload, **options)

    async def aenqueue_to_partition(
        self, payload: object, **options: Unpack[EnqueueKeywords]
    ) -> JobId:
        return await partitions.aenqueue_to_partition(payload, **options)

    async def aenqueue_to_partition_delayed(
        self, payload: object, delay: dt.timedelta, *, priority: int | None = None
    ) -> JobId:
        return await partitions.aenqueue_to_partition_delayed(payload, delay, priority=priority)

    async def aenqueue_continue_to_partition(
        self, parent: str, payload: object, *, priority: int | None = None
    ) -> JobId:
        return await partitions.aenqueue_continue_to_partition(parent, payload, priority=priority)

    async def aenqueue_to_partition_in(
        self, payload: object, **options: Unpack[EnqueueKeywords]
    ) -> JobId:
        return await partitions.aenqueue_to_partition_in(payload, **options)


def build_app() -> Any:
    """Call the LATER["CONTEXT"] factory and return its result, or None
    when the key is not set. A worker process calls it once, at start-up;
    later_django.testing's drain() once per call."""
    path = conf.CONTEXT
    if not path:
        return None
    factory = import_string(path) if isinstance(path, str) else path
    return factory()
