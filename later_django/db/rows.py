"""What the dialect's operations take and return, as frozen, slotted value objects.

An operation that needs more than three values takes them grouped here, and
one that answers with more than one value returns a row from here, never a
bare tuple. The per-job records of the hot path (NewJob, ClaimedJob, Claim)
are named tuples in later_django.types instead: thousands are built a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

from later_django.types import ClaimedJob, PartitionLane

# -- parameters -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRequest:
    """Up to ``limit`` ready jobs of ``namespace``, leased to ``owner`` for
    ``lease_ms`` from the database's now."""

    namespace: str
    owner: str
    limit: int
    lease_ms: int


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
class Heartbeat:
    """A running server, as ``later_server`` records it."""

    server_id: str
    namespace: str
    hostname: str
    pid: int
    workers: int
    # Runs partition pollers (LATER["TOPICS"] is set): may win partitions.
    topics: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRequest:
    """Take or renew the lease ``name`` for ``owner`` until the database's now
    plus ``ttl_ms``."""

    namespace: str
    name: str
    owner: str
    ttl_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldLease:
    """The lease ``name`` as (``owner``, ``epoch``) holds it: the fence of
    writes made under it."""

    namespace: str
    name: str
    owner: str
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleKey:
    """The schedule ``identifier`` of ``namespace``."""

    namespace: str
    identifier: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleWrite:
    """A schedule to register or update. ``first_job_id`` and ``first_run_ms``
    are the occurrence a new schedule (or a new cron) starts with;
    ``next_run_ms`` is the fire time after it."""

    key: ScheduleKey
    cron: str
    zone: str
    type_name: str
    payload: bytes
    priority: int
    retry_policy: str | None
    first_job_id: str
    first_run_ms: int
    next_run_ms: int
    sequential: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleAdvance:
    """Move a schedule read at ``version`` past the occurrence ``last_job_id``
    (fired at ``last_run_ms``) to ``next_run_ms``."""

    key: ScheduleKey
    version: int
    next_run_ms: int
    last_job_id: str
    last_run_ms: int


# -- rows ---------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Orphan:
    """A waiting continuation whose parent finished (``parent_stage``) or is
    gone (None)."""

    job_id: str
    parent_stage: str | None


class PartitionSlot(NamedTuple):
    """Where a partition job goes: its partition and its sequence there."""

    lane: PartitionLane
    sequence: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionClaimRequest:
    """A poller's claim of a partition's head: its lease for ``owner``
    (``partition_lease_ms``), the head's job lease (``job_lease_ms``), and
    how long a silent owner's heartbeat stays live (``server_ttl_ms``)."""

    lane: PartitionLane
    owner: str
    partition_lease_ms: int
    job_lease_ms: int
    server_ttl_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadFailure:
    """force_fail_partition_head: fail the head of ``lane``'s partition (only
    if it is ``job_id``, when given) with ``error``."""

    lane: PartitionLane
    error: str
    retention_ms: int
    job_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionCompletion:
    """The success of ``job``, a partition head ``owner`` claimed."""

    job: ClaimedJob
    owner: str
    retention_ms: int


class PartitionClaim(NamedTuple):
    """A partition lease taken or kept at ``epoch``, and the head claimed
    under it (None when the head is not ready)."""

    epoch: int
    job: ClaimedJob | None


class PartitionHead(NamedTuple):
    """A partition and its head job (None when it has no unfinished job)."""

    topic: str
    partition: int
    job_id: str | None
    stage: str | None


