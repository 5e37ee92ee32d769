"""What the dashboard's read operations take and return: the job list's query
and pages, a job's detail, and the samples, servers and consumers it shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .servers import StatRow

# JobQuery.stage of the list of every job, in every stage, newest first.
RECENT = "recent"

# -- parameters ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobQuery:
    """One page of the dashboard's job list: jobs of ``stage`` (``RECENT``:
    every stage, newest first; None: every stage of an id search, or a
    topic's unfinished jobs), optionally of one type, topic and partition,
    after the keyset cursor ``after``."""

    namespace: str
    stage: str | None
    type_name: str | None = None
    topic: str | None = None
    partition: int | None = None
    id_prefix: str | None = None
    # The queue of the ``enqueued`` list (None: the default queue's): each
    # queue's ready jobs are a run of the ready index of their own.
    queue: str | None = None
    after: tuple[Any, ...] | None = None
    page_size: int = 50
    # Index entries one page looks at when a filter the index cannot serve
    # (a type, say) is set: a page costs this much at most, at any backlog.
    scan_limit: int = 2000


# -- rows ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job as the dashboard lists it: never its payload."""

    id: str
    type_name: str
    stage: str
    priority: int
    attempts: int
    created_ms: int
    run_at_ms: int
    changed_ms: int
    topic: str | None
    partition: int | None
    sequence: int | None
    failed_before: bool  # has a last error
    queue: str = "default"


@dataclass(frozen=True, slots=True)
class JobParent:
    """A parent of a fan-in job: its id, and the job while it is kept (None
    once pruned)."""

    id: str
    job: JobSummary | None


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of jobs; ``after`` is the cursor of the next page (None at the
    end). ``scanned_out`` says the page stopped at ``scan_limit`` entries
    before it was full: more may match beyond ``after``."""

    jobs: list[JobSummary]
    after: tuple[Any, ...] | None
    scanned_out: bool


@dataclass(frozen=True, slots=True)
class JobDetail:
    """Every column of a job but its payload."""

    id: str
    type_name: str
    stage: str
    priority: int
    attempts: int
    created_ms: int
    run_at_ms: int
    changed_ms: int
    started_ms: int | None
    finished_ms: int | None
    expires_ms: int | None
    lease_owner: str | None
    lease_expires_ms: int | None
    last_error: str | None
    history: str
    parent_id: str | None
    recurring: str | None
    topic: str | None
    partition: int | None
    sequence: int | None
    queue: str = "default"
    # Its unique key, and the start of its uniqueness window (unique_for).
    unique_key: str | None = None
    unique_slot_ms: int | None = None
    # Its concurrency key and the most jobs of it that run at once.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None


@dataclass(frozen=True, slots=True)
class StatReading:
    """A stored StatRow and when it was written."""

    at_ms: int
    stat: StatRow


@dataclass(frozen=True, slots=True)
class QueueSample:
    """A point of the queue-length graph (see later_queue_sample)."""

    at_ms: int
    ready: int
    scheduled: int
    running: int
    waiting: int
    partitioned: int


@dataclass(frozen=True, slots=True)
class LaneCount:
    lane: str  # '' the default queue, 'q:<name>' a named queue, 'partition'
    stage: str
    n: int


@dataclass(frozen=True, slots=True)
class LiveServer:
    id: str
    hostname: str
    pid: int
    workers: int
    topics: bool
    started_ms: int
    heartbeat_ms: int
    # The queues it serves, comma-separated; None: a server of a release
    # before queues (it claims from every queue and ignores pause).
    queues: str | None = None
    # The release it runs; None: a release before versions were recorded.
    version: str | None = None


@dataclass(frozen=True, slots=True)
class QueueStateRow:
    """A queue's row of later_queue: written by its first pause or
    rate-limited claim, and kept."""

    name: str
    paused: bool
    changed_ms: int
    # A rate-limited queue's last window (its end) and the starts in it.
    rate_window_end_ms: int | None = None
    rate_started: int | None = None


@dataclass(frozen=True, slots=True)
class RunningJob:
    id: str
    type_name: str
    owner: str
    started_ms: int | None
    topic: str | None
    partition: int | None


@dataclass(frozen=True, slots=True)
class LogConsumerRow:
    """A consumer group's place in a retained-log partition."""

    topic: str
    group: str
    partition: int
    committed_offset: int
    next_offset: int
    member: str
    epoch: int
    expires_ms: int
