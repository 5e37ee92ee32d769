"""Value objects passed between the API, the store and the worker."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import NamedTuple

from later_django.ids import JobId


# The per-job records are named tuples: as immutable as the frozen
# dataclasses below, but built in a fraction of the time (a frozen
# dataclass sets each field through object.__setattr__), which shows when
# thousands are made per second.
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


class ClaimedJob(NamedTuple):
    """A job a worker holds a lease on, as returned by the claim."""

    id: str
    type_name: str
    payload: bytes
    attempts: int
    retry_policy: str | None
    created_ms: int
    run_at_ms: int


class Claim(NamedTuple):
    """One delivery of a job: (job id, attempt). Every claim adds one to the
    job's attempts, so the pair fences every write made for that delivery.
    Equal to the plain tuple (job id, attempt), and hashed the same."""

    job_id: str
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StageChange:
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
    parent_id: JobId | None
    history: tuple[StageChange, ...]
    topic: str | None = None
    partition: int | None = None
    sequence: int | None = None
    # The identifier of the schedule this job is an occurrence of.
    recurring: str | None = None


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
