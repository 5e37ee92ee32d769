"""The worker's own database sessions: claims and completions on connections of their own.

A worker server runs them from its event loop without a thread hop:
PostgreSQL on an asyncio psycopg connection with prepared statements,
SQLite inline on a sqlite3 connection that never waits for the write lock
inside a call (it fails fast and the session retries after an asyncio
sleep, so the loop never blocks on another process's lock).

Every other write (failures, retries, renewals, maintenance) goes through
ThreadedStore and Django's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections

from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.db.errors import is_sqlite_locked
from later_django.db.past_django import qmark
from later_django.db.rows import (
    ClaimRequest,
    Completion,
    HeadsStored,
    HeadSuccesses,
    LimitedClaim,
    LimitedClaimRequest,
    PartitionClaim,
    PartitionClaimRequest,
    PartitionHead,
    SuccessBatch,
    TaskAttemptEnd,
)
from later_django.exceptions import LaterBusy, LaterError
from later_django.types import ClaimedJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection

T = TypeVar("T")

SQLITE_RETRY_FIRST = 0.0005  # seconds before the first retry of a locked SQLite write
SQLITE_RETRY_MAX = 0.02  # cap, in seconds, between retries
SQLITE_DEFAULT_TIMEOUT = 20.0  # seconds of retries when OPTIONS sets no timeout
CANCEL_TIMEOUT = 2.0  # seconds to ask the server to cancel a running statement


class SessionClosed(LaterError):
    """The server closed this session at shutdown; it never reconnects."""


class PostgresSession:
    """One asyncio psycopg connection of the event loop, opened on first use.

    Any error, or a cancelled call, closes it: the next call reconnects, so a
    database restart or an abandoned hung statement heals without a thread.
    Once close() ran, calls raise SessionClosed instead of reconnecting."""

    def __init__(self, alias: str, dialect: Dialect, *, prepare: bool) -> None:
        self.alias = alias
        self.dialect = dialect
        # Whether the statements run here are prepared on the server.
        self.prepare = prepare
        self._conn: AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self.closed = False

    async def run(self, op: Callable[[Dialect, AsyncConnection[Any]], Awaitable[T]]) -> T:
        async with self._lock:
            if self.closed:
                raise SessionClosed
            conn = self._conn or await self._connect()
            try:
                return await op(self.dialect, conn)
            except BaseException as exc:
                self._conn = None
                if isinstance(exc, asyncio.CancelledError):
                    # Abandoned (a hung call): cancel the statement on the
                    # server, or it could still commit after the close.
                    await _cancel_statement(conn)
                await _close_quietly(conn)
                raise

    async def close(self) -> None:
        """Close for good. A statement still running is cancelled on the
        server first: closing the socket alone would let it commit later."""
        self.closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._lock.locked():
                await _cancel_statement(conn)
            await _close_quietly(conn)

    async def _connect(self) -> AsyncConnection[Any]:
        import psycopg

        from later_django.db.postgresql import connect_kwargs

        self._conn = await psycopg.AsyncConnection.connect(
            autocommit=True, **connect_kwargs(self.alias)
        )
        return self._conn


async def _cancel_statement(conn: AsyncConnection[Any]) -> None:
    """Ask the server to cancel the statement ``conn`` runs, if it runs one."""
    from psycopg import pq

    if conn.pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.cancel_safe(), CANCEL_TIMEOUT)


async def _close_quietly(conn: AsyncConnection[Any]) -> None:
    # Already broken: nothing left to release.
    with contextlib.suppress(Exception):
        await conn.close()


class SqliteSession:
    """One sqlite3 connection used inline from the event loop.

    Its busy timeout is zero: a call that finds the write lock taken fails at
    once and is retried after a short asyncio sleep, up to the database's
    OPTIONS["timeout"], so the loop never blocks on another writer."""

    def __init__(self, alias: str, dialect: Dialect) -> None:
        self.alias = alias
        self.dialect = dialect
        self._conn: sqlite3.Connection | None = None
        options = connections[alias].settings_dict.get("OPTIONS", {})
        self.timeout = float(options.get("timeout", SQLITE_DEFAULT_TIMEOUT))
        self.closed = False

    async def run(self, op: Callable[[Dialect, Any], T], *, atomic: bool = False) -> T:
        deadline = time.monotonic() + self.timeout
        delay = SQLITE_RETRY_FIRST
        while True:
            if self.closed:
                raise SessionClosed
            try:
                return self._run_once(op, atomic)
            except sqlite3.OperationalError as exc:
                if not is_sqlite_locked(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise LaterBusy(str(exc)) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, SQLITE_RETRY_MAX)

    def _run_once(self, op: Callable[[Dialect, Any], T], atomic: bool) -> T:
        conn = self._conn or self._connect()
        cursor = _QmarkCursor(conn.cursor())
        try:
            if not atomic:
                return op(self.dialect, cursor)
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = op(self.dialect, cursor)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result
        except sqlite3.Error as exc:
            if not is_sqlite_locked(exc):
                self._discard()  # a broken connection: the next call opens a new one
            raise
        finally:
            cursor.close()

    async def close(self) -> None:
        self.closed = True
        self._discard()

    def _connect(self) -> sqlite3.Connection:
        settings = connections[self.alias].settings_dict
        options = settings.get("OPTIONS", {})
        conn = sqlite3.connect(
            settings["NAME"], timeout=0, isolation_level=None, check_same_thread=False, uri=True
        )
        for command in str(options.get("init_command", "")).split(";"):
            if command.strip():
                conn.execute(command)
        self._conn = conn
        return conn

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()


class _QmarkCursor:
    """A sqlite3 cursor taking the %s placeholders later's SQL is written in."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _QmarkCursor:
        self._cursor.execute(qmark(sql), params)
        return self

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> _QmarkCursor:
        self._cursor.executemany(qmark(sql), rows)
        return self

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def close(self) -> None:
        self._cursor.close()


