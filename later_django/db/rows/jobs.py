"""What the job operations take and return: claims, fenced writes and their
results, and the end of a Django Tasks attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from later_django.types import ClaimedJob

# -- parameters ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """Up to ``limit`` ready jobs of ``namespace`` in ``queue``, leased to
    ``owner`` for ``lease_ms`` from the database's now."""

    namespace: str
    owner: str
    limit: int
    lease_ms: int
    queue: str = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerFence:
    """A claim (``job_id``, ``attempts``) as the server holding its lease,
    ``owner``, names it: the fence of the worker's own writes."""

    job_id: str
    attempts: int
    owner: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpiredFence:
    """A claim (``job_id``, ``attempts``) whose lease expired at least
    ``expired_for_ms`` ago on the database's clock: the rescuer's fence."""

    job_id: str
    attempts: int
    expired_for_ms: int


# A write under a fence changes the claim's row only while the fence holds.
Fence: TypeAlias = OwnerFence | ExpiredFence


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryWrite:
    """A claim's next attempt, due ``delay_ms`` after the database's now.
    ``retry_policy`` (JSON) replaces the stored one when set: a callable
    policy resolved after the first failure."""

    delay_ms: int
    error: str | None
    retry_policy: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureWrite:
    """A claim's terminal failure, kept ``retention_ms`` after it; ``error``
    becomes its last_error."""

    error: str | None
    retention_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtraColumns:
    """The option columns an insert names after those of every job
    (sql/enqueue.py OPTION_VALUES' names), and their parameters."""

    columns: tuple[str, ...]
    values: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskAttemptEnd:
    """The end of an attempt of a Django Tasks job: written with the job's
    outcome, in the transaction (or the statement) that stores it, so the
    result is there exactly when the outcome is."""

    job_id: str
    # The worker ids before this attempt as JSON without its closing bracket
    # ('[' or '["a",'): the id of the server storing the outcome completes it.
    earlier_workers: str
    errors: str  # JSON list of {"exception_class_path", "traceback"}
    return_value: str | None  # JSON, once the attempt succeeded

    def row(self, owner: str) -> tuple[str, str, str, str | None]:
        """later_task_result's row, ``owner`` being the attempt's worker."""
        workers = f"{self.earlier_workers}{json.dumps(owner)}]"
        return (self.job_id, workers, self.errors, self.return_value)


@dataclass(frozen=True, slots=True, kw_only=True)
class SuccessBatch:
    """Successes to store: the claims ``jobs`` (id, attempts) that ``owner``
    still holds, kept ``retention_ms`` once finished, and the ``results``
    of those that are Django Tasks jobs, written with them."""

    owner: str
    jobs: Sequence[tuple[str, int]]
    retention_ms: int
    results: Sequence[TaskAttemptEnd] = ()


# -- rows ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """A batch of successes stored: the ids whose fence held, and how many
    waiting continuations became ready."""

    done_ids: list[str]
    released: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StuckJob:
    """A running job whose lease expired: ``attempts`` fences its claim,
    ``attempt`` is what its retry policy counts."""

    id: str
    type_name: str
    attempts: int
    retry_policy: str | None
    attempt: int
    # cancel() asked it to stop: it ends cancelled, never retried.
    cancel_requested: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Orphan:
    """A waiting continuation whose parent finished (``parent_stage``) or is
    gone (None); a ``fan_in`` child is resolved by all its parents."""

    job_id: str
    parent_stage: str | None
    fan_in: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class FanInInsert:
    """A fan-in child's insert: its stage, or None and the parents ``missing``
    from the namespace (nothing is left written then)."""

    stage: str | None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class FanInResolution:
    """What resolving waiting fan-in children did: how many became ready, and
    which failed because a parent did (their descendants failed with them)."""

    released: int = 0
    failed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LeftAs:
    """Where a finished claim left its job: the stage and the error stored
    (the error tells a worker's own failure from the rescuer's)."""

    stage: str
    last_error: str | None


def claimed_jobs(rows: Sequence[Sequence[Any]]) -> list[ClaimedJob]:
    """Claim rows as ClaimedJobs; a claim returns ClaimedJob's fields in order."""
    return [
        ClaimedJob(r[0], r[1], bytes(r[2]), r[3], r[4], r[5], r[6], None, r[7] or 0, r[8])
        for r in rows
    ]
