"""later_django: a durable, distributed background job manager for Django."""

from __future__ import annotations

from later_django.context import JobContext
from later_django.enqueue import (
    acancel,
    aenqueue,
    aenqueue_continue,
    aenqueue_continue_all,
    aenqueue_delayed,
    aenqueue_delayed_at,
    aenqueue_in,
    aenqueue_many,
    cancel,
    enqueue,
    enqueue_continue,
    enqueue_continue_all,
    enqueue_delayed,
    enqueue_delayed_at,
    enqueue_in,
    enqueue_many,
)
from later_django.exceptions import (
    AlreadyRegistered,
    JobNotFound,
    JobTimeout,
    LaterBusy,
    LaterError,
    LeaseLost,
    NotMigrated,
    NotRegistered,
    PayloadTooLarge,
    Snooze,
    TransactionRequired,
    UnknownTopic,
)
from later_django.ids import JobId
from later_django.lookup import aget_job, astage_counts, get_job, stage_counts
from later_django.partitions import partition_for_key
from later_django.partitions.api import (
    aenqueue_continue_to_partition,
    aenqueue_recurring_continue,
    aenqueue_to_partition,
    aenqueue_to_partition_delayed,
    aenqueue_to_partition_in,
    aforce_fail_partition_head,
    apartition_stats,
    atruncate_partition_history,
    enqueue_continue_to_partition,
    enqueue_recurring_continue,
    enqueue_to_partition,
    enqueue_to_partition_delayed,
    enqueue_to_partition_in,
    force_fail_partition_head,
    partition_stats,
    truncate_partition_history,
)
from later_django.queues import apause_queue, aresume_queue, pause_queue, resume_queue
from later_django.recurring.api import (
    aenqueue_recurring,
    aenqueue_recurring_sequential,
    alist_recurring,
    aremove_recurring,
    enqueue_recurring,
    enqueue_recurring_sequential,
    list_recurring,
    remove_recurring,
)
from later_django.registry import job
from later_django.retry import RetryPolicy
from later_django.states import Stage
from later_django.types import JobInfo, PartitionStats, RecurringSchedule, StageChange
from later_django.version import __version__ as __version__

# Grouped as docs/reference/api.md is, each group sorted.
__all__ = [
    # Defining jobs
    "JobContext",
    "RetryPolicy",
    "Snooze",
    "job",
    # Enqueueing
    "aenqueue",
    "aenqueue_continue",
    "aenqueue_continue_all",
    "aenqueue_delayed",
    "aenqueue_delayed_at",
    "aenqueue_in",
    "aenqueue_many",
    "enqueue",
    "enqueue_continue",
    "enqueue_continue_all",
    "enqueue_delayed",
    "enqueue_delayed_at",
    "enqueue_in",
    "enqueue_many",
    # Reading and cancelling jobs
    "JobId",
    "JobInfo",
    "Stage",
    "StageChange",
    "acancel",
    "aget_job",
    "astage_counts",
    "cancel",
    "get_job",
    "stage_counts",
    # Queues
    "apause_queue",
    "aresume_queue",
    "pause_queue",
    "resume_queue",
    # Recurring jobs
    "RecurringSchedule",
    "aenqueue_recurring",
    "aenqueue_recurring_continue",
    "aenqueue_recurring_sequential",
    "alist_recurring",
    "aremove_recurring",
    "enqueue_recurring",
    "enqueue_recurring_continue",
    "enqueue_recurring_sequential",
    "list_recurring",
    "remove_recurring",
    # Sequential partition mode
    "PartitionStats",
    "aenqueue_continue_to_partition",
    "aenqueue_to_partition",
    "aenqueue_to_partition_delayed",
    "aenqueue_to_partition_in",
    "aforce_fail_partition_head",
    "apartition_stats",
    "atruncate_partition_history",
    "enqueue_continue_to_partition",
    "enqueue_to_partition",
    "enqueue_to_partition_delayed",
    "enqueue_to_partition_in",
    "force_fail_partition_head",
    "partition_for_key",
    "partition_stats",
    "truncate_partition_history",
    # Exceptions
    "AlreadyRegistered",
    "JobNotFound",
    "JobTimeout",
    "LaterBusy",
    "LaterError",
    "LeaseLost",
    "NotMigrated",
    "NotRegistered",
    "PayloadTooLarge",
    "TransactionRequired",
    "UnknownTopic",
]
