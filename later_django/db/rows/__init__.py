"""What the dialect's operations take and return, as frozen, slotted value objects.

An operation that needs more than three values takes them grouped here, and
one that answers with more than one value returns a row from here, never a
bare tuple. The per-job records of the hot path (NewJob, ClaimedJob, Claim)
are named tuples in later_django.types instead: thousands are built a second.
"""

from __future__ import annotations

from .dashboard import (
    JobDetail,
    JobPage,
    JobQuery,
    JobSummary,
    LaneCount,
    LiveServer,
    LogConsumerRow,
    QueueSample,
    RunningJob,
    StatReading,
)
from .jobs import (
    ClaimRequest,
    Completion,
    ExpiredFence,
    FailureWrite,
    Fence,
    LeftAs,
    Orphan,
    OwnerFence,
    RetryWrite,
    StuckJob,
    TaskAttemptEnd,
    claimed_jobs,
)
from .limits import LimitedClaim, LimitedClaimRequest, RateWindow
from .partitions import (
    HeadFailure,
    JobPlace,
    PartitionClaim,
    PartitionClaimRequest,
    PartitionCompletion,
    PartitionHead,
    PartitionSlot,
)
from .retained_log import (
    LogAcquired,
    LogAdvance,
    LogCommit,
    LogConsumerKey,
    LogConsumerState,
    LogFence,
    LogLag,
    LogLeaseRequest,
    LogPartitionKey,
    LogPrune,
    LogRead,
    LogTopicRow,
    NewLogRecord,
    StoredRecord,
)
from .schedules import (
    DueSchedule,
    ScheduleAdvance,
    ScheduleInfo,
    ScheduleKey,
    ScheduleWrite,
)
from .servers import (
    Heartbeat,
    HeldLease,
    LeaseRequest,
    StatRow,
)

__all__ = [
    "ClaimRequest",
    "Completion",
    "DueSchedule",
    "ExpiredFence",
    "FailureWrite",
    "Fence",
    "HeadFailure",
    "Heartbeat",
    "HeldLease",
    "JobDetail",
    "JobPage",
    "JobQuery",
    "JobSummary",
    "LaneCount",
    "LeaseRequest",
    "LiveServer",
    "LogAcquired",
    "LogAdvance",
    "LogCommit",
    "LogConsumerKey",
    "LogConsumerRow",
    "LogConsumerState",
    "LogFence",
    "LogLag",
    "LogLeaseRequest",
    "LogPartitionKey",
    "LogPrune",
    "LogRead",
    "LogTopicRow",
    "NewLogRecord",
    "JobPlace",
    "LeftAs",
    "LimitedClaim",
    "LimitedClaimRequest",
    "Orphan",
    "OwnerFence",
    "PartitionClaim",
    "PartitionClaimRequest",
    "PartitionCompletion",
    "PartitionHead",
    "PartitionSlot",
    "QueueSample",
    "RateWindow",
    "RetryWrite",
    "RunningJob",
    "ScheduleAdvance",
    "ScheduleInfo",
    "ScheduleKey",
    "ScheduleWrite",
    "StatReading",
    "StatRow",
    "StoredRecord",
    "StuckJob",
    "TaskAttemptEnd",
    "claimed_jobs",
]
