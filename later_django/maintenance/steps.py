"""The maintenance steps. Each is idempotent and safe to run from many servers at once.

Every step runs on its own Django cursor in a maintenance thread, never
behind the job backlog, and changes only rows it finds due at that moment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.db.backends.utils import CursorWrapper

from later_django import registry
from later_django.db.base import Dialect
from later_django.db.rows import ExpiredFence, FailureWrite, RetryWrite
from later_django.leases import Leader
from later_django.recurring import firing
from later_django.retained_log import retention
from later_django.retry import RetryPolicy, default_policy

logger = logging.getLogger(__name__)

BATCH = 500  # rows one statement changes; keeps each transaction short
MAX_ROUNDS = 20  # batches per step per tick, so one tick stays bounded
# The dashboard's figures: a queue-length point a minute, kept a week; the
# workers' per-second rows, kept ten minutes (the page reads the last minute).
SAMPLE_INTERVAL_MS = 60_000
SAMPLES_KEPT_MS = 7 * 24 * 3600_000
STATS_KEPT_MS = 600_000
LEASE_EXPIRED = "lease expired: the process running this job stopped renewing it (killed or paused)"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepContext:
    alias: str
    namespace: str
    retention_ms: int
    stuck_grace_ms: int
    server_ttl_ms: int
    vacuum_interval_ms: int | None
    # Leads the steps that run once per cluster.
    leader: Leader
    # Recurring occurrences missed by more than this collapse into one.
    missed_grace_ms: int
    # Occurrences due this soon are enqueued ahead, as delayed jobs.
    schedule_ahead_ms: int


def fire_schedules(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """Recurring schedules enqueue their occurrences due before the tick after next."""
    return firing.fire_schedules(
        dialect,
        cursor,
        alias=ctx.alias,
        ahead_ms=ctx.schedule_ahead_ms,
        grace_ms=ctx.missed_grace_ms,
        namespace=ctx.namespace,
    )


def promote_due(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """Delayed and retry-waiting jobs whose time has come become enqueued."""
    total = 0
    for _ in range(MAX_ROUNDS):
        n = dialect.upkeep.promote_due(cursor, namespace=ctx.namespace, limit=BATCH)
        total += n
        if n < BATCH:
            break
    return total


def _policy_for(type_name: str, stored: str | None) -> RetryPolicy:
    if stored:
        try:
            return RetryPolicy.from_json(stored)
        except (ValueError, KeyError, TypeError):
            pass
    handler = registry.handler_by_name(type_name)
    if handler is not None and isinstance(handler.retry, RetryPolicy):
        return handler.retry
    # A callable policy needs the payload and a context; the default applies here.
    return default_policy()


def rescue_stuck(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """Running jobs whose lease expired (their process died) are retried or failed.

    "Expired" is judged on the database's clock, so a host whose own clock
    runs ahead never takes a live job from its owner."""
    rescued = 0
    for job in dialect.upkeep.stuck(
        cursor, namespace=ctx.namespace, expired_for_ms=ctx.stuck_grace_ms, limit=BATCH
    ):
        delay = _policy_for(job.type_name, job.retry_policy).next_delay(job.attempt)
        fence = ExpiredFence(
            job_id=job.id, attempts=job.attempts, expired_for_ms=ctx.stuck_grace_ms
        )
        with transaction.atomic(using=ctx.alias):
            done: str | None
            if job.cancel_requested:
                done = None  # cancel() asked it to stop: cancelled below
            elif delay is None:
                failure = FailureWrite(error=LEASE_EXPIRED, retention_ms=ctx.retention_ms)
                done = "failed" if dialect.hot.fail(cursor, fence, failure) else None
            else:
                delay_ms = int(delay.total_seconds() * 1000)
                retry = RetryWrite(delay_ms=delay_ms, error=LEASE_EXPIRED)
                done = "retrying" if dialect.hot.retry(cursor, fence, retry) else None
            # So is a job whose cancel came after the look above: the retry
            # and the failure refuse a job with a cancel request.
            if not done and dialect.hot.cancel_running(cursor, fence, ctx.retention_ms):
                done = "cancelled"
        if done:
            rescued += 1
            logger.warning(
                "recovered stuck job %s (%s, attempt %d): %s",
                job.id,
                job.type_name,
                job.attempt,
                done,
                extra={"action": "job_rescued", "job_id": job.id},
            )
    return rescued


def resolve_orphans(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """Backstop: waiting continuations whose parent already finished are resolved."""
    orphans = dialect.upkeep.orphans(cursor, namespace=ctx.namespace, limit=BATCH)
    for orphan in orphans:
        with transaction.atomic(using=ctx.alias):
            dialect.upkeep.resolve_orphan(cursor, orphan, retention_ms=ctx.retention_ms)
    return len(orphans)


def prune_expired(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """Finished jobs past their retention are deleted, a small batch at a time."""
    total = 0
    for _ in range(MAX_ROUNDS):
        with transaction.atomic(using=ctx.alias):
            n = dialect.upkeep.prune(cursor, namespace=ctx.namespace, limit=BATCH)
        total += n
        if n < BATCH:
            break
    total += dialect.cluster.server_prune(
        cursor, namespace=ctx.namespace, silent_for_ms=ctx.server_ttl_ms
    )
    return total


def compact_counters(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """Fold the per-stage counter rows (PostgreSQL appends one per write)."""
    with transaction.atomic(using=ctx.alias):
        return dialect.upkeep.counter_compact(cursor, namespace=ctx.namespace)


def vacuum(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """SQLite VACUUM, by the leading server, at most once per VACUUM_INTERVAL."""
    if ctx.vacuum_interval_ms is None or not dialect.needs_vacuum:
        return 0
    if ctx.leader.lead(dialect, cursor, "vacuum") is None:
        return 0
    if not dialect.cluster.maintenance_claim(
        cursor,
        namespace=ctx.namespace,
        step="vacuum",
        interval_ms=ctx.vacuum_interval_ms,
    ):
        return 0
    return int(dialect.vacuum(cursor))


def prune_retained_log(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """Retained-log records older than their topic's retention are deleted,
    by the leading server, in small batches."""
    return retention.prune_retained_log(dialect, cursor, namespace=ctx.namespace, leader=ctx.leader)


def sample_queue(dialect: Dialect, cursor: CursorWrapper, ctx: StepContext) -> int:
    """Once a minute, by the leading server: the backlog as a point of the
    dashboard's queue-length graph, and old figures deleted."""
    if ctx.leader.lead(dialect, cursor, "dashboard") is None:
        return 0
    if not dialect.cluster.maintenance_claim(
        cursor, namespace=ctx.namespace, step="sample_queue", interval_ms=SAMPLE_INTERVAL_MS
    ):
        return 0
    with transaction.atomic(using=ctx.alias):
        taken = dialect.reads.sample_take(cursor, namespace=ctx.namespace)
        dialect.reads.dashboard_prune(
            cursor,
            namespace=ctx.namespace,
            stats_for_ms=STATS_KEPT_MS,
            samples_for_ms=SAMPLES_KEPT_MS,
        )
    return taken


STEPS = {
    "fire_schedules": fire_schedules,
    "promote_due": promote_due,
    "rescue_stuck": rescue_stuck,
    "resolve_orphans": resolve_orphans,
    "prune_expired": prune_expired,
    "compact_counters": compact_counters,
    "vacuum": vacuum,
    "prune_retained_log": prune_retained_log,
    "sample_queue": sample_queue,
}