def claimed_jobs(rows: Sequence[Sequence[Any]]) -> list[ClaimedJob]:
    """Claim rows as ClaimedJobs; a claim returns ClaimedJob's fields in order."""
    return [
        ClaimedJob(r[0], r[1], bytes(r[2]), r[3], r[4], r[5], r[6], uncounted=r[7] or 0)
        for r in rows
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleInfo:
    """A schedule as list_recurring() shows it: never its payload."""

    identifier: str
    cron: str
    zone: str
    type_name: str
    priority: int
    next_run_ms: int
    last_job_id: str | None
    last_run_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DueSchedule:
    """A schedule owing an occurrence soon, as read at ``version`` when the
    database's clock said ``now_ms``."""

    key: ScheduleKey
    cron: str
    zone: str
    type_name: str
    payload: bytes
    priority: int
    retry_policy: str | None
    next_run_ms: int
    version: int
    now_ms: int
    sequential: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskAttemptEnd:
    """The end of an attempt of a Django Tasks job, stored in one statement."""

    job_id: str
    attempt: int  # the fence: nothing is stored once the job is past it
    # The worker ids before this attempt as JSON without its closing bracket
    # ('[' or '["a",'): the lease holder's id is added in SQL.
    earlier_workers: str
    errors: str  # JSON list of {"exception_class_path", "traceback"}
    return_value: str | None  # JSON, once the attempt succeeded


# -- the retained log ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LogTopicRow:
    """A retained-log topic as stored; ``retention_ms`` None keeps records forever."""

    name: str
    partitions: int
    retention_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPartitionKey:
    """One partition of a retained-log topic."""

    namespace: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAdvance:
    """Reserve ``count`` offsets of ``key``'s partition, whose topic must be
    stored with ``partitions`` partitions."""

    key: LogPartitionKey
    count: int
    partitions: int


class NewLogRecord(NamedTuple):
    """A record to store at ``offset`` of ``partition`` (a named tuple:
    append_many builds thousands)."""

    partition: int
    offset: int
    key: bytes
    value: bytes


class StoredRecord(NamedTuple):
    """A record as read back, its time on the database's clock."""

    offset: int
    key: bytes
    value: bytes
    appended_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRead:
    """Up to ``limit`` records of ``key``'s partition from ``from_offset`` on."""

    key: LogPartitionKey
    from_offset: int
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPrune:
    """Delete the records of ``key``'s partition older than ``older_than_ms``,
    looking at its first ``limit`` records only."""

    key: LogPartitionKey
    older_than_ms: int
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConsumerKey:
    """A consumer group's place in one partition of a topic."""

    namespace: str
    topic: str
    group: str
    partition: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLeaseRequest:
    """Take ``key``'s lease for ``member`` until the database's now plus ``ttl_ms``."""

    key: LogConsumerKey
    member: str
    ttl_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogFence:
    """A consumer lease as its holder knows it: writes hold only at ``epoch``."""

    key: LogConsumerKey
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogCommit:
    """Store ``next_offset`` under ``fence`` and renew the lease for ``ttl_ms``."""

    fence: LogFence
    next_offset: int
    ttl_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAcquired:
    """A lease just taken: its epoch and the group's committed offset."""

    epoch: int
    committed_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConsumerState:
    """A consumer row as stored, and its partition's end (next offset)."""

    epoch: int
    committed_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLag:
    """Records of ``partition`` a group has not committed yet."""

    group: str
    partition: int
    lag: int


@dataclass(frozen=True, slots=True)
class StatRow:
    """One flush: what this server's workers did since the previous one."""

    started: int
    succeeded: int
    retried: int
    failed: int
    regular_waits: str
    regular_sum_ms: int
    regular_max_ms: int
    partition_waits: str
    partition_sum_ms: int
    partition_max_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JobQuery:
    """One page of the dashboard's job list: jobs of ``stage`` (or every
    stage for an id search), optionally of one type, topic and partition,
    after the keyset cursor ``after``."""

    namespace: str
    stage: str | None
    type_name: str | None = None
    topic: str | None = None
    partition: int | None = None
    id_prefix: str | None = None
    after: tuple[Any, ...] | None = None
    page_size: int = 50
    # Index entries one page looks at when a filter the index cannot serve
    # (a type, say) is set: a page costs this much at most, at any backlog.
    scan_limit: int = 2000


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


@dataclass(frozen=True, slots=True)
class JobPage:
    """A page of jobs; ``after`` is the cursor of the next page (None at the
    end). ``scanned_out`` says the page stopped at ``scan_limit`` entries
    before it was full: more may match beyond ``after``."""

    jobs: list[JobSummary]
    after: tuple[Any, ...] | None
    scanned_out: bool


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
    lane: str  # '' plain, 'partition'
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
