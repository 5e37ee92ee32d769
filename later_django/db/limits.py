"""Claims that keep limits across every server, and the reads of them.

A queue with a rate limit or a type with a concurrency key is claimed here,
in one transaction; a queue with neither never comes here (its claim is
the hot path's plain one, db/hot.py). The steps of a claim are written once, as a
generator of statements that a sync cursor (SQLite's inline session, a
Django cursor) or PostgreSQL's asyncio connection runs.
"""

from __future__ import annotations

import abc
import zlib
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import (
    ClaimRequest,
    LimitedClaim,
    LimitedClaimRequest,
    RateWindow,
    claimed_jobs,
)
from later_django.db.sql import Statement
from later_django.db.sql import counters as counters_sql
from later_django.db.sql import database as database_sql
from later_django.db.sql import limits as limits_sql
from later_django.db.statements import Operations
from later_django.limits import QueueLimits, RateLimit
from later_django.queue_names import column_value, lane_of

if TYPE_CHECKING:
    from psycopg import AsyncConnection

Step = tuple[str, Sequence[Any]]
ClaimSteps = Generator[Step, list[Any], LimitedClaim]

# A keyed claim reads up to this many candidates per job it may take: the
# jobs of one key beyond its free slots are passed over in the same claim.
SCAN_PER_JOB = 2


def keyed_lock_key(namespace: str) -> int:
    """The advisory lock that serialises ``namespace``'s keyed claims."""
    return zlib.crc32(f"later_keyed_claim:{namespace}".encode())


