"""The job engine: every operation on ``later_job`` rows — enqueue, the
worker's claims and its writes under the fence of a claim, the rescue and
maintenance of jobs, an operator's actions — and what is written with them
(the Django Tasks backend's results, the stage counters' folding).

Shared statements run here, once, for both vendors; the inserts, the claim,
the batch completion and the counters' folding differ per vendor and are
abstract. The claim and the completion also run on an asyncio connection
where the dialect declares supports_async_connection.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

from django.db import IntegrityError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.rows import (
    ClaimRequest,
    Completion,
    ExtraColumns,
    FailureWrite,
    FanInInsert,
    FanInResolution,
    Fence,
    LeftAs,
    Orphan,
    OwnerFence,
    RetryWrite,
    StuckJob,
    SuccessBatch,
    TaskAttemptEnd,
)
from later_django.db.sql import fan_in as fan_in_sql
from later_django.db.sql import jobs as jobs_sql
from later_django.db.sql import tasks as tasks_sql
from later_django.db.statements import Operations, ids, pairs
from later_django.exceptions import LaterBusy
from later_django.queue_names import DEFAULT_QUEUE, column_value
from later_django.states import PARENT_CANCELLED, PARENT_FAILED, PARENT_MISSING, TERMINAL, Stage
from later_django.types import Claim, ClaimedJob, NewJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor

Settled = Literal["released", "failed", "waiting"]
# How often a unique enqueue tries again when the key it found taken was
# freed before it could read the holder: each time another enqueue took it
# meanwhile, so more than a few means a key churned by many at once.
UNIQUE_TRIES = 5
# How often cancel() looks at a job that moved between running and waiting
# to run while it looked: each look needs the job to move again in between.
CANCEL_LOOKS = 5


class Inserted(NamedTuple):
    """What a unique enqueue found: the id of the job holding the key, and
    its stage if this enqueue wrote it (None: a duplicate, nothing written)."""

    job_id: str
    stage: str | None


# Ids per statement when tracing marks a bulk enqueue's jobs.
TRACE_BATCH = 500
# (child, parent) rows per statement of a fan-in child's parent list.
FAN_IN_BATCH = 500


class JobEngine(Operations, abc.ABC):
    """Every operation on job rows."""

    # The promotion of due jobs; a vendor may need its own form.
    promote_due_sql: ClassVar[str] = jobs_sql.JOB_PROMOTE_DUE_SQL
    # The walks of a job's descendants by both links (sql/fan_in.py), each
    # vendor's own.
    fail_descendants_sql: ClassVar[str]
    revive_descendants_sql: ClassVar[str]
    revive_keyless_descendants_sql: ClassVar[str]

    # -- enqueue ---------------------------------------------------------------------------
    @abc.abstractmethod
    def job_insert_one(self, db: BaseDatabaseWrapper, job: NewJob) -> str:
        """Insert a ready or delayed ``job`` through the Django connection
        ``db`` (in its transaction); return its stage."""

    @abc.abstractmethod
    def job_insert_many(
        self, db: BaseDatabaseWrapper, jobs: Iterable[NewJob], *, queued: bool = False
    ) -> None:
        """Insert ready ``jobs`` through ``db``, in as few statements as the
        database allows; ``queued`` when any of them may name a queue (the
        plain form never names the column).

        ``jobs`` may be built while it is consumed: an exception from it
        propagates, and the caller's transaction rolls the rows back."""

    def job_insert_continuation(
        self, cursor: CursorWrapper, job: NewJob, retention_ms: int
    ) -> str | None:
        """Insert ``job`` as a child of ``job.parent_id``; return its stage,
        or None when the parent does not exist in the namespace."""
        cursor.execute(*self._continuation_insert(job, retention_ms))
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def _continuation_insert(self, job: NewJob, retention_ms: int) -> tuple[str, list[Any]]:
        columns, value_sql, values = option_columns(job)
        sql = jobs_sql.continuation_insert(extra_columns=columns, extra_values=value_sql)
        return self._sql(sql), continuation_params(job, retention_ms, values)

    def job_insert_unique(
        self, cursor: CursorWrapper, job: NewJob, retention_ms: int
    ) -> Inserted | None:
        """Insert ``job``, which has a unique key, unless another job holds
        the key; return what was found, or None when ``job`` is a
        continuation whose parent does not exist.

        The unique index decides, inside the insert: an enqueue in another
        transaction that holds the key makes this one wait for its end (on
        PostgreSQL; SQLite has one writer at a time), so a key is never
        taken twice and never refused for a rollback. The holder found
        afterwards may finish, or its window end, before it is read: then
        the key is free and the insert is tried again."""
        for _ in range(UNIQUE_TRIES):
            if job.parent_id is None:
                template, params = insert_with_options(job)
                cursor.execute(self._sql(template), params)
            else:
                cursor.execute(*self._continuation_insert(job, retention_ms))
            row = cursor.fetchone()
            if row is not None:
                return Inserted(job.id, str(row[0]))
            holder = self._unique_holder(cursor, job)
            if holder is not None:
                return Inserted(holder, None)
            if job.parent_id is not None:
                cursor.execute(self._sql(jobs_sql.JOB_EXISTS_SQL), [job.parent_id, job.namespace])
                if cursor.fetchone() is None:
                    return None
        raise LaterBusy(
            f"the unique key {job.unique_key!r} of {job.type_name} was taken and freed "
            f"{UNIQUE_TRIES} times while this enqueue ran; try again"
        )

    def _unique_holder(self, cursor: CursorWrapper, job: NewJob) -> str | None:
        """The id of the job holding ``job``'s unique key, if one does."""
        key: list[Any] = [job.namespace, job.type_name, job.unique_key]
        if job.unique_for_ms is None:
            cursor.execute(self._sql(jobs_sql.UNIQUE_HOLDER_SQL), key)
        else:
            window = [job.unique_for_ms, job.unique_for_ms]
            cursor.execute(self._sql(jobs_sql.UNIQUE_HOLDER_IN_WINDOW_SQL), key + key + window)
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def job_insert_fan_in(
        self,
        cursor: CursorWrapper,
        job: NewJob,
        retention_ms: int,
        extra: ExtraColumns | None = None,
    ) -> FanInInsert:
        """Insert ``job`` as a child of every job of ``job.parents``: its
        parent list, then its row, whose stage follows theirs (failed if one
        failed or was cancelled, ready if all succeeded, else waiting on an
        unfinished one). Run in one transaction: when a parent does not exist
        in the namespace nothing is left written, and the answer names the
        missing ones. ``extra`` replaces the columns of the options the job
        sets (a partition job's place and options)."""
        self._add_parents(cursor, job.id, job.parents or ())
        if extra is None:
            # A fan-in job has no unique key: its options' values are all plain.
            columns, _, values = option_columns(job)
            extra = ExtraColumns(columns=columns, values=values)
        return self._insert_fan_in_row(cursor, job, retention_ms, extra)

    def _add_parents(self, cursor: CursorWrapper, child_id: str, parents: Sequence[str]) -> None:
        """Write the parent list of the fan-in child ``child_id``, before its
        row (whose insert reads it)."""
        for start in range(0, len(parents), FAN_IN_BATCH):
            batch = parents[start : start + FAN_IN_BATCH]
            params: list[Any] = []
            for parent_id in batch:
                params += [child_id, parent_id]
            cursor.execute(self._sql(fan_in_sql.FAN_IN_INSERT_SQL, pairs=pairs(len(batch))), params)

    def _insert_fan_in_row(
        self, cursor: CursorWrapper, job: NewJob, retention_ms: int, extra: ExtraColumns
    ) -> FanInInsert:
        """The row of a fan-in child whose parent list is written."""
        own: list[Any] = [job.id, job.type_name, job.payload, job.priority, job.retry_policy]
        key = [job.id, job.namespace]
        cursor.execute(
            self._sql(jobs_sql.continuation_insert(extra_columns=extra.columns, fan_in=True)),
            [*own, *extra.values, retention_ms, *key, *key],
        )
        row = cursor.fetchone()
        if row is not None:
            return FanInInsert(stage=str(row[0]))
        cursor.execute(self._sql(fan_in_sql.FAN_IN_MISSING_SQL), key)
        missing = tuple(str(r[0]) for r in cursor.fetchall())
        cursor.execute(self._sql(fan_in_sql.FAN_IN_DELETE_SQL, ids=ids(1)), [job.id])
        return FanInInsert(stage=None, missing=missing)

    def job_settle_child(self, cursor: CursorWrapper, *, job_id: str, retention_ms: int) -> Settled:
        """Release or fail the waiting continuation ``job_id`` if its parent
        has finished; return what happened.

        Run after the continuation's transaction committed, in a transaction
        of its own: a parent that finished while that transaction was open
        could not see the child."""
        cursor.execute(self._sql(jobs_sql.JOB_PARENT_STAGE_SQL), [job_id])
        row = cursor.fetchone()
        if row is None or row[0] not in TERMINAL:
            return "waiting"
        orphan = Orphan(job_id=job_id, parent_stage=str(row[0]))
        self.job_resolve_orphan(cursor, orphan, retention_ms=retention_ms)
        return "released" if row[0] == Stage.SUCCESS else "failed"

    def job_settle_fan_in(
        self, cursor: CursorWrapper, *, job_id: str, retention_ms: int
    ) -> Settled:
        """Resolve the waiting fan-in child ``job_id`` if a parent finished
        (_resolve_fan_in); return what happened.

        Run after the child's transaction committed, in a transaction of its
        own, as job_settle_child: its read of the parents waits for a finish
        of any of them under way and holds off the others until it ends."""
        cursor.execute(self._sql(fan_in_sql.FAN_IN_PARENTS_OF_WAITING_SQL), [job_id])
        if not any(row[0] in TERMINAL for row in cursor.fetchall()):
            return "waiting"
        resolved = self._resolve_fan_in(cursor, [job_id], retention_ms=retention_ms)
        return "released" if resolved.released else "failed" if resolved.failed else "waiting"

    def _resolve_fan_in(
        self, cursor: CursorWrapper, child_ids: Sequence[str], *, retention_ms: int
    ) -> FanInResolution:
        """Resolve the waiting fan-in children ``child_ids`` by all their
        parents: fail those with a parent failed or cancelled (and their
        waiting descendants), release those whose every parent succeeded,
        and make the others wait on an unfinished parent when the one they
        waited on finished. Run in one transaction."""
        if not child_ids:
            return FanInResolution()
        marks = ids(len(child_ids))
        cursor.execute(
            self._sql(fan_in_sql.FAN_IN_FAIL_SQL, ids=marks),
            [retention_ms, PARENT_FAILED, *child_ids],
        )
        failed = tuple(str(row[0]) for row in cursor.fetchall())
        for job_id in failed:
            self.job_fail_descendants(cursor, job_id=job_id, retention_ms=retention_ms)
        cursor.execute(self._sql(fan_in_sql.FAN_IN_RELEASE_SQL, ids=marks), list(child_ids))
        released = int(cursor.rowcount)
        if released < len(child_ids) - len(failed):
            cursor.execute(self._sql(fan_in_sql.FAN_IN_REPOINT_SQL, ids=marks), list(child_ids))
        return FanInResolution(released=released, failed=failed)

    def job_cancel(
        self, cursor: CursorWrapper, *, namespace: str, job_id: str, retention_ms: int
    ) -> bool:
        """Cancel ``job_id`` if it has not started, failing its waiting
        descendants, or ask it to stop if it runs; return whether either was
        done, so False means it finished or does not exist. Run in one
        transaction.

        A worker's retry, snooze or give-back may commit between the two
        statements (PostgreSQL runs each on the newest data): the job is
        then looked at again. Each new look needs the job to have moved
        between two of these statements, so a few are enough."""
        for _ in range(CANCEL_LOOKS):
            cursor.execute(self._sql(jobs_sql.JOB_CANCEL_SQL), [retention_ms, job_id, namespace])
            if cursor.rowcount == 1:
                self.job_fail_descendants(cursor, job_id=job_id, retention_ms=retention_ms)
                return True
            cursor.execute(self._sql(jobs_sql.JOB_REQUEST_CANCEL_SQL), [job_id, namespace])
            if cursor.rowcount == 1:
                return True
            cursor.execute(self._sql(jobs_sql.JOB_UNFINISHED_SQL), [job_id, namespace])
            if cursor.fetchone() is None:
                return False
        raise LaterBusy(
            f"job {job_id} changed stage under each of {CANCEL_LOOKS} tries to cancel it; "
            "call cancel() again"
        )

    # -- cancelling a running job ----------------------------------------------------
    def job_cancel_requested(
        self, cursor: CursorWrapper, *, namespace: str, owner: str
    ) -> list[Claim]:
        """The claims ``owner`` runs whose cancel was requested."""
        cursor.execute(self._sql(jobs_sql.JOB_CANCEL_REQUESTED_SQL), [namespace, owner])
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def job_cancel_running(self, cursor: CursorWrapper, fence: Fence, retention_ms: int) -> bool:
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
        self.job_fail_descendants(
            cursor, job_id=fence.job_id, retention_ms=retention_ms, error=PARENT_CANCELLED
        )
        return True

    # -- tracing (LATER["TRACING"] only) ---------------------------------------------------
    def job_set_trace(self, cursor: CursorWrapper, job_ids: Sequence[str], context: str) -> None:
        """Record the enqueuing span's ``context`` on jobs just inserted."""
        for start in range(0, len(job_ids), TRACE_BATCH):
            batch = job_ids[start : start + TRACE_BATCH]
            cursor.execute(
                self._sql(jobs_sql.JOB_SET_TRACE_SQL, ids=ids(len(batch))), [context, *batch]
            )

    def job_trace_context(self, cursor: CursorWrapper, *, job_id: str) -> str | None:
        """The enqueuing span's context recorded on ``job_id``, if any."""
        cursor.execute(self._sql(jobs_sql.JOB_TRACE_CONTEXT_SQL), [job_id])
        row = cursor.fetchone()
        return None if row is None else row[0]

    # -- the worker's hot path -------------------------------------------------------------
    @abc.abstractmethod
    def job_claim(self, cursor: CursorWrapper, request: ClaimRequest) -> list[ClaimedJob]:
        """Mark up to ``request.limit`` ready jobs running, leased to its
        owner, best first; return them."""

    @abc.abstractmethod
    def job_complete_many(
        self,
        cursor: CursorWrapper,
        batch: SuccessBatch,
    ) -> Completion:
        """Mark each claim of ``jobs`` that ``owner`` still holds as succeeded
        and release their waiting continuations; write the ``results`` of
        those that are task jobs. Run in one transaction."""

    async def ajob_claim(self, cursor: AsyncCursor[Any], request: ClaimRequest) -> list[ClaimedJob]:
        """(supports_async_connection) job_claim on the worker's asyncio
        connection, in autocommit."""
        raise NotImplementedError(f"{type(self).__name__} has no asyncio connection")

    async def ajob_complete_many(
        self,
        conn: AsyncConnection[Any],
        batch: SuccessBatch,
    ) -> Completion:
        """(supports_async_connection) job_complete_many on the worker's
        asyncio connection, in autocommit: one statement."""
        raise NotImplementedError(f"{type(self).__name__} has no asyncio connection")

    # -- the worker's other writes, under the fence of a claim -----------------------------
    def job_renew(
        self, cursor: CursorWrapper, *, owner: str, jobs: Sequence[tuple[str, int]], lease_ms: int
    ) -> list[Claim]:
        """Extend the leases ``owner`` holds on the claims ``jobs`` to the
        database's now plus ``lease_ms``; return the claims it still holds."""
        if not jobs:
            return []
        sql = self._sql(jobs_sql.JOB_RENEW_SQL, ids=ids(len(jobs)), pairs=pairs(len(jobs)))
        cursor.execute(sql, [lease_ms, *claims_params(jobs), owner])
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def job_claimed_since(
        self, cursor: CursorWrapper, request: ClaimRequest, *, within_ms: int
    ) -> list[Claim]:
        """The claims of plain jobs that claims like ``request`` (its owner,
        namespace and queue) made in the last ``within_ms`` (by the
        database's clock) and that are still running."""
        queue = column_value(request.queue)
        params: list[Any] = [request.namespace, request.owner, queue, within_ms]
        cursor.execute(self._sql(jobs_sql.JOB_CLAIMED_SINCE_SQL), params)
        return [Claim(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def job_stage_after(self, cursor: CursorWrapper, claim: tuple[str, int]) -> LeftAs | None:
        """Where ``claim`` left its job (None while it runs, or when a later
        claim took the job or it is gone): read when a store of its outcome
        may have committed unseen."""
        cursor.execute(self._sql(jobs_sql.JOB_STAGE_AFTER_SQL), list(claim))
        row = cursor.fetchone()
        return None if row is None else LeftAs(stage=str(row[0]), last_error=row[1])

    def job_unclaim(self, cursor: CursorWrapper, fence: OwnerFence) -> bool:
        """Give back a claim whose handler never ran or was stopped by its
        own worker: ready again, the claim not counted as an attempt
        (``uncounted`` goes up; ``attempts``, the fence, keeps it); return
        whether the fence held. A job cancel() asked to stop is not given
        back: its lease runs out and the stuck-job rescue cancels it."""
        cursor.execute(
            self._sql(jobs_sql.JOB_UNCLAIM_SQL), [fence.job_id, fence.attempts, fence.owner]
        )
        return bool(cursor.rowcount == 1)

    def job_retry(self, cursor: CursorWrapper, fence: Fence, retry: RetryWrite) -> bool:
        """Move the fenced claim to requeued, due ``retry.delay_ms`` after the
        database's now; return whether it did: not if the fence broke or a
        cancel was requested."""
        sql, by = self._fenced(fence, jobs_sql.JOB_RETRY_OWNED_SQL, jobs_sql.JOB_RETRY_EXPIRED_SQL)
        cursor.execute(
            sql,
            [retry.delay_ms, retry.error, retry.retry_policy, fence.job_id, by, fence.attempts],
        )
        return bool(cursor.rowcount == 1)

    def job_snooze(self, cursor: CursorWrapper, fence: OwnerFence, delay_ms: int) -> bool:
        """Move ``fence``'s claim back to delayed, due ``delay_ms`` after the
        database's now, the claim not counted as an attempt; return whether
        the fence held."""
        cursor.execute(
            self._sql(jobs_sql.JOB_SNOOZE_SQL),
            [delay_ms, fence.job_id, fence.owner, fence.attempts],
        )
        return bool(cursor.rowcount == 1)

    def job_fail(self, cursor: CursorWrapper, fence: Fence, failure: FailureWrite) -> bool:
        """Fail the fenced claim and its waiting descendants; return whether
        it did: not if the fence broke or a cancel was requested (then
        job_cancel_running ends it). Run in one transaction."""
        sql, by = self._fenced(fence, jobs_sql.JOB_FAIL_OWNED_SQL, jobs_sql.JOB_FAIL_EXPIRED_SQL)
        cursor.execute(sql, [failure.retention_ms, failure.error, fence.job_id, by, fence.attempts])
        if cursor.rowcount != 1:
            return False
        self.job_fail_descendants(cursor, job_id=fence.job_id, retention_ms=failure.retention_ms)
        return True

    def _fenced(self, fence: Fence, owned: str, expired: str) -> tuple[str, str | int]:
        """The statement of ``fence``'s kind, and the value it compares."""
        if isinstance(fence, OwnerFence):
            return self._sql(owned), fence.owner
        return self._sql(expired), fence.expired_for_ms

    def job_fail_descendants(
        self, cursor: CursorWrapper, *, job_id: str, retention_ms: int, error: str = PARENT_FAILED
    ) -> None:
        """Fail the waiting continuations of ``job_id``, and theirs, with
        ``error``: those of one parent and fan-in children alike, whichever
        parent they wait on."""
        cursor.execute(self._sql(self.fail_descendants_sql), [job_id, retention_ms, error])

    # -- maintenance -----------------------------------------------------------------------
    def job_next_due_in(self, cursor: CursorWrapper, *, namespace: str) -> int | None:
        """Milliseconds until the first delayed or requeued job of
        ``namespace`` is due (<= 0 when one already is); None when none waits."""
        cursor.execute(self._sql(jobs_sql.JOB_NEXT_DUE_SQL), [namespace])
        row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def job_promote_due(self, cursor: CursorWrapper, *, namespace: str, limit: int) -> int:
        """Make up to ``limit`` delayed or requeued jobs whose time has come
        ready; return how many."""
        cursor.execute(self._sql(self.promote_due_sql), [namespace, limit])
        return int(cursor.rowcount)

    def job_stuck(
        self, cursor: CursorWrapper, *, namespace: str, expired_for_ms: int, limit: int
    ) -> list[StuckJob]:
        """Running jobs whose lease expired at least ``expired_for_ms`` ago."""
        cursor.execute(self._sql(jobs_sql.JOB_STUCK_SQL), [namespace, expired_for_ms, limit])
        return [
            StuckJob(
                id=r[0],
                type_name=r[1],
                attempts=r[2],
                retry_policy=r[3],
                attempt=r[2] - r[4],
                cancel_requested=bool(r[5]),
            )
            for r in cursor.fetchall()
        ]

    def job_orphans(self, cursor: CursorWrapper, *, namespace: str, limit: int) -> list[Orphan]:
        """Waiting continuations whose parent is finished or gone, and
        fan-in children with a parent failed or cancelled."""
        cursor.execute(self._sql(jobs_sql.JOB_ORPHANS_SQL), [namespace, limit])
        return [
            Orphan(job_id=r[0], parent_stage=r[1], fan_in=bool(r[2])) for r in cursor.fetchall()
        ]

    def job_resolve_orphan(
        self, cursor: CursorWrapper, orphan: Orphan, *, retention_ms: int
    ) -> None:
        """Release ``orphan`` (its parent succeeded) or fail it and its waiting
        descendants; resolve a fan-in child by all its parents (it waits on
        another one while one has not finished). Run in one transaction."""
        if orphan.fan_in:
            self._resolve_fan_in(cursor, [orphan.job_id], retention_ms=retention_ms)
            return
        if orphan.parent_stage == Stage.SUCCESS:
            cursor.execute(self._sql(jobs_sql.JOB_RELEASE_ONE_SQL), [orphan.job_id])
            return
        reason = PARENT_FAILED if orphan.parent_stage else PARENT_MISSING
        cursor.execute(
            self._sql(jobs_sql.JOB_FAIL_WAITING_SQL), [retention_ms, reason, orphan.job_id]
        )
        self.job_fail_descendants(cursor, job_id=orphan.job_id, retention_ms=retention_ms)

    def job_prune(self, cursor: CursorWrapper, *, namespace: str, limit: int) -> int:
        """Delete up to ``limit`` finished jobs past their retention, and the
        task results of those that were tasks; return how many jobs.

        Run it in a transaction: a result must not outlive its job."""
        cursor.execute(self._sql(jobs_sql.JOB_PRUNE_SQL), [namespace, limit])
        rows = cursor.fetchall()
        pruned = [row[0] for row in rows]
        if pruned:
            cursor.execute(self._sql(jobs_sql.TASK_RESULT_PRUNE_SQL, ids=ids(len(pruned))), pruned)
        # A fan-in child's parent list goes with it; only continuations have one.
        continuations = [row[0] for row in rows if row[1]]
        if continuations:
            cursor.execute(
                self._sql(fan_in_sql.FAN_IN_DELETE_SQL, ids=ids(len(continuations))), continuations
            )
        return len(pruned)

    # -- an operator's actions (the dashboard) ---------------------------------------------
    def job_retry_failed(self, cursor: CursorWrapper, *, namespace: str, job_id: str) -> int | None:
        """Make the failed plain job ``job_id`` ready again, and its
        continuations that failed because it did wait for it again (fan-in
        children on it, whichever parent they waited on); return how many
        continuations, or None if the job was not a failed plain job. Run in
        one transaction."""
        cursor.execute(self._sql(jobs_sql.JOB_RETRY_FAILED_SQL), [job_id, namespace])
        if cursor.rowcount != 1:
            return None
        # A continuation whose unique key another unfinished job holds stays
        # failed. Two of them sharing a key, or an enqueue taking one while
        # this runs, break later_job_unique: then only those without a key
        # wait again, and the job itself is retried all the same.
        try:
            with transaction.atomic(using=cursor.db.alias):
                cursor.execute(self._sql(self.revive_descendants_sql), [job_id])
        except IntegrityError:
            cursor.execute(self._sql(self.revive_keyless_descendants_sql), [job_id])
        return int(cursor.rowcount)

    def job_run_now(self, cursor: CursorWrapper, *, namespace: str, job_id: str) -> bool:
        """Make a delayed or requeued job due now; return whether it was one."""
        cursor.execute(self._sql(jobs_sql.JOB_RUN_NOW_SQL), [job_id, namespace])
        return bool(cursor.rowcount == 1)

    # -- what is written with jobs ---------------------------------------------------------
    def task_results_write(
        self, cursor: CursorWrapper, *, owner: str, ends: Sequence[TaskAttemptEnd]
    ) -> None:
        """Write the ends of attempts of task jobs whose outcomes ``owner``
        just stored, fenced, in this transaction."""
        if ends:
            sql = self._sql(tasks_sql.TASK_RESULT_WRITE_SQL)
            cursor.executemany(sql, [end.row(owner) for end in ends])

    @abc.abstractmethod
    def counter_compact(self, cursor: CursorWrapper, *, namespace: str) -> int:
        """Fold the stage counter rows of ``namespace`` together; return how
        many rows were folded."""

    # -- wake-ups --------------------------------------------------------------------------
    def job_ready_exists(
        self, cursor: CursorWrapper, *, namespace: str, queue: str = DEFAULT_QUEUE
    ) -> bool:
        """Is any job of ``namespace`` in ``queue`` ready to claim, the queue
        not paused? A read: takes no write lock."""
        request = ClaimRequest(namespace=namespace, owner="", limit=0, lease_ms=0, queue=queue)
        cursor.execute(self._sql(jobs_sql.JOB_READY_EXISTS_SQL), queue_filter_params(request))
        return cursor.fetchone() is not None


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


def continuation_params(job: NewJob, retention_ms: int, extra: Sequence[Any] = ()) -> list[Any]:
    """The parameters of a continuation insert (sql/jobs.py
    continuation_insert) for ``job``, its ``extra`` columns' values given."""
    own = [job.id, job.type_name, job.payload, job.priority, job.retry_policy]
    return [*own, *extra, retention_ms, job.parent_id, job.namespace]


def option_columns(job: NewJob) -> tuple[str, str, list[Any]]:
    """The columns of the options ``job`` sets (", a, b"), their values'
    SQL (", %s, ...") and their parameters.

    An insert names only the option columns its job sets, so a job that sets
    none is written as before the options existed: a web server of this
    release still enqueues plain jobs before later_migrate added them."""
    columns, values = "", list[Any]()
    if job.timeout_ms is not None:
        columns, values = ", timeout_ms", [job.timeout_ms]
    if job.queue is not None:
        columns, values = columns + ", queue", [*values, job.queue]
    if job.concurrency_key is not None:
        columns += ", concurrency_key, concurrency_limit"
        values += [job.concurrency_key, job.concurrency_limit]
    value_sql = ", %s" * len(values)
    if job.unique_key is not None:
        columns, value_sql = columns + ", unique_key", value_sql + ", %s"
        values.append(job.unique_key)
        if job.unique_for_ms is not None:
            columns += ", unique_slot_ms"
            value_sql += ", " + jobs_sql.UNIQUE_SLOT
            values += [job.unique_for_ms, job.unique_for_ms]
    return columns, value_sql, values


def ready_now(job: NewJob) -> bool:
    """Is ``job`` due at once and without any option, so stored
    ``enqueued`` from NewJob's first six fields alone (as the bulk inserts
    store theirs)? A unique job is never: it takes job_insert_unique."""
    return (
        job.parent_id is None
        and job.run_at_ms is None
        and job.delay_ms <= 0
        and job.timeout_ms is None
        and job.queue is None
        and job.concurrency_key is None
        and job.unique_key is None
    )


def insert_one(job: NewJob) -> tuple[str, list[Any]]:
    """The insert of one ready or delayed ``job`` (a template) and its parameters."""
    # The common case: no option set.
    if job.timeout_ms is None and job.queue is None and job.concurrency_key is None:
        return jobs_sql.JOB_INSERT_SQL, [*job[:6], job.run_at_ms, job.delay_ms]
    return insert_with_options(job)


def insert_with_options(job: NewJob) -> tuple[str, list[Any]]:
    """insert_one's form for a job that sets options (a unique job's always:
    insert_one's test for none does not look at its key)."""
    columns, value_sql, values = option_columns(job)
    template = jobs_sql.job_insert(extra_columns=columns, extra_values=value_sql)
    return template, [*job[:6], *values, job.run_at_ms, job.delay_ms]
