"""ThreadedStore: how worker code runs the dialect's stores from asyncio.

Each call hops to a thread of a pool the caller names (Django connections
are per thread), heals a connection broken by a database restart, and turns
"database is locked" and serialization failures into LaterBusy. Every write
but a job's claim and completion (db/sessions.py, no thread hop) takes it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.db.errors import is_busy
from later_django.exceptions import LaterBusy

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ThreadedStore:
    """Runs dialect operations on the LATER database from asyncio code."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.dialect: Dialect = dialect_for(alias)
        # The Django connection each pool thread opened, closed by close().
        self._opened: dict[threading.Thread, BaseDatabaseWrapper] = {}
        self._opened_lock = threading.Lock()
        # Bumped when a call finds its connection dead (a database restart, a
        # killed backend): every pool thread then drops the connection it held
        # before, instead of each failing once more on its own stale one.
        self._generation = 0
        self._seen = threading.local()

    async def run(
        self,
        pool: ThreadPoolExecutor,
        op: Callable[[Dialect, CursorWrapper], T],
        *,
        atomic: bool = False,
    ) -> T:
        """Run ``op(dialect, cursor)`` in a thread of ``pool``; in one
        transaction when ``atomic`` (else each statement commits alone)."""
        loop = asyncio.get_running_loop()
        call = functools.partial(self._run_in_thread, op, atomic)
        return await loop.run_in_executor(pool, call)

    def close(self, timeout: float) -> int:
        """Close the connections pool threads opened, once those threads ended.

        Call after shutting the pools down. A thread still busy after
        ``timeout`` seconds keeps its connection. Returns how many were closed."""
        with self._opened_lock:
            opened, self._opened = self._opened, {}
        deadline = time.monotonic() + timeout
        closed = 0
        for thread, connection in opened.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive() or connection.connection is None:
                continue
            # The owning thread has ended, so closing from here is safe.
            connection.inc_thread_sharing()
            try:
                connection.close()
            except DatabaseError:
                pass  # already broken: nothing left to release
            finally:
                connection.dec_thread_sharing()
            closed += 1
        return closed

    def _run_in_thread(self, op: Callable[[Dialect, CursorWrapper], T], atomic: bool) -> T:
        connection = connections[self.alias]
        thread = threading.current_thread()
        if thread not in self._opened:
            with self._opened_lock:
                self._opened[thread] = connection
        if connection.connection is not None and connection.errors_occurred:
            # A database restart or a killed backend leaves a dead connection
            # behind; drop it so this call reconnects instead of failing forever.
            if not connection.is_usable():
                connection.close()
            connection.errors_occurred = False
        seen = getattr(self._seen, "generation", self._generation)
        if seen < self._generation and connection.connection is not None:
            connection.close()  # opened before another thread found the database gone
        self._seen.generation = self._generation
        try:
            if atomic:
                with transaction.atomic(using=self.alias), connection.cursor() as cursor:
                    return op(self.dialect, cursor)
            with connection.cursor() as cursor:
                return op(self.dialect, cursor)
        except DatabaseError as exc:
            # Django flagged errors_occurred; the next call checks the connection.
            if isinstance(exc, OperationalError) and is_busy(exc):
                raise LaterBusy(str(exc)) from exc
            if isinstance(exc, OperationalError | InterfaceError) and (
                connection.connection is None or not connection.is_usable()
            ):
                self._generation += 1
                self._seen.generation = self._generation
            raise


class ThreadPool(ThreadPoolExecutor):
    """A thread pool that starts a thread only when every thread it has is busy.

    Python 3.12's ThreadPoolExecutor counts a thread idle only when it finds
    its queue empty, so a stream of short calls starts a thread for nearly
    every call, each keeping a Django connection (8 workers once held 256
    PostgreSQL connections). This pool counts the calls not yet finished.
    """

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._unfinished = 0
        self._count_lock = threading.Lock()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._count_lock:
            self._unfinished += 1
        return super().submit(self._counted, fn, *args, **kwargs)

    def _counted(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            with self._count_lock:
                self._unfinished -= 1

    def _adjust_thread_count(self) -> None:
        with self._count_lock:
            every_thread_busy = self._unfinished > len(self._threads)
        if every_thread_busy:
            # The base class would not start a thread while it holds an "idle"
            # credit, and credits pile up when it is not asked: every thread is
            # busy (some maybe hung in an abandoned handler), so drop them.
            while self._idle_semaphore.acquire(timeout=0):
                pass
            super()._adjust_thread_count()


def new_pool(name: str, size: int) -> ThreadPoolExecutor:
    return ThreadPool(max_workers=size, thread_name_prefix=f"later-{name}")


def call_sync(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in a handler thread with Django's per-request connection hygiene."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        return fn(*args)
    finally:
        close_old_connections()
