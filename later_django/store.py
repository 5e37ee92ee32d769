"""The async facade over the dialect: the only way worker code reaches the database.

Each call hops to a thread of a pool the caller names (Django connections are
per thread), heals a connection broken by a database restart, and turns
"database is locked" and serialization failures into LaterBusy.

The statements every job goes through (claim, completion) take a shorter
road where the dialect allows: an asyncio connection of the worker's own,
in the event loop, with prepared statements (HotPath).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.clock import now_ms
from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.exceptions import LaterBusy
from later_django.types import ClaimedJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor

logger = logging.getLogger(__name__)
T = TypeVar("T")

_BUSY_MARKERS = ("database is locked", "could not serialize", "deadlock detected")


class Store:
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
            if isinstance(exc, OperationalError) and _is_busy(exc):
                raise LaterBusy(str(exc)) from exc
            if isinstance(exc, OperationalError | InterfaceError) and (
                connection.connection is None or not connection.is_usable()
            ):
                self._generation += 1
                self._seen.generation = self._generation
            raise


class AsyncSession:
    """One asyncio psycopg connection of the event loop, opened on first use.

    Any error, or a cancelled call, closes it: the next call reconnects, so a
    database restart or an abandoned hung statement heals without a thread."""

    def __init__(self, alias: str, dialect: Dialect) -> None:
        self.alias = alias
        self.dialect = dialect
        self._conn: AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def run(self, op: Callable[[Dialect, AsyncCursor[Any]], Awaitable[T]]) -> T:
        async with self._lock:
            conn = self._conn or await self._connect()
            try:
                # A plain AsyncCursor binds on the server, so statements can be prepared.
                async with conn.cursor() as cursor:
                    return await op(self.dialect, cursor)
            except BaseException:
                self._conn = None
                await _close_quietly(conn)
                raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await _close_quietly(conn)

    async def _connect(self) -> AsyncConnection[Any]:
        import psycopg

        from later_django.db.postgresql import connect_kwargs

        self._conn = await psycopg.AsyncConnection.connect(
            autocommit=True, **connect_kwargs(self.alias)
        )
        return self._conn


async def _close_quietly(conn: AsyncConnection[Any]) -> None:
    # Already broken: nothing left to release.
    with contextlib.suppress(Exception):
        await conn.close()


class HotPath:
    """Where a server's claims, or its completions, run.

    On an AsyncSession of their own where the dialect supports it (no thread
    hop, statements planned once), else in a thread of ``pool``. Each read of
    the clock happens just before its statement: read earlier, a claim could
    record a start before its parent's finish."""

    def __init__(self, store: Store, pool: ThreadPoolExecutor) -> None:
        self.store = store
        self.pool = pool
        dialect = store.dialect
        self.session = (
            AsyncSession(store.alias, dialect) if dialect.supports_async_connection else None
        )

    async def claim(
        self, *, namespace: str, owner: str, limit: int, lease_ms: int
    ) -> list[ClaimedJob]:
        def args() -> dict[str, Any]:
            now = now_ms()
            return {
                "namespace": namespace,
                "owner": owner,
                "limit": limit,
                "now_ms": now,
                "lease_until_ms": now + lease_ms,
            }

        if self.session is not None:
            return await self.session.run(lambda d, c: d.ajob_claim(c, **args()))
        return await self.store.run(self.pool, lambda d, c: d.job_claim(c, **args()))

    async def complete_many(
        self, *, owner: str, jobs: Sequence[tuple[str, int]], retention_ms: int
    ) -> tuple[list[str], int]:
        """Store the successes of ``jobs`` (id, attempts) that ``owner`` still
        holds; return the ids stored and how many continuations became ready."""

        def args() -> dict[str, Any]:
            now = now_ms()
            return {"owner": owner, "jobs": jobs, "now_ms": now, "expires_ms": now + retention_ms}

        if self.session is not None:
            return await self.session.run(lambda d, c: d.ajob_complete_many(c, **args()))
        single = self.store.dialect.atomic_complete_many
        return await self.store.run(
            self.pool, lambda d, c: d.job_complete_many(c, **args()), atomic=not single
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def _is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _BUSY_MARKERS)


def new_pool(name: str, size: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"later-{name}")


def call_sync(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in a handler thread with Django's per-request connection hygiene."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        return fn(*args)
    finally:
        close_old_connections()
