"""Operations on ``later_schedule`` (recurring jobs) and on the occurrences
its schedules enqueue into ``later_job``."""

from __future__ import annotations

from typing import Any

from django.db.backends.utils import CursorWrapper

from later_django.db.descendants import fail_descendants
from later_django.db.rows import (
    DueSchedule,
    PartitionSlot,
    ScheduleAdvance,
    ScheduleInfo,
    ScheduleKey,
    ScheduleWrite,
)
from later_django.db.sql import schedules as schedules_sql
from later_django.db.statements import Operations
from later_django.queue_names import column_value, name_of
from later_django.types import NewJob

# Schedules one scheduler pass reads; the rest wait for the next pass.
DUE_BATCH = 100


class ScheduleStore(Operations):
    """Registering, listing and firing schedules."""

    def schedule_save(self, cursor: CursorWrapper, write: ScheduleWrite) -> bool:
        """Register or update a schedule; return True when it is new or its
        cron or zone changed (it then starts at ``write.first_job_id``), False
        when only its payload and options were updated in place."""
        cursor.execute(
            self._sql(schedules_sql.SCHEDULE_SAVE_SQL),
            [
                write.key.namespace,
                write.key.identifier,
                write.cron,
                write.zone,
                write.type_name,
                write.payload,
                write.priority,
                write.retry_policy,
                write.next_run_ms,
                write.first_job_id,
                write.first_run_ms,
                write.sequential,
            ],
        )
        return bool(cursor.fetchone()[0] == write.first_job_id)

    def schedule_remove(self, cursor: CursorWrapper, key: ScheduleKey) -> bool:
        cursor.execute(
            self._sql(schedules_sql.SCHEDULE_REMOVE_SQL), [key.namespace, key.identifier]
        )
        return bool(cursor.rowcount == 1)

    def schedule_list(self, cursor: CursorWrapper, *, namespace: str) -> list[ScheduleInfo]:
        cursor.execute(self._sql(schedules_sql.SCHEDULE_LIST_SQL), [namespace])
        return [
            ScheduleInfo(
                identifier=r[0],
                cron=r[1],
                zone=r[2],
                type_name=r[3],
                priority=r[4],
                next_run_ms=r[5],
                last_job_id=r[6],
                last_run_ms=r[7],
            )
            for r in cursor.fetchall()
        ]

    def schedule_due(
        self, cursor: CursorWrapper, *, namespace: str, ahead_ms: int, sequential: bool
    ) -> list[DueSchedule]:
        """Schedules of ``namespace`` owing an occurrence within ``ahead_ms``
        of the database's now, the most overdue first, at most DUE_BATCH;
        sequential ones only when ``sequential``."""
        cursor.execute(
            self._sql(schedules_sql.SCHEDULE_DUE_SQL), [namespace, ahead_ms, sequential, DUE_BATCH]
        )
        return [
            DueSchedule(
                key=ScheduleKey(namespace=namespace, identifier=r[0]),
                cron=r[1],
                zone=r[2],
                type_name=r[3],
                payload=bytes(r[4]),
                priority=r[5],
                retry_policy=r[6],
                next_run_ms=r[7],
                version=r[8],
                now_ms=int(r[9]),
                sequential=bool(r[10]),
            )
            for r in cursor.fetchall()
        ]

    def schedule_sequential_due(
        self, cursor: CursorWrapper, *, namespace: str, ahead_ms: int
    ) -> list[ScheduleKey]:
        """The sequential schedules of ``namespace`` owing an occurrence
        within ``ahead_ms``, the most overdue first, at most DUE_BATCH."""
        cursor.execute(
            self._sql(schedules_sql.SCHEDULE_SEQUENTIAL_DUE_SQL), [namespace, ahead_ms, DUE_BATCH]
        )
        return [ScheduleKey(namespace=namespace, identifier=row[0]) for row in cursor.fetchall()]

    def schedule_advance(self, cursor: CursorWrapper, advance: ScheduleAdvance) -> bool:
        """Move a schedule on, only if it is still at ``advance.version``;
        return whether it moved (the caller then enqueues its occurrences in
        the same transaction)."""
        cursor.execute(
            self._sql(schedules_sql.SCHEDULE_ADVANCE_SQL),
            [
                advance.next_run_ms,
                advance.last_job_id,
                advance.last_run_ms,
                advance.key.namespace,
                advance.key.identifier,
                advance.version,
            ],
        )
        return bool(cursor.rowcount == 1)

    def job_insert_occurrence(
        self,
        cursor: CursorWrapper,
        job: NewJob,
        recurring: str,
        slot: PartitionSlot | None = None,
    ) -> str:
        """Insert an occurrence of schedule ``recurring``, due at exactly
        ``job.run_at_ms`` (at ``slot`` of the reserved topic for a sequential
        schedule); return its stage (enqueued when already due)."""
        params: list[Any] = [*job[:6], recurring]
        if slot is None and job.concurrency_key is not None:
            sql = schedules_sql.JOB_INSERT_KEYED_OCCURRENCE_SQL
            queue = column_value(name_of(job.queue))
            params += [queue, job.concurrency_key, job.concurrency_limit]
        elif slot is None and job.queue is not None:
            sql = schedules_sql.JOB_INSERT_QUEUED_OCCURRENCE_SQL
            params.append(job.queue)
        elif slot is None:
            sql = schedules_sql.JOB_INSERT_OCCURRENCE_SQL
        else:
            sql = schedules_sql.JOB_INSERT_SEQUENTIAL_OCCURRENCE_SQL
            params += [slot.lane.topic, slot.lane.partition, slot.sequence]
        cursor.execute(self._sql(sql), [*params, job.run_at_ms])
        return str(cursor.fetchone()[0])

    def job_cancel_occurrences(
        self, cursor: CursorWrapper, key: ScheduleKey, retention_ms: int
    ) -> int:
        """Cancel the occurrences of schedule ``key`` enqueued ahead and not
        due yet, and fail their waiting descendants, as control.cancel does; return
        how many were cancelled. Run in one transaction."""
        cursor.execute(
            self._sql(schedules_sql.JOB_CANCEL_OCCURRENCES_SQL),
            [retention_ms, key.namespace, key.identifier],
        )
        cancelled = [row[0] for row in cursor.fetchall()]
        for job_id in cancelled:
            fail_descendants(self._sql, cursor, job_id=job_id, retention_ms=retention_ms)
        return len(cancelled)
