"""The scheduler: the maintenance step that enqueues the occurrences schedules owe.

Every server runs it each tick. A schedule's occurrences are enqueued and its
next fire time moved in one transaction whose first write is a
compare-and-swap on the version read (skipping rows another server holds on
PostgreSQL), so however many servers fire at once each occurrence is
enqueued exactly once, and a process killed half-way leaves nothing behind.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.backends.utils import CursorWrapper

from later_django import events
from later_django.db.base import Dialect
from later_django.db.rows import DueSchedule, PartitionSlot, ScheduleAdvance
from later_django.ids import new_job_ids
from later_django.partitions.reserved import recurring_lane
from later_django.recurring import cron as cron_mod
from later_django.types import NewJob, PartitionLane

logger = logging.getLogger(__name__)

# Occurrences one schedule enqueues per tick; a schedule owing more (a
# one-second cron after a long tick) catches up over the next ticks.
MAX_OCCURRENCES = 100


def fire_schedules(
    dialect: Dialect,
    cursor: CursorWrapper,
    *,
    alias: str,
    ahead_ms: int,
    grace_ms: int,
    namespace: str,
) -> int:
    """Enqueue every occurrence due within ``ahead_ms``; return how many."""
    fired = 0
    for schedule in dialect.schedule_due(cursor, namespace=namespace, ahead_ms=ahead_ms):
        try:
            owed = cron_mod.due(
                cron_mod.Cron(schedule.cron, schedule.zone),
                schedule.next_run_ms,
                now_ms=schedule.now_ms,
                ahead_ms=ahead_ms,
                grace_ms=grace_ms,
                limit=MAX_OCCURRENCES,
            )
        except (ValueError, KeyError) as exc:
            # A zone this host's tz database lacks (ZoneInfoNotFoundError is a
            # KeyError), or a cron its croniter cannot read: a server that can
            # fires it; the error says which host to fix.
            logger.error(
                "cannot compute the fire times of schedule %r (%s, %s): %s",
                schedule.key.identifier,
                schedule.cron,
                schedule.zone,
                exc,
                extra={"action": "schedule_error", "schedule": schedule.key.identifier},
            )
            continue
        fired += _enqueue(dialect, cursor, alias, schedule, owed)
    return fired


def _enqueue(
    dialect: Dialect, cursor: CursorWrapper, alias: str, schedule: DueSchedule, owed: cron_mod.Due
) -> int:
    jobs = [
        NewJob(
            id=job_id,
            namespace=schedule.key.namespace,
            type_name=schedule.type_name,
            payload=schedule.payload,
            priority=schedule.priority,
            retry_policy=schedule.retry_policy,
            run_at_ms=fire_ms,
        )
        for job_id, fire_ms in zip(new_job_ids(len(owed.fire_ms)), owed.fire_ms, strict=True)
    ]
    advance = ScheduleAdvance(
        key=schedule.key,
        version=schedule.version,
        next_run_ms=owed.next_run_ms,
        last_job_id=jobs[-1].id,
        last_run_ms=owed.fire_ms[-1],
    )
    identifier = schedule.key.identifier
    with transaction.atomic(using=alias):
        if not dialect.schedule_advance(cursor, advance):
            return 0  # another server fired it, or it changed since it was read
        try:
            lane = (
                recurring_lane(schedule.key.namespace, identifier) if schedule.sequential else None
            )
        except ValueError as exc:  # the setting was removed: the schedule waits for it
            logger.error(
                "cannot enqueue sequential schedule %r: %s",
                identifier,
                exc,
                extra={"action": "schedule_error", "schedule": identifier},
            )
            return 0
        stages = [insert_occurrence(dialect, cursor, job, identifier, lane) for job in jobs]
        if events.active:
            transaction.on_commit(lambda: _tell(jobs, stages), using=alias)
    if owed.skipped:
        logger.warning(
            "schedule %r missed %d occurrences by more than LATER['RECURRING_MISSED_GRACE'] "
            "(no server ran); enqueued the latest of them once",
            identifier,
            owed.skipped + 1,
            extra={"action": "schedule_missed", "schedule": identifier},
        )
    return len(jobs)


def insert_occurrence(
    dialect: Dialect,
    cursor: CursorWrapper,
    job: NewJob,
    identifier: str,
    lane: PartitionLane | None,
) -> str:
    """Insert an occurrence of schedule ``identifier``; a sequential one at
    the next sequence of ``lane``'s partition."""
    if lane is None:
        return dialect.job_insert_occurrence(cursor, job, identifier)
    slot = PartitionSlot(lane, dialect.partition_next_sequence(cursor, lane))
    return dialect.job_insert_occurrence(cursor, job, identifier, slot)


def _tell(jobs: list[NewJob], stages: list[str]) -> None:
    for job, stage in zip(jobs, stages, strict=True):
        events.emit(events.JobEnqueued(job.id, job.type_name, stage, job.namespace))
