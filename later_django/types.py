"""Value objects passed between the API, the store and the worker."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import NamedTuple

from later_django.ids import JobId


# Per-job records are named tuples: immutable, and built in a fraction of a
# frozen dataclass's time, which shows at thousands a second.
class NewJob(NamedTuple):
    """A job row about to be inserted. Its times come from the database's
    clock when the row is written: it is due ``delay_ms`` after that, or at
    ``run_at_ms`` (epoch ms) when that is set."""

    id: str
    namespace: str
    type_name: str
    payload: bytes
    priority: int
    retry_policy: str | None
    parent_id: str | None = None
    run_at_ms: int | None = None
    delay_ms: int = 0
    # How long one attempt may run, when the enqueue said; None: the
    # handler's own timeout, if it has one.
    timeout_ms: int | None = None
    # Its named queue; None: the default queue.
    queue: str | None = None
    # Its unique key, and the length of its uniqueness window in ms
    # (docs/how-to/unique-jobs.md); None: not unique, no window.
    unique_key: str | None = None
    unique_for_ms: int | None = None
    # Its concurrency key and limit when its type has one; None otherwise.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    # A fan-in job's parents (two or more, distinct); ``parent_id`` is then
    # the first of them. None for every other job.
    parents: tuple[str, ...] | None = None


class PartitionLane(NamedTuple):
    """A partition of a topic in a namespace and, once a poller holds its
    lease, the lease's fencing epoch."""

    namespace: str
    topic: str
    partition: int
    epoch: int = 0


class ClaimedJob(NamedTuple):
    """A job a worker holds a lease on, as returned by the claim."""

    id: str
    type_name: str
    payload: bytes
    attempts: int
    retry_policy: str | None
    created_ms: int
    run_at_ms: int
    # A partition job's partition and lease: its outcome is stored only
    # while that lease holds. None for a plain job.
    lane: PartitionLane | None = None
    # Claims that did not count as attempts (given back): see ``attempt``.
    uncounted: int = 0
    # The timeout its enqueue gave it (None: the handler's, if any).
    timeout_ms: int | None = None

    @property
    def attempt(self) -> int:
        """The attempt as the handler and its retry policy count it (from 1);
        ``attempts`` is the claim's fence."""
        return self.attempts - self.uncounted


class Claim(NamedTuple):
    """One delivery of a job: (job id, attempt). Every claim adds one to the
    job's attempts, so the pair fences every write made for that delivery.
    Equal to the plain tuple (job id, attempt), and hashed the same."""

    job_id: str
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StageChange:
    """One entry of ``JobInfo.history``: the stage a job entered, and when
    (on the database's clock)."""

    stage: str
    at: dt.datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class JobInfo:
    """What get_job() returns: a job's state and history, never its payload."""

    id: JobId
    type_name: str
    stage: str
    priority: int
    attempts: int
    created_at: dt.datetime
    run_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    expires_at: dt.datetime | None
    last_error: str | None
    # The parent a continuation waits on (a fan-in job's: the one it waits
    # on now, or the last one it waited on).
    parent_id: JobId | None
    history: tuple[StageChange, ...]
    topic: str | None = None
    partition: int | None = None
    sequence: int | None = None
    # The identifier of the schedule this job is an occurrence of.
    recurring: str | None = None
    # Its unique key (docs/how-to/unique-jobs.md), if it was enqueued with one.
    unique_key: str | None = None
    # Every parent it runs after, in id order: a fan-in job's, a
    # continuation's one, none for other jobs (docs/how-to/fan-in.md).
    parents: tuple[JobId, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionStats:
    """What partition_stats() returns for one partition: ``depth``, its
    unfinished jobs; ``head_run_at_ms``, when its head is due; ``owner`` and
    ``epoch``, who holds or last held its lease (None once released), valid
    until ``lease_expires_ms``."""

    topic: str
    partition: int
    next_sequence: int
    head_sequence: int | None
    head_run_at_ms: int | None
    head_stage: str | None
    owner: str | None
    epoch: int
    lease_expires_ms: int

    @property
    def depth(self) -> int:
        if self.head_sequence is None:
            return 0
        return self.next_sequence - self.head_sequence


@dataclass(frozen=True, slots=True, kw_only=True)
class RecurringSchedule:
    """What list_recurring() returns for one schedule: never its payload.

    ``zone`` is the IANA name its cron is read in; ``next_run_at`` the next
    fire time not enqueued yet; ``last_job_id`` and ``last_run_at`` the last
    occurrence enqueued and its fire time (occurrences due soon are enqueued
    ahead, so that may lie in the future)."""

    identifier: str
    cron: str
    zone: str
    type_name: str
    priority: int
    next_run_at: dt.datetime
    last_job_id: JobId | None
    last_run_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class PartitionLocal:
    """What a worker's partition claimer knows of itself, for a scrape."""

    active: dict[str, int]
    workers: int
    # (family, topic, outcome) -> count; family: claims, heads, renewals.
    counts: dict[tuple[str, str, str], int]
