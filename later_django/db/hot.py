"""The worker's hot path (``dialect.hot``): its claims and batch completions
of plain jobs, and its other writes under the fence of a claim — renewal,
give-back, retry, snooze, failure, a requested cancel — with the reads it
makes between them (ready work, a claim's fate, a job's trace context) and
the Django Tasks backend's results written with an outcome.

The claim and the batch completion differ per vendor and are abstract;
they also run on an asyncio connection where the dialect declares
supports_async_connection (db/sessions.py). The rescuer of stuck jobs
(maintenance) stores its retries and failures through the same fenced
writes, with a fence of an expired lease.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db.backends.utils import CursorWrapper

from later_django.db.descendants import fail_descendants
from later_django.db.rows import (
    ClaimRequest,
    Completion,
    FailureWrite,
    Fence,
    LeftAs,
    OwnerFence,
    RetryWrite,
    SuccessBatch,
    TaskAttemptEnd,
    claimed_jobs,
)
from later_django.db.sql import hot as hot_sql
from later_django.db.statements import Operations
from later_django.queue_names import DEFAULT_QUEUE, column_value
from later_django.states import PARENT_CANCELLED
from later_django.types import Claim, ClaimedJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor


class HotStore(Operations, abc.ABC):
    """What a worker does to the jobs it claims."""

    # -- claims and completions ------------------------------------------------------------
    def claim(self, cursor: CursorWrapper, request: ClaimRequest) -> list[ClaimedJob]:
        """Mark up to ``request.limit`` ready jobs running, leased to its
        owner, best first; return them."""
        cursor.execute(*self._claim_statement(request))
        return claimed_jobs(cursor.fetchall())

    @abc.abstractmethod
    def _claim_statement(self, request: ClaimRequest) -> tuple[str, list[Any]]:
        """The vendor's claim of ``request``, bound: its text and values."""

    @abc.abstractmethod
    def complete_many(self, cursor: CursorWrapper, batch: SuccessBatch) -> Completion:
        """Mark each claim of ``jobs`` that ``owner`` still holds as succeeded
        and release their waiting continuations; write the ``results`` of
        those that are task jobs. Run in one transaction."""

    async def aclaim(
        self, cursor: AsyncCursor[Any], request: ClaimRequest, *, prepare: bool
    ) -> list[ClaimedJob]:
        """(supports_async_connection) claim on the worker's asyncio
        connection, in autocommit; ``prepare``: whether the statement is
        prepared on the server (LATER["PREPARED_STATEMENTS"], read by the
        caller)."""
        raise NotImplementedError(f"{type(self).__name__} has no asyncio connection")

    async def acomplete_many(
        self, conn: AsyncConnection[Any], batch: SuccessBatch, *, prepare: bool
    ) -> Completion:
        """(supports_async_connection) complete_many on the worker's
        asyncio connection, in autocommit: one statement; ``prepare`` as
        aclaim's."""
        raise NotImplementedError(f"{type(self).__name__} has no asyncio connection")

    # -- the worker's other writes, under the fence of a claim -----------------------------
    def renew(
        self, cursor: CursorWrapper, *, owner: str, jobs: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[Claim]:
        """Extend the leases ``owner`` holds on the claims ``jobs`` to the
        database's now plus ``lease_ms``; return the claims it still holds."""
        if not jobs:
            return []
        self._run(
            cursor,
            hot_sql.RENEW,
            lease_ms=lease_ms,
            job_ids=[job_id for job_id, _ in jobs],
            claims=[tuple(claim) for claim in jobs],
            owner=owner,
        )
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def claimed_since(
        self, cursor: CursorWrapper, request: ClaimRequest, *, within_ms: int
    ) -> list[Claim]:
        """The claims of plain jobs that claims like ``request`` (its owner,
        namespace and queue) made in the last ``within_ms`` (by the
        database's clock) and that are still running."""
        self._run(
            cursor,
            hot_sql.CLAIMED_SINCE,
            namespace=request.namespace,
            owner=request.owner,
            queue_column=column_value(request.queue),
            within_ms=within_ms,
        )
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def stage_after(self, cursor: CursorWrapper, claim: tuple[str, int]) -> LeftAs | None:
        """Where ``claim`` left its job (None while it runs, or when a later
        claim took the job or it is gone): read when a store of its outcome
        may have committed unseen."""
        job_id, attempts = claim
        self._run(cursor, hot_sql.STAGE_AFTER, job_id=job_id, attempts=attempts)
        row = cursor.fetchone()
        return None if row is None else LeftAs(stage=str(row[0]), last_error=row[1])

    def unclaim(self, cursor: CursorWrapper, fence: OwnerFence) -> bool:
        """Give back a claim whose handler never ran or was stopped by its
        own worker: ready again, the claim not counted as an attempt
        (``uncounted`` goes up; ``attempts``, the fence, keeps it); return
        whether the fence held. A job cancel() asked to stop is not given
        back: its lease runs out and the stuck-job rescue cancels it."""
        self._run(
            cursor,
            hot_sql.UNCLAIM,
            job_id=fence.job_id,
            attempts=fence.attempts,
            owner=fence.owner,
        )
        return bool(cursor.rowcount == 1)

    def retry(self, cursor: CursorWrapper, fence: Fence, retry: RetryWrite) -> bool:
        """Move the fenced claim to requeued, due ``retry.delay_ms`` after the
        database's now; return whether it did: not if the fence broke or a
        cancel was requested."""
        if isinstance(fence, OwnerFence):
            self._run(
                cursor,
                hot_sql.RETRY_OWNED,
                delay_ms=retry.delay_ms,
                error=retry.error,
                retry_policy=retry.retry_policy,
                job_id=fence.job_id,
                owner=fence.owner,
                attempts=fence.attempts,
            )
        else:
            self._run(
                cursor,
                hot_sql.RETRY_EXPIRED,
                delay_ms=retry.delay_ms,
                error=retry.error,
                retry_policy=retry.retry_policy,
                job_id=fence.job_id,
                expired_for_ms=fence.expired_for_ms,
                attempts=fence.attempts,
            )
        return bool(cursor.rowcount == 1)

    def snooze(self, cursor: CursorWrapper, fence: OwnerFence, delay_ms: int) -> bool:
        """Move ``fence``'s claim back to delayed, due ``delay_ms`` after the
        database's now, the claim not counted as an attempt; return whether
        the fence held."""
        self._run(
            cursor,
            hot_sql.SNOOZE,
            delay_ms=delay_ms,
            job_id=fence.job_id,
            owner=fence.owner,
            attempts=fence.attempts,
        )
        return bool(cursor.rowcount == 1)

    def fail(self, cursor: CursorWrapper, fence: Fence, failure: FailureWrite) -> bool:
        """Fail the fenced claim and its waiting descendants; return whether
        it did: not if the fence broke or a cancel was requested (then
        cancel_running ends it). Run in one transaction."""
        if isinstance(fence, OwnerFence):
            self._run(
                cursor,
                hot_sql.FAIL_OWNED,
                retention_ms=failure.retention_ms,
                error=failure.error,
                job_id=fence.job_id,
                owner=fence.owner,
                attempts=fence.attempts,
            )
        else:
            self._run(
                cursor,
                hot_sql.FAIL_EXPIRED,
                retention_ms=failure.retention_ms,
                error=failure.error,
                job_id=fence.job_id,
                expired_for_ms=fence.expired_for_ms,
                attempts=fence.attempts,
            )
        if cursor.rowcount != 1:
            return False
        fail_descendants(self._sql, cursor, job_id=fence.job_id, retention_ms=failure.retention_ms)
        return True

    # -- cancelling a running job ----------------------------------------------------------
    def cancel_requested(self, cursor: CursorWrapper, *, namespace: str, owner: str) -> list[Claim]:
        """The claims ``owner`` runs whose cancel was requested."""
        self._run(cursor, hot_sql.CANCEL_REQUESTED, namespace=namespace, owner=owner)
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def cancel_running(self, cursor: CursorWrapper, fence: Fence, retention_ms: int) -> bool:
        """End the fenced claim of a job whose cancel was requested as
        cancelled, and fail its waiting descendants as "parent cancelled";
        return whether it was (the fence held and a cancel was requested).
        Run in one transaction."""
        if isinstance(fence, OwnerFence):
            self._run(
                cursor,
                hot_sql.CANCEL_RUNNING_OWNED,
                retention_ms=retention_ms,
                job_id=fence.job_id,
                owner=fence.owner,
                attempts=fence.attempts,
            )
        else:
            self._run(
                cursor,
                hot_sql.CANCEL_RUNNING_EXPIRED,
                retention_ms=retention_ms,
                job_id=fence.job_id,
                expired_for_ms=fence.expired_for_ms,
                attempts=fence.attempts,
            )
        if cursor.rowcount != 1:
            return False
        fail_descendants(
            self._sql,
            cursor,
            job_id=fence.job_id,
            retention_ms=retention_ms,
            error=PARENT_CANCELLED,
        )
        return True

    # -- reads between claims --------------------------------------------------------------
    def ready_exists(
        self, cursor: CursorWrapper, *, namespace: str, queue: str = DEFAULT_QUEUE
    ) -> bool:
        """Is any job of ``namespace`` in ``queue`` ready to claim, the queue
        not paused? A read: takes no write lock."""
        self._run(
            cursor,
            hot_sql.READY_EXISTS,
            namespace=namespace,
            queue_column=column_value(queue),
            queue=queue,
        )
        return cursor.fetchone() is not None

    def trace_context(self, cursor: CursorWrapper, *, job_id: str) -> str | None:
        """The enqueuing span's context recorded on ``job_id``, if any
        (LATER["TRACING"] only)."""
        self._run(cursor, hot_sql.TRACE_CONTEXT, job_id=job_id)
        row = cursor.fetchone()
        return None if row is None else row[0]

    # -- what is written with an outcome ---------------------------------------------------
    def task_results_write(
        self, cursor: CursorWrapper, *, owner: str, ends: Sequence[TaskAttemptEnd]
    ) -> None:
        """Write the ends of attempts of task jobs whose outcomes ``owner``
        just stored, fenced, in this transaction."""
        if ends:
            rows = [dict(zip(TASK_RESULT_COLUMNS, end.row(owner), strict=True)) for end in ends]
            cursor.executemany(*self._sql.many(hot_sql.TASK_RESULT_WRITE, rows))


# later_task_result's columns, in the order of TaskAttemptEnd.row().
TASK_RESULT_COLUMNS = ("job_id", "worker_ids", "errors", "return_value")
