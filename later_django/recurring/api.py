"""The public API of recurring jobs: register, remove and list schedules.

Each call writes through the LATER database connection of the calling
thread, in one transaction (a savepoint inside the caller's atomic block),
after every argument was checked: bad input writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction
from django.db.backends.utils import CursorWrapper

from later_django import events, schema
from later_django.builder import JobBuilder
from later_django.clock import to_datetime
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.db.rows import ScheduleKey, ScheduleWrite
from later_django.ids import JobId
from later_django.job_writes import tell_on_commit
from later_django.options import EnqueueOptions
from later_django.partitions.reserved import recurring_lane
from later_django.recurring import cron as cron_mod
from later_django.recurring.firing import insert_occurrence
from later_django.types import RecurringSchedule

MAX_IDENTIFIER_LENGTH = 255


def enqueue_recurring_sequential(
    identifier: str, payload: object, cron: str, *, tz: object = None, priority: int = 0
) -> JobId | None:
    """Like :func:`enqueue_recurring`, but occurrences never overlap: each
    goes into the partition of a reserved topic keyed by ``identifier``, so
    an occurrence (and the jobs chained to it with
    ``enqueue_recurring_continue``) runs only after the previous one
    finished. Needs LATER["RECURRING_SEQUENTIAL_PARTITIONS"] (ValueError
    otherwise, nothing written)."""
    return _save(identifier, payload, cron, tz=tz, priority=priority, sequential=True)


def enqueue_recurring(
    identifier: str, payload: object, cron: str, *, tz: object = None, priority: int = 0
) -> JobId | None:
    """Run a job of ``payload`` at every fire time of ``cron``, under ``identifier``.

    ``cron`` has 5 fields (minute hour day month weekday), or 6 with seconds
    first, read in ``tz`` (an IANA zone name or ZoneInfo; UTC when None).
    The same identifier, cron and zone again updates the payload and
    priority in place and returns None: safe on every start-up. Otherwise
    the next occurrence is enqueued (delayed) and its id returned; those the
    old cron had enqueued ahead are cancelled. Bad input raises as enqueue()
    does, and writes nothing.
    """
    return _save(identifier, payload, cron, tz=tz, priority=priority, sequential=False)


def _save(
    identifier: str, payload: object, cron: str, *, tz: object, priority: int, sequential: bool
) -> JobId | None:
    key = _key(identifier)
    lane = recurring_lane(key.namespace, identifier) if sequential else None
    parsed = cron_mod.parse(cron, tz)
    # Every check comes before the first write.
    job = JobBuilder().build(payload, EnqueueOptions(priority=priority))
    with _transaction() as (dialect, cursor):
        first = parsed.next_after(dialect.clock_now(cursor))
        write = ScheduleWrite(
            key=key,
            cron=parsed.expr,
            zone=parsed.zone,
            type_name=job.type_name,
            payload=job.payload,
            priority=job.priority,
            retry_policy=job.retry_policy,
            first_job_id=job.id,
            first_run_ms=first,
            next_run_ms=parsed.next_after(first),
            sequential=sequential,
        )
        if not dialect.schedules.schedule_save(cursor, write):
            return None
        dialect.schedules.cancel_occurrences(cursor, key, conf.millis("DASHBOARD_RETENTION"))
        job = job._replace(run_at_ms=first)
        stage = insert_occurrence(dialect, cursor, job, key.identifier, lane)
    if events.JobEnqueued in events.listening:
        tell_on_commit(conf.database, [job], stage)
    return JobId(job.id)


def remove_recurring(identifier: str) -> bool:
    """Stop schedule ``identifier``; return whether it existed.

    Its occurrences enqueued ahead (not due yet) are cancelled in the same
    transaction; an occurrence already due or running is left to finish.
    """
    key = _key(identifier)
    with _transaction() as (dialect, cursor):
        if not dialect.schedules.schedule_remove(cursor, key):
            return False
        dialect.schedules.cancel_occurrences(cursor, key, conf.millis("DASHBOARD_RETENTION"))
        return True


def list_recurring() -> list[RecurringSchedule]:
    """Every schedule of this namespace, by identifier (never a payload)."""
    alias = conf.database
    try:
        with connections[alias].cursor() as cursor:
            rows = dialect_for(alias).schedules.schedule_list(cursor, namespace=conf.namespace)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    return [
        RecurringSchedule(
            identifier=row.identifier,
            cron=row.cron,
            zone=row.zone,
            type_name=row.type_name,
            priority=row.priority,
            next_run_at=to_datetime(row.next_run_ms),
            last_job_id=JobId(row.last_job_id) if row.last_job_id else None,
            last_run_at=None if row.last_run_ms is None else to_datetime(row.last_run_ms),
        )
        for row in rows
    ]


@contextmanager
def _transaction() -> Iterator[tuple[Dialect, CursorWrapper]]:
    """A transaction on the LATER database (a savepoint inside the caller's
    atomic block) and a cursor in it; a missing table raises NotMigrated."""
    alias = conf.database
    db = connections[alias]
    try:
        with transaction.atomic(using=alias, savepoint=db.in_atomic_block), db.cursor() as cursor:
            yield dialect_for(alias), cursor
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise


def _key(identifier: object) -> ScheduleKey:
    if not isinstance(identifier, str):
        raise TypeError(f"identifier must be a str, got {type(identifier).__name__}")
    if not identifier.strip() or len(identifier) > MAX_IDENTIFIER_LENGTH:
        raise ValueError(
            f"identifier={identifier[:40]!r} must be 1..{MAX_IDENTIFIER_LENGTH} characters "
            "and not blank; name the schedule, e.g. 'nightly-report'"
        )
    return ScheduleKey(namespace=conf.namespace, identifier=identifier)


aenqueue_recurring = sync_to_async(enqueue_recurring)
aenqueue_recurring_sequential = sync_to_async(enqueue_recurring_sequential)
aremove_recurring = sync_to_async(remove_recurring)
alist_recurring = sync_to_async(list_recurring)
