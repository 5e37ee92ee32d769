"""The async facade over the dialect: the only way worker code reaches the database.

Each call hops to a thread of a pool the caller names (Django connections are
per thread), heals a connection broken by a database restart, and turns
"database is locked" and serialization failures into LaterBusy.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.backends.utils import CursorWrapper

from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.exceptions import LaterBusy

logger = logging.getLogger(__name__)
T = TypeVar("T")

_BUSY_MARKERS = ("database is locked", "could not serialize", "deadlock detected")


class Store:
    """Runs dialect operations on the LATER database from asyncio code."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.dialect: Dialect = dialect_for(alias)

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

    def _run_in_thread(self, op: Callable[[Dialect, CursorWrapper], T], atomic: bool) -> T:
        connection = connections[self.alias]
        if connection.connection is not None and connection.errors_occurred:
            # A database restart or a killed backend leaves a dead connection
            # behind; drop it so this call reconnects instead of failing forever.
            if not connection.is_usable():
                connection.close()
            connection.errors_occurred = False
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
            raise


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
