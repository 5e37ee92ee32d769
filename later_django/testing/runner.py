"""drain(): run every due job in the calling thread, on its own connection.

For users' test suites. Claims, outcomes and their writes are the worker's
own; only where the handler runs differs: in the caller's thread and
transaction, one job at a time. Not a worker: nothing renews a lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import DatabaseError, connections, transaction

from later_django import codec, queues, registry
from later_django.conf import conf
from later_django.context import JobContext, build_app
from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest, SuccessBatch
from later_django.events import OutcomeKind
from later_django.exceptions import LeaseLost
from later_django.ids import JobId, new_job_id
from later_django.types import ClaimedJob
from later_django.worker.atomic import AtomicRunner
from later_django.worker.executor import (
    SUCCEEDED,
    Outcome,
    committed_outcome,
    outcome_of_bad_payload,
    outcome_of_error,
    outcome_without_handler,
    with_attempt_end,
)
from later_django.worker.outcome_writes import store_failure

logger = logging.getLogger(__name__)

DEFAULT_MAX_JOBS = 10_000
PROMOTE_BATCH = 500  # delayed or requeued jobs made ready per statement

_local = threading.local()


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRun:
    """One attempt that drain() ran, and what became of it.

    ``outcome``: ``succeeded``, ``retry`` (requeued for another attempt),
    ``failed`` (no retry left, or a payload that no longer decodes),
    ``snoozed`` (delayed again, the attempt not counted) or ``cancelled``.
    ``error``: the job's stored last error, ``Type: message`` and traceback.
    """

    job_id: JobId
    type_name: str
    attempt: int
    outcome: OutcomeKind
    error: str | None = None


def drain(*, max_jobs: int = DEFAULT_MAX_JOBS) -> list[JobRun]:
    """Run every due job, and every job those release, until none is due;
    return the attempts that ran, in order.

    Runs in the calling thread on its connection of LATER["DATABASE"], so
    inside a test's transaction the jobs and the test see each other's rows.
    A delayed job or a retry due later (on the database's clock) is left.
    RuntimeError when jobs are still due after ``max_jobs`` attempts (a job
    that enqueues itself again, for example).
    """
    if type(max_jobs) is not int or max_jobs < 1:
        raise ValueError(f"max_jobs must be an int >= 1, got {max_jobs!r}")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "drain() was called from async code; await later_django.testing.adrain() instead"
        )
    if draining():
        raise RuntimeError("drain() is already running in this thread; a handler cannot drain")
    _local.draining = True
    try:
        return _Drain().run(max_jobs)
    finally:
        _local.draining = False


async def adrain(*, max_jobs: int = DEFAULT_MAX_JOBS) -> list[JobRun]:
    """Run :func:`drain` from async code.

    It runs where Django's async ORM calls run (``sync_to_async`` in
    thread-sensitive mode), so it sees what they see: inside an async test
    of Django's ``TestCase``, the test's transaction.
    """
    return await sync_to_async(drain)(max_jobs=max_jobs)


def draining() -> bool:
    """Is drain() running in this thread?"""
    return bool(getattr(_local, "draining", False))


class _Drain:
    """One call of drain(): its settings, its owner name and its app context."""

    def __init__(self) -> None:
        self.alias = conf.database
        self.namespace = conf.namespace
        self.dialect = dialect_for(self.alias)
        self.lease_ms = conf.millis("LEASE_DURATION")
        self.retention_ms = conf.millis("DASHBOARD_RETENTION")
        # The queues it runs: every declared one.
        self.queues = queues.declared()
        # The claims' owner: the fence of this drain's writes.
        self.owner = f"drain-{os.getpid()}-{new_job_id()}"
        self.atomic = AtomicRunner(
            alias=self.alias, owner=self.owner, retention_ms=self.retention_ms
        )
        self._app: Any = None
        self._app_built = False

    def run(self, max_jobs: int) -> list[JobRun]:
        runs: list[JobRun] = []
        while len(runs) < max_jobs:
            job = self._claim()
            if job is None and self._promote_due():
                job = self._claim()
            if job is None:
                return runs
            runs.append(self._run(job))
        if self._ready_exists() or self._promote_due():
            raise RuntimeError(
                f"drain() ran {max_jobs} attempts and jobs are still due; a job may "
                "enqueue itself again, or raise max_jobs"
            )
        return runs

    # -- the database, each step in its own transaction (a savepoint inside
    # the caller's), as the worker's statements are ------------------------------
    def _claim(self) -> ClaimedJob | None:
        """One job of any declared queue that is not paused, the queues in
        their LATER["QUEUES"] order."""
        for queue in self.queues:
            request = ClaimRequest(
                namespace=self.namespace,
                owner=self.owner,
                limit=1,
                lease_ms=self.lease_ms,
                queue=queue,
            )
            with transaction.atomic(using=self.alias), connections[self.alias].cursor() as cursor:
                claimed = self.dialect.hot.claim(cursor, request)
            if claimed:
                return claimed[0]
        return None

    def _promote_due(self) -> int:
        with transaction.atomic(using=self.alias), connections[self.alias].cursor() as cursor:
            return self.dialect.upkeep.promote_due(
                cursor, namespace=self.namespace, limit=PROMOTE_BATCH
            )

    def _ready_exists(self) -> bool:
        with connections[self.alias].cursor() as cursor:
            return any(
                self.dialect.hot.ready_exists(cursor, namespace=self.namespace, queue=queue)
                for queue in self.queues
            )

    def _store(self, job: ClaimedJob, outcome: Outcome) -> Outcome:
        """Store ``outcome``; return it as stored (a cancel requested
        meanwhile turns a retry or a failure into a cancel)."""
        stored: OutcomeKind | None
        with transaction.atomic(using=self.alias), connections[self.alias].cursor() as cursor:
            if outcome.kind == "succeeded":
                done = (
                    job.id
                    in self.dialect.hot.complete_many(
                        cursor,
                        SuccessBatch(
                            owner=self.owner,
                            jobs=[(job.id, job.attempts)],
                            retention_ms=self.retention_ms,
                            results=[] if outcome.attempt_end is None else [outcome.attempt_end],
                        ),
                    ).done_ids
                )
                stored = "succeeded" if done else None
            else:
                stored = store_failure(
                    self.dialect,
                    cursor,
                    job,
                    outcome,
                    owner=self.owner,
                    retention_ms=self.retention_ms,
                )
        if stored is None:
            raise _taken_over(job)
        return outcome if stored == outcome.kind else replace(outcome, kind=stored)

    # -- the handler ---------------------------------------------------------------
    def _run(self, job: ClaimedJob) -> JobRun:
        outcome = self._outcome(job)
        if outcome.committed is None:
            outcome = self._store(job, outcome)
        elif not outcome.committed:
            raise _taken_over(job)
        _log(job, outcome)
        return JobRun(
            job_id=JobId(job.id),
            type_name=job.type_name,
            attempt=job.attempt,
            outcome=outcome.kind,
            error=outcome.error,
        )

    def _outcome(self, job: ClaimedJob) -> Outcome:
        handler = registry.handler_by_name(job.type_name)
        if handler is None:
            return outcome_without_handler(job)
        try:
            payload = codec.decode(job.payload, handler.payload_type)
        except codec.PayloadDecodeError as exc:
            return outcome_of_bad_payload(job, exc)
        ctx = JobContext(job_id=JobId(job.id), attempt=job.attempt, app=self._context())
        try:
            if handler.atomic:
                # Its writes and its success in one transaction (a savepoint
                # inside the caller's), as under a worker.
                return committed_outcome(self.atomic.run(job, handler.func, ctx, payload))
            self._call(handler, ctx, payload)
        except KeyboardInterrupt:
            raise  # stops the test run, as Ctrl-C should
        except BaseException as exc:  # noqa: BLE001  even sys.exit() in a handler is its failure
            return with_attempt_end(outcome_of_error(job, handler, ctx, payload, exc), ctx)
        return with_attempt_end(SUCCEEDED, ctx)

    def _call(self, handler: registry.Handler, ctx: JobContext, payload: object) -> None:
        # An async handler runs under async_to_sync, so its async ORM calls
        # come back to this thread and this connection (as in Django's
        # async tests), inside the caller's transaction.
        call = async_to_sync(handler.func) if handler.is_async else handler.func
        db = connections[self.alias]
        if not db.in_atomic_block:
            # Autocommit, as a worker's handler thread: each write commits.
            call(ctx, payload)
            return
        # Inside the caller's transaction a savepoint keeps a failed attempt
        # from breaking it: a database error rolls back to the savepoint
        # (PostgreSQL takes no statement after one), any other error keeps
        # what the handler wrote, as a worker's autocommit would.
        failure: BaseException | None = None
        with transaction.atomic(using=self.alias):
            try:
                call(ctx, payload)
            except DatabaseError:
                raise
            except BaseException as exc:  # noqa: BLE001  re-raised below, after the savepoint
                failure = exc
        if failure is not None:
            raise failure

    def _context(self) -> Any:
        if not self._app_built:
            self._app, self._app_built = build_app(), True
        return self._app


def _taken_over(job: ClaimedJob) -> LeaseLost:
    return LeaseLost(
        f"job {job.id} attempt {job.attempts} was taken over while drain() ran it (is a "
        "later_worker running on this database?); its outcome was not stored"
    )


def _log(job: ClaimedJob, outcome: Outcome) -> None:
    extra = {"action": f"job_{outcome.kind}", "job_id": job.id, "job_type": job.type_name}
    first_line = (outcome.error or "").split("\n", 1)[0]
    if outcome.kind == "failed":
        logger.error(
            "job %s (%s) failed on attempt %d: %s",
            job.id,
            job.type_name,
            job.attempt,
            first_line,
            extra=extra,
        )
    elif outcome.kind == "retry":
        logger.warning(
            "job %s (%s) attempt %d failed, retrying: %s",
            job.id,
            job.type_name,
            job.attempt,
            first_line,
            extra=extra,
        )