class LimitStore(Operations, abc.ABC):
    """Limited claims, and the reads of a limited queue's state."""

    # The statement that serialises a namespace's keyed claims, taken on its
    # own before the claim; None where one writer at a time does already.
    claim_lock: ClassVar[Statement | None] = None

    # -- the claim -------------------------------------------------------------------------
    @abc.abstractmethod
    def _claim_statement(
        self, request: ClaimRequest, *, keyed: bool, scan: int
    ) -> tuple[str, list[Any]]:
        """The vendor's claim of ``request`` and its parameters: the plain
        one, or, ``keyed``, the one that keeps concurrency keys, reading at
        most ``scan`` candidates (no job whose key is at its limit, nor more
        of a key than its free slots)."""

    def _claim_steps(self, request: LimitedClaimRequest) -> ClaimSteps:
        """The statements of a limited claim, each sent the rows of the one
        before; returns what the claim took.

        Keyed: the namespace's keyed claims are serialised (claim_lock),
        then the claim takes no job whose key is at its limit, nor more of a
        key than its free slots. Rate-limited: the queue's row is locked
        (written on first use) and its window moved on, if it ended, or
        widened to the claim's (limits_sql.RATE_WINDOW); the claim takes
        at most the starts ``rate`` leaves in it, which are then counted."""
        claim, limits = request.claim, request.limits
        if limits.keyed and self.claim_lock is not None:
            yield self._sql.bind(self.claim_lock, key=keyed_lock_key(claim.namespace))
        window: RateWindow | None = None
        rate = limits.rate
        limit = claim.limit
        if rate is not None:
            rows = yield self._rate_window(claim, rate)
            window = RateWindow(
                end_ms=int(rows[0][0]), started=int(rows[0][1]), now_ms=int(rows[0][2])
            )
            limit = min(limit, window.remaining(rate))
            if limit <= 0:
                return LimitedClaim(jobs=[], retry_in_ms=window.ends_in_ms())
        limited = ClaimRequest(
            namespace=claim.namespace,
            owner=claim.owner,
            limit=limit,
            lease_ms=claim.lease_ms,
            queue=claim.queue,
        )
        statement = self._claim_statement(limited, keyed=limits.keyed, scan=SCAN_PER_JOB * limit)
        jobs = claimed_jobs((yield statement))
        if rate is None or window is None:
            return LimitedClaim(jobs=jobs)
        if jobs:
            yield self._sql.bind(
                limits_sql.RATE_COUNT,
                started=len(jobs),
                namespace=claim.namespace,
                queue=claim.queue,
            )
        spent = window.started + len(jobs) >= rate.count
        return LimitedClaim(jobs=jobs, retry_in_ms=window.ends_in_ms() if spent else None)

    def _rate_window(self, claim: ClaimRequest, rate: RateLimit) -> Step:
        return self._sql.bind(
            limits_sql.RATE_WINDOW,
            namespace=claim.namespace,
            queue=claim.queue,
            window_ms=rate.window_ms,
        )

    def claim_limited(self, cursor: CursorWrapper, request: LimitedClaimRequest) -> LimitedClaim:
        """Claim as ``request`` says, keeping its queue's limits. Run in one
        transaction (it holds the locks that make the limits exact)."""
        steps = self._claim_steps(request)
        rows: Any = None
        try:
            while True:
                sql, params = steps.send(rows)
                cursor.execute(sql, params)
                rows = cursor.fetchall()
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]  # the generator's LimitedClaim

    async def aclaim_limited(
        self, conn: AsyncConnection[Any], request: LimitedClaimRequest, *, prepare: bool
    ) -> LimitedClaim:
        """(supports_async_connection) claim_limited on the worker's asyncio
        connection, in a transaction of its own; ``prepare``: whether its
        statements are prepared on the server (LATER["PREPARED_STATEMENTS"],
        read by the caller)."""
        raise NotImplementedError(f"{type(self).__name__} has no asyncio connection")

    # -- reads -----------------------------------------------------------------------------
    def keyed_ready_exists(self, cursor: CursorWrapper, *, namespace: str, queue: str) -> bool:
        """Is one of the first ready jobs of keyed ``queue`` below its key's
        limit (its queue not paused)? A read: takes no write lock."""
        self._run(
            cursor,
            limits_sql.KEYED_READY_EXISTS,
            namespace=namespace,
            queue_column=column_value(queue),
            queue=queue,
        )
        return cursor.fetchone() is not None

    def _keyed_held(self, cursor: CursorWrapper, *, namespace: str, queue: str) -> int:
        """Ready jobs of ``queue`` whose key is at its limit now."""
        self._run(
            cursor, limits_sql.KEYED_HELD, namespace=namespace, queue_column=column_value(queue)
        )
        return int(cursor.fetchone()[0])

    def held(
        self, cursor: CursorWrapper, *, namespace: str, limits: Mapping[str, QueueLimits]
    ) -> dict[str, int]:
        """The ready jobs of each queue of ``limits`` that a limit holds
        back now: every one (from the counters) of a queue whose rate limit
        is spent in the row's window, which has not ended, else those whose
        key is at its limit. A paused queue holds none back: nothing of it
        is due to run."""
        windows: dict[str, tuple[int, int]] = {}
        now_ms = 0
        if any(found.rate is not None for found in limits.values()):
            windows = self._rate_windows(cursor, namespace=namespace)
            self._run(cursor, database_sql.CLOCK_NOW)
            now_ms = int(cursor.fetchone()[0])
        held = {}
        for name, found in limits.items():
            rate = found.rate
            window = windows.get(name)
            if rate is not None and window is not None:
                end, started = window
                if now_ms < end and started >= rate.count:
                    held[name] = self._ready(cursor, namespace=namespace, queue=name)
                    continue
            held[name] = (
                self._keyed_held(cursor, namespace=namespace, queue=name) if found.keyed else 0
            )
        return held

    def _ready(self, cursor: CursorWrapper, *, namespace: str, queue: str) -> int:
        self._run(
            cursor, counters_sql.QUEUE_READY, namespace=namespace, lane=lane_of(queue), queue=queue
        )
        return int(cursor.fetchone()[0])

    def _rate_windows(self, cursor: CursorWrapper, *, namespace: str) -> dict[str, tuple[int, int]]:
        """Each queue's last rate window, by name: (its end, the starts
        counted in it)."""
        self._run(cursor, limits_sql.RATE_WINDOWS, namespace=namespace)
        return {str(name): (int(start), int(started)) for name, start, started in cursor.fetchall()}
