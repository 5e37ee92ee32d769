"""later_django: a durable, distributed background job manager for Django."""

from __future__ import annotations

from later_django.context import JobContext
from later_django.enqueue import (
    acancel,
    aenqueue,
    aenqueue_continue,
    aenqueue_delayed,
    aenqueue_delayed_at,
    aenqueue_in,
    aenqueue_many,
    cancel,
    enqueue,
    enqueue_continue,
    enqueue_delayed,
    enqueue_delayed_at,
    enqueue_in,
    enqueue_many,
)
from later_django.exceptions import (
    AlreadyRegistered,
    JobNotFound,
    LaterBusy,
    LaterError,
    LeaseLost,
    NotMigrated,
    NotRegistered,
    PayloadTooLarge,
    TransactionRequired,
)
from later_django.ids import JobId
from later_django.lookup import aget_job, astage_counts, get_job, stage_counts
from later_django.partitions import partition_for_key
from later_django.recurring.api import (
    aenqueue_recurring,
    alist_recurring,
    aremove_recurring,
    enqueue_recurring,
    list_recurring,
    remove_recurring,
)
from later_django.registry import job
from later_django.retry import RetryPolicy
from later_django.states import Stage
from later_django.types import JobInfo, RecurringSchedule, StageChange

__all__ = [
    "AlreadyRegistered",
    "JobContext",
    "JobId",
    "JobInfo",
    "JobNotFound",
    "LaterBusy",
    "LaterError",
    "LeaseLost",
    "NotMigrated",
    "NotRegistered",
    "PayloadTooLarge",
    "RecurringSchedule",
    "RetryPolicy",
    "Stage",
    "StageChange",
    "TransactionRequired",
    "acancel",
    "aenqueue",
    "aenqueue_continue",
    "aenqueue_delayed",
    "aenqueue_delayed_at",
    "aenqueue_in",
    "aenqueue_many",
    "aenqueue_recurring",
    "aget_job",
    "alist_recurring",
    "aremove_recurring",
    "astage_counts",
    "cancel",
    "enqueue",
    "enqueue_continue",
    "enqueue_delayed",
    "enqueue_delayed_at",
    "enqueue_in",
    "enqueue_many",
    "enqueue_recurring",
    "get_job",
    "job",
    "partition_for_key",
    "list_recurring",
    "remove_recurring",
    "stage_counts",
]
