"""The scheduler: the maintenance step that enqueues the occurrences schedules owe.

Every server runs it each tick. A schedule's occurrences are enqueued and its
next fire time moved in one transaction whose first write is a
compare-and-swap on the version read (skipping rows another server holds on
PostgreSQL), so however many servers fire at once each occurrence is
enqueued exactly once, and a process killed half-way leaves nothing behind.
A server that cannot place a schedule's occurrences writes nothing for it.
"""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.db.backends.utils import CursorWrapper

from later_django import codec, events, limits, queue_names, registry
from later_django.db.base import Dialect
from later_django.db.rows import DueSchedule, PartitionSlot, ScheduleAdvance, ScheduleKey
from later_django.ids import new_job_ids
from later_django.partitions.reserved import (
    NEEDS_PARTITIONS,
    recurring_lane,
    recurring_partitions,
)
from later_django.recurring import cron as cron_mod
from later_django.types import NewJob, PartitionLane

logger = logging.getLogger(__name__)

# Occurrences one schedule enqueues per tick; a schedule owing more (a
# one-second cron after a long tick) catches up over the next ticks.
MAX_OCCURRENCES = 100

# How often a process repeats that a sequential schedule waits for
# RECURRING_SEQUENTIAL_PARTITIONS; forgotten once the schedule fires here.
WAITING_LOG_INTERVAL_SECONDS = 3600

# Schedule → when this process last logged that it waits (time.monotonic()).
_waiting_logged: dict[ScheduleKey, float] = {}


def fire_schedules(
    dialect: Dialect,
    cursor: CursorWrapper,
    *,
    alias: str,
    ahead_ms: int,
    grace_ms: int,
    namespace: str,
) -> int:
    """Enqueue every occurrence due within ``ahead_ms``; return how many.

    A server without RECURRING_SEQUENTIAL_PARTITIONS (a mixed rollout)
    leaves sequential schedules as they are, so a server with the setting
    fires what they owe, and says once an hour which wait."""
    fired = 0
    sequential = recurring_partitions() is not None
    for schedule in dialect.schedules.schedule_due(
        cursor, namespace=namespace, ahead_ms=ahead_ms, sequential=sequential
    ):
        lane = _lane(schedule)
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
        fired += _enqueue(dialect, cursor, alias, schedule, owed, lane)
    if not sequential:
        for key in dialect.schedules.schedule_sequential_due(
            cursor, namespace=namespace, ahead_ms=ahead_ms
        ):
            _log_waiting(key)
    return fired


def _lane(schedule: DueSchedule) -> PartitionLane | None:
    """The partition a schedule's occurrences go to (None: a plain one)."""
    if not schedule.sequential:
        return None
    lane = recurring_lane(schedule.key.namespace, schedule.key.identifier)
    _waiting_logged.pop(schedule.key, None)
    return lane


def _log_waiting(key: ScheduleKey) -> None:
    # Every tick reads a waiting schedule again: say why it waits once per
    # schedule per WAITING_LOG_INTERVAL_SECONDS, not once per tick.
    now = time.monotonic()
    logged = _waiting_logged.get(key)
    if logged is not None and now - logged < WAITING_LOG_INTERVAL_SECONDS:
        return
    _waiting_logged[key] = now
    logger.error(
        "sequential schedule %r waits: this server cannot enqueue it (%s); "
        "a server with the setting fires what it owes",
        key.identifier,
        NEEDS_PARTITIONS,
        extra={"action": "schedule_error", "schedule": key.identifier},
    )


def _enqueue(
    dialect: Dialect,
    cursor: CursorWrapper,
    alias: str,
    schedule: DueSchedule,
    owed: cron_mod.Due,
    lane: PartitionLane | None,
) -> int:
    # The queue its type's @job names on this server (the default queue's
    # when this server does not know the type).
    handler = registry.handler_by_name(schedule.type_name)
    queue = None if handler is None else handler.queue
    key, key_limit = None, None
    if handler is not None and handler.concurrency is not None and lane is None:
        key, key_limit = _concurrency_key(handler, schedule), handler.concurrency
        if key is None:
            return 0
    jobs = [
        NewJob(
            id=job_id,
            namespace=schedule.key.namespace,
            type_name=schedule.type_name,
            payload=schedule.payload,
            priority=schedule.priority,
            retry_policy=schedule.retry_policy,
            run_at_ms=fire_ms,
            queue=None if lane is not None else queue,
            concurrency_key=key,
            concurrency_limit=key_limit,
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
        if not dialect.schedules.schedule_advance(cursor, advance):
            return 0  # another server fired it, or it changed since it was read
        stages = [insert_occurrence(dialect, cursor, job, identifier, lane) for job in jobs]
        if events.JobEnqueued in events.listening:
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


def _concurrency_key(handler: registry.Handler, schedule: DueSchedule) -> str | None:
    """The concurrency key of the schedule's occurrences (its payload is
    fixed), or None, logged, when it cannot be had: the schedule then waits,
    as enqueue_recurring() would have refused it."""
    try:
        payload = codec.decode(schedule.payload, handler.payload_type)
        return limits.key_of(handler.concurrency_key, payload, handler.name)
    except Exception as exc:  # noqa: BLE001  one schedule's fault stops no other
        logger.error(
            "schedule %r waits: the concurrency key of its payload could not be had (%s)",
            schedule.key.identifier,
            exc,
            extra={"action": "schedule_key_error", "schedule": schedule.key.identifier},
        )
        return None


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
        return dialect.schedules.insert_occurrence(cursor, job, identifier)
    slot = PartitionSlot(lane, dialect.partitions.partition_next_sequence(cursor, lane))
    return dialect.schedules.insert_occurrence(cursor, job, identifier, slot)


def _tell(jobs: list[NewJob], stages: list[str]) -> None:
    for job, stage in zip(jobs, stages, strict=True):
        queue = queue_names.name_of(job.queue)
        events.emit(events.JobEnqueued(job.id, job.type_name, stage, job.namespace, queue))
