"""later's tables. Times are integer epoch milliseconds, identical on every database.

The job row is the delivery queue: workers claim from a partial index over
``stage='enqueued'``. Features add nullable columns, so a plain job's insert
never names them.
"""

from __future__ import annotations

from .dashboard import Dashboard, DashboardStat, QueueSample
from .fan_in import FanIn
from .jobs import Job, JobIdField, StageCount, TaskResult
from .partitions import Partition, PartitionSequence, Topic
from .retained_log import LogConsumer, LogPartition, LogRecord, LogTopic
from .schedules import Schedule
from .servers import Lease, MaintenanceRun, QueueState, Server

__all__ = [
    "JobIdField",
    "Job",
    "StageCount",
    "Server",
    "MaintenanceRun",
    "Lease",
    "QueueState",
    "Topic",
    "PartitionSequence",
    "Partition",
    "Schedule",
    "TaskResult",
    "FanIn",
    "LogTopic",
    "LogPartition",
    "LogRecord",
    "LogConsumer",
    "Dashboard",
    "DashboardStat",
    "QueueSample",
]