class WorkerSessions:
    """Where a server's claims, or its completions, run (one connection each).

    Times are the database's: each statement reads its clock when it runs.
    ``prepare``: whether the statements of an asyncio connection are
    prepared on the server (the server's LATER["PREPARED_STATEMENTS"], read
    when it builds its sessions: db/ reads no settings)."""

    def __init__(self, alias: str, *, prepare: bool) -> None:
        dialect = dialect_for(alias)
        self.dialect = dialect
        self.postgres = (
            PostgresSession(alias, dialect, prepare=prepare)
            if dialect.supports_async_connection
            else None
        )
        self.sqlite = SqliteSession(alias, dialect) if self.postgres is None else None

    async def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        """Claim the ready jobs ``request`` asks for."""
        if (pg := self.postgres) is not None:
            prepare = pg.prepare

            async def claim(d: Dialect, conn: AsyncConnection[Any]) -> list[ClaimedJob]:
                # A plain AsyncCursor binds on the server, so statements can be prepared.
                async with conn.cursor() as cursor:
                    return await d.hot.aclaim(cursor, request, prepare=prepare)

            return await pg.run(claim)
        assert self.sqlite is not None
        return await self.sqlite.run(lambda d, c: d.hot.claim(c, request))

    async def claim_limited(self, request: LimitedClaimRequest) -> LimitedClaim:
        """Claim what ``request`` asks for on a queue with limits, in a
        transaction of its own (db/limits.py)."""
        if (pg := self.postgres) is not None:
            return await pg.run(
                lambda d, conn: d.limits.aclaim_limited(conn, request, prepare=pg.prepare)
            )
        assert self.sqlite is not None
        # A keyed claim is one statement; a rate-limited one reads and counts
        # the window around its claim, under one write lock.
        return await self.sqlite.run(
            lambda d, c: d.limits.claim_limited(c, request),
            atomic=request.limits.rate is not None,
        )

    async def complete_many(
        self,
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        retention_ms: int,
        results: Sequence[TaskAttemptEnd] = (),
    ) -> Completion:
        """Store the successes of the claims ``jobs`` (id, attempt) that
        ``owner`` still holds, and the ``results`` of those that are task jobs."""
        batch = SuccessBatch(owner=owner, jobs=jobs, retention_ms=retention_ms, results=results)
        if (pg := self.postgres) is not None:
            return await pg.run(
                lambda d, conn: d.hot.acomplete_many(conn, batch, prepare=pg.prepare)
            )
        assert self.sqlite is not None
        return await self.sqlite.run(lambda d, c: d.hot.complete_many(c, batch), atomic=True)

    # -- partition heads (worker/partitions.py) -----------------------------------------
    async def partition_heads(self, *, namespace: str) -> list[PartitionHead]:
        """Every partition of ``namespace`` that has had a job, with its head."""
        if (pg := self.postgres) is not None:
            return await pg.run(
                lambda d, conn: d.partitions.apartition_heads(
                    conn, namespace=namespace, prepare=pg.prepare
                )
            )
        assert self.sqlite is not None
        return await self.sqlite.run(
            lambda d, c: d.partitions.partition_heads(c, namespace=namespace)
        )

    async def partition_claim(self, request: PartitionClaimRequest) -> PartitionClaim | None:
        """Take or keep a partition's lease and claim its ready head."""
        if (pg := self.postgres) is not None:
            return await pg.run(
                lambda d, conn: d.partitions.apartition_claim(conn, request, prepare=pg.prepare)
            )
        assert self.sqlite is not None
        return await self.sqlite.run(
            lambda d, c: d.partitions.partition_claim(c, request), atomic=True
        )

    async def partition_complete_many(self, batch: HeadSuccesses) -> HeadsStored:
        """Store partition heads' successes behind their claims and their
        partitions' fences, claiming the next heads ``batch.chain`` asks for."""
        if (pg := self.postgres) is not None:
            return await pg.run(
                lambda d, conn: d.partitions.apartition_complete_many(
                    conn, batch, prepare=pg.prepare
                )
            )
        assert self.sqlite is not None
        return await self.sqlite.run(
            lambda d, c: d.partitions.partition_complete_many(c, batch), atomic=True
        )

    async def close(self) -> None:
        for session in (self.postgres, self.sqlite):
            if session is not None:
                await session.close()
