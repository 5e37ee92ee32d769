"""Wake-ups for idle workers: PostgreSQL LISTEN, SQLite commit watching,
in-process commits, and polling.

A missed or spurious wake-up is harmless: it only changes how soon an idle
worker tries to claim again; the poll interval bounds the worst case.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from typing import Protocol

from django.db.backends.utils import CursorWrapper

from later_django import wakeup
from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.db.sessions import SqliteSession
from later_django.queue_names import DEFAULT_QUEUE

logger = logging.getLogger(__name__)

LISTEN_RECONNECT_DELAY = 1.0  # seconds between attempts after the listener fails
# Seconds between looks at SQLite's commit counter: a look costs microseconds
# and no I/O, so a job enqueued by another process starts within a few ms.
WATCH_INTERVAL = 0.004


class Wakeup:
    """Idle workers wait here; ``wake(n)`` releases ``n`` of them (all when
    None), first come first served: one ready job wakes one worker, since
    the others would claim nothing and delay the one that gets it.
    ``generation`` counts wake-ups, so a worker whose claim was in flight
    during one passes the generation it saw as ``since`` and does not sleep
    through it."""

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.generation = 0

    def wake(self, count: int | None = None) -> None:
        self.generation += 1
        left = len(self._waiters) if count is None else count
        while left > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                left -= 1

    async def wait(self, since: int | None = None, timeout: float | None = None) -> None:
        """Wait for a wake-up (or ``timeout`` seconds); return at once if one
        came since generation ``since``."""
        if since is not None and since != self.generation:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            # asyncio.timeout(), not wait_for(): on Python 3.11 wait_for wraps
            # the wait in a task of its own.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await waiter
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):  # not popped by a wake: timed out
                self._waiters.remove(waiter)


def ready_count(payload: str, namespace: str) -> tuple[str, int]:
    """The queue and how many of its jobs of ``namespace`` a
    NOTIFY payload announces (0: another namespace): the namespace, then
    chr(30) and the queue for a named queue's, then chr(31) and the count
    when more than one (migration 0014)."""
    said, _, count = payload.partition("\x1f")
    name, _, queue = said.partition("\x1e")
    if name != namespace:
        return DEFAULT_QUEUE, 0
    return queue or DEFAULT_QUEUE, int(count) if count.isdigit() else 1


def partition_noticed(payload: str, namespace: str) -> tuple[str, int] | None:
    """The (topic, partition) of ``namespace`` a ``later_partition`` payload
    names: the namespace, chr(31), the topic, chr(30) and the partition
    (migration 0018). None for another namespace's, and for the bare
    namespace that the same commits also send for servers of the previous
    release (which look over every partition on it)."""
    said, found, place = payload.partition("\x1f")
    if not found or said != namespace:
        return None
    topic, _, partition = place.rpartition("\x1e")
    return (topic, int(partition)) if partition.isdigit() else None


class PartitionNews(Protocol):
    """The partition workers, as commits are told to them."""

    @property
    def wake(self) -> Wakeup: ...

    def noticed(self, key: tuple[str, int]) -> None:
        """A commit announced that ``key``'s partition may have a ready head."""


