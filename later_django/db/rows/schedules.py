"""What the schedule operations take and return: a schedule's key, its
registration and advance, and the rows list_recurring() and the scheduler read.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- parameters ------------------------------------------------------------------------


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


# -- rows ------------------------------------------------------------------------------


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
