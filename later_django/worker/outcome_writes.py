"""The write of one outcome other than a plain success, fenced by its claim,
in the caller's transaction: a retry, a snooze, a failure or a cancel, and
a partition head's outcome. The worker's completer runs them on its thread
pool; later_django.testing's drain() runs them in the test's thread."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.base import Dialect
from later_django.db.rows import FailureWrite, OwnerFence, RetryWrite
from later_django.events import OutcomeKind
from later_django.types import ClaimedJob
from later_django.worker.executor import Outcome


def store_failure(
    dialect: Dialect,
    cursor: CursorWrapper,
    job: ClaimedJob,
    outcome: Outcome,
    *,
    owner: str,
    retention_ms: int,
) -> OutcomeKind | None:
    """Store a retry, a snooze, a terminal failure or a cancel of ``owner``'s
    claim of ``job``, fenced by the claim; return the kind of outcome stored,
    or None if the fence broke, in one transaction (a task job's result
    too). A cancel requested meanwhile wins: the job ends "cancelled"."""
    fence = OwnerFence(job_id=job.id, attempts=job.attempts, owner=owner)
    if outcome.kind == "snoozed":
        done = dialect.hot.snooze(cursor, fence, outcome.delay_ms or 0)
    elif outcome.kind == "retry":
        retry = RetryWrite(
            delay_ms=outcome.delay_ms or 0,
            error=outcome.error,
            retry_policy=outcome.resolved_policy,
        )
        done = dialect.hot.retry(cursor, fence, retry)
    elif outcome.kind == "failed":
        failure = FailureWrite(error=outcome.error, retention_ms=retention_ms)
        done = dialect.hot.fail(cursor, fence, failure)
    else:
        done = False  # "cancelled": stored below
    stored = outcome.kind if done else None
    if stored is None and dialect.hot.cancel_running(cursor, fence, retention_ms):
        stored = "cancelled"
    if stored and outcome.attempt_end is not None:
        dialect.hot.task_results_write(cursor, owner=owner, ends=[outcome.attempt_end])
    return stored


def store_partition_outcome(
    dialect: Dialect,
    cursor: CursorWrapper,
    job: ClaimedJob,
    outcome: Outcome,
    *,
    owner: str,
    retention_ms: int,
) -> OutcomeKind | None:
    """Store the outcome of a partition head other than a success (the
    completer shares those), fenced by its claim and by its partition's lease
    (owner and epoch); return the kind stored, None unless both held. In one
    transaction: the fence's row lock holds off a takeover until it ends, so
    only the current holder finishes a head."""
    assert job.lane is not None
    if not dialect.partitions.partition_fence(cursor, job.lane, owner=owner):
        return None
    return store_failure(dialect, cursor, job, outcome, owner=owner, retention_ms=retention_ms)