class Notifier:
    """Feeds a Wakeup from LISTEN (PostgreSQL, an asyncio connection in the
    loop itself: no thread in between), from the SQLite file's commit
    counter (then a read for ready jobs, no write lock) and local commits."""

    def __init__(
        self,
        wakes: dict[str, Wakeup],
        *,
        alias: str,
        namespace: str,
        listen: bool,
        watch: bool = False,
        partitions: PartitionNews | None = None,
        keyed: frozenset[str] = frozenset(),
    ) -> None:
        # The wake-ups of each served queue's workers, by its name.
        self.wakes = wakes
        # The served queues whose claims keep concurrency keys: SQLite's look
        # wakes their workers only for a job below its key's limit.
        self.keyed = keyed
        # The partition pollers, when this server runs them.
        self.partitions = partitions
        self.alias = alias
        self.namespace = namespace
        self.listen = listen
        self.watch = watch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        wakeup.add_listener(self._wake_threadsafe)
        if self.partitions is not None:
            wakeup.add_partition_listener(self._wake_partitions_threadsafe)
        if self.listen:
            self._task = asyncio.create_task(self._listen_forever(), name="later-listen")
        elif self.watch:
            self._task = asyncio.create_task(self._watch_forever(), name="later-watch")

    def stop(self) -> None:
        wakeup.remove_listener(self._wake_threadsafe)
        wakeup.remove_partition_listener(self._wake_partitions_threadsafe)
        if self._task is not None:
            self._task.cancel()

    async def join(self, timeout: float) -> None:
        """Wait, after stop(), until the listener closed its connection."""
        if self._task is not None:
            await asyncio.wait([self._task], timeout=timeout)

    def wake_all(self, count: int | None = None) -> None:
        for wake in self.wakes.values():
            wake.wake(count)

    def _wake_threadsafe(self, count: int | None) -> None:
        # A commit in this process: its queue is not told, so every served
        # queue's workers look (a spurious wake-up only costs a claim).
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.wake_all, count)

    def _wake_partitions_threadsafe(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and self.partitions is not None:
            loop.call_soon_threadsafe(self.partitions.wake.wake, 1)

    async def _listen_forever(self) -> None:
        from later_django.db.listen import notifications  # PostgreSQL only: needs psycopg
        from later_django.db.postgresql import PARTITION_CHANNEL

        partitions = self.partitions
        while True:
            try:
                async for note in notifications(self.alias, partitions=partitions is not None):
                    if note is None:
                        self.connected.set()
                        # Anything committed while we were not listening is found now.
                        self.wake_all()
                        if partitions is not None:
                            partitions.wake.wake()
                        continue
                    channel, payload = note
                    if channel == PARTITION_CHANNEL:
                        noticed = partition_noticed(payload, self.namespace)
                        if partitions is not None and noticed is not None:
                            partitions.noticed(noticed)
                    else:
                        queue, ready = ready_count(payload, self.namespace)
                        if ready and (wake := self.wakes.get(queue)) is not None:
                            wake.wake(ready)
            except Exception as exc:  # noqa: BLE001  the database may be restarting
                self.connected.clear()
                logger.warning(
                    "LISTEN connection lost (%s); reconnecting; idle workers poll meanwhile",
                    exc,
                    extra={"action": "listen_reconnect"},
                )
                await asyncio.sleep(LISTEN_RECONNECT_DELAY)

    def _ready(self, queue: str, dialect: Dialect, cursor: CursorWrapper) -> bool:
        if queue in self.keyed:
            return dialect.limits.keyed_ready_exists(cursor, namespace=self.namespace, queue=queue)
        return dialect.hot.ready_exists(cursor, namespace=self.namespace, queue=queue)

    async def _watch_forever(self) -> None:
        session = SqliteSession(self.alias, dialect_for(self.alias))
        seen: int | None = None
        try:
            while True:
                await asyncio.sleep(WATCH_INTERVAL)
                try:
                    counter = await session.run(lambda d, c: d.change_counter(c))
                    if counter != seen:
                        seen = counter
                        if self.partitions is not None:
                            # The poller's own look is the check.
                            self.partitions.wake.wake(1)
                        for queue, wake in self.wakes.items():
                            if await session.run(functools.partial(self._ready, queue)):
                                wake.wake()
                except Exception as exc:  # noqa: BLE001  workers still poll meanwhile
                    logger.warning(
                        "watching the database for new jobs failed (%s); retrying",
                        exc,
                        extra={"action": "watch_error"},
                    )
                    await asyncio.sleep(LISTEN_RECONNECT_DELAY)
        finally:
            await session.close()
