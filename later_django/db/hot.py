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
)
from later_django.db.sql import jobs as jobs_sql
from later_django.db.sql import tasks as tasks_sql
from later_django.db.statements import Operations, ids, pairs
from later_django.queue_names import DEFAULT_QUEUE, column_value
from later_django.states import PARENT_CANCELLED
from later_django.types import Claim, ClaimedJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor


class HotStore(Operations, abc.ABC):
    """What a worker does to the jobs it claims."""

    # -- claims and completions ------------------------------------------------------------
    @abc.abstractmethod
    def claim(self, cursor: CursorWrapper, request: ClaimRequest) -> list[ClaimedJob]:
        """Mark up to ``request.limit`` ready jobs running, leased to its
        owner, best first; return them."""

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
        sql = self._sql(jobs_sql.JOB_RENEW_SQL, ids=ids(len(jobs)), pairs=pairs(len(jobs)))
        cursor.execute(sql, [lease_ms, *claims_params(jobs), owner])
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def claimed_since(
        self, cursor: CursorWrapper, request: ClaimRequest, *, within_ms: int
    ) -> list[Claim]:
        """The claims of plain jobs that claims like ``request`` (its owner,
        namespace and queue) made in the last ``within_ms`` (by the
        database's clock) and that are still running."""
        queue = column_value(request.queue)
        params: list[Any] = [request.namespace, request.owner, queue, within_ms]
        cursor.execute(self._sql(jobs_sql.JOB_CLAIMED_SINCE_SQL), params)
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def stage_after(self, cursor: CursorWrapper, claim: tuple[str, int]) -> LeftAs | None:
        """Where ``claim`` left its job (None while it runs, or when a later
        claim took the job or it is gone): read when a store of its outcome
        may have committed unseen."""
        cursor.execute(self._sql(jobs_sql.JOB_STAGE_AFTER_SQL), list(claim))
        row = cursor.fetchone()
        return None if row is None else LeftAs(stage=str(row[0]), last_error=row[1])

    def unclaim(self, cursor: CursorWrapper, fence: OwnerFence) -> bool:
        """Give back a claim whose handler never ran or was stopped by its
        own worker: ready again, the claim not counted as an attempt
        (``uncounted`` goes up; ``attempts``, the fence, keeps it); return
        whether the fence held. A job cancel() asked to stop is not given
        back: its lease runs out and the stuck-job rescue cancels it."""
        cursor.execute(
            self._sql(jobs_sql.JOB_UNCLAIM_SQL), [fence.job_id, fence.attempts, fence.owner]
        )
        return bool(cursor.rowcount == 1)

    def retry(self, cursor: CursorWrapper, fence: Fence, retry: RetryWrite) -> bool:
        """Move the fenced claim to requeued, due ``retry.delay_ms`` after the
        database's now; return whether it did: not if the fence broke or a
        cancel was requested."""
        sql, by = self._fenced(fence, jobs_sql.JOB_RETRY_OWNED_SQL, jobs_sql.JOB_RETRY_EXPIRED_SQL)
        cursor.execute(
            sql,
            [retry.delay_ms, retry.error, retry.retry_policy, fence.job_id, by, fence.attempts],
        )
        return bool(cursor.rowcount == 1)

    def snooze(self, cursor: CursorWrapper, fence: OwnerFence, delay_ms: int) -> bool:
        """Move ``fence``'s claim back to delayed, due ``delay_ms`` after the
        database's now, the claim not counted as an attempt; return whether
        the fence held."""
        cursor.execute(
            self._sql(jobs_sql.JOB_SNOOZE_SQL),
            [delay_ms, fence.job_id, fence.owner, fence.attempts],
        )
        return bool(cursor.rowcount == 1)

    def fail(self, cursor: CursorWrapper, fence: Fence, failure: FailureWrite) -> bool:
        """Fail the fenced claim and its waiting descendants; return whether
        it did: not if the fence broke or a cancel was requested (then
        cancel_running ends it). Run in one transaction."""
        sql, by = self._fenced(fence, jobs_sql.JOB_FAIL_OWNED_SQL, jobs_sql.JOB_FAIL_EXPIRED_SQL)
        cursor.execute(sql, [failure.retention_ms, failure.error, fence.job_id, by, fence.attempts])
        if cursor.rowcount != 1:
            return False
        fail_descendants(self._sql, cursor, job_id=fence.job_id, retention_ms=failure.retention_ms)
        return True

    def _fenced(self, fence: Fence, owned: str, expired: str) -> tuple[str, str | int]:
        """The statement of ``fence``'s kind, and the value it compares."""
        if isinstance(fence, OwnerFence):
            return self._sql(owned), fence.owner
        return self._sql(expired), fence.expired_for_ms

    # -- cancelling a running job ----------------------------------------------------------
    def cancel_requested(self, cursor: CursorWrapper, *, namespace: str, owner: str) -> list[Claim]:
        """The claims ``owner`` runs whose cancel was requested."""
        cursor.execute(self._sql(jobs_sql.JOB_CANCEL_REQUESTED_SQL), [namespace, owner])
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def cancel_running(self, cursor: CursorWrapper, fence: Fence, retention_ms: int) -> bool:
        """End the fenced claim of a job whose cancel was requested as
        cancelled, and fail its waiting descendants as "parent cancelled";
        return whether it was (the fence held and a cancel was requested).
        Run in one transaction."""
        sql, by = self._fenced(
            fence, jobs_sql.JOB_CANCEL_RUNNING_OWNED_SQL, jobs_sql.JOB_CANCEL_RUNNING_EXPIRED_SQL
        )
        cursor.execute(sql, [retention_ms, fence.job_id, by, fence.attempts])
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
        request = ClaimRequest(namespace=namespace, owner="", limit=0, lease_ms=0, queue=queue)
        cursor.execute(self._sql(jobs_sql.JOB_READY_EXISTS_SQL), queue_filter_params(request))
        return cursor.fetchone() is not None

    def trace_context(self, cursor: CursorWrapper, *, job_id: str) -> str | None:
        """The enqueuing span's context recorded on ``job_id``, if any
        (LATER["TRACING"] only)."""
        cursor.execute(self._sql(jobs_sql.JOB_TRACE_CONTEXT_SQL), [job_id])
        row = cursor.fetchone()
        return None if row is None else row[0]

    # -- what is written with an outcome ---------------------------------------------------
    def task_results_write(
        self, cursor: CursorWrapper, *, owner: str, ends: Sequence[TaskAttemptEnd]
    ) -> None:
        """Write the ends of attempts of task jobs whose outcomes ``owner``
        just stored, fenced, in this transaction."""
        if ends:
            sql = self._sql(tasks_sql.TASK_RESULT_WRITE_SQL)
            cursor.executemany(sql, [end.row(owner) for end in ends])


def queue_filter_params(request: ClaimRequest) -> list[Any]:
    """The parameters of a claim's filter: the namespace and the queue's
    column value (IN_QUEUE), then its row of later_queue (QUEUE_RUNS)."""
    return [request.namespace, column_value(request.queue), request.namespace, request.queue]


def claims_params(jobs: Sequence[tuple[str, int]]) -> list[Any]:
    """The parameters of {ids} then {pairs} for the claims ``jobs``."""
    params: list[Any] = [job_id for job_id, _ in jobs]
    for job_id, attempts in jobs:
        params += [job_id, attempts]
    return params
