"""Operations on ``later_schedule`` (recurring jobs) and on the occurrences
its schedules enqueue into ``later_job``."""

from __future__ import annotations

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
        self._run(
            cursor,
            schedules_sql.SAVE,
            namespace=write.key.namespace,
            identifier=write.key.identifier,
            cron=write.cron,
            zone=write.zone,
            type_name=write.type_name,
            payload=write.payload,
            priority=write.priority,
            retry_policy=write.retry_policy,
            next_run_ms=write.next_run_ms,
            first_job_id=write.first_job_id,
            first_run_ms=write.first_run_ms,
            sequential=write.sequential,
        )
        return bool(cursor.fetchone()[0] == write.first_job_id)

    def schedule_remove(self, cursor: CursorWrapper, key: ScheduleKey) -> bool:
        self._run(cursor, schedules_sql.REMOVE, namespace=key.namespace, identifier=key.identifier)
        return bool(cursor.rowcount == 1)

    def schedule_list(self, cursor: CursorWrapper, *, namespace: str) -> list[ScheduleInfo]:
        self._run(cursor, schedules_sql.LIST, namespace=namespace)
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
        self._run(
            cursor,
            schedules_sql.DUE,
            namespace=namespace,
            ahead_ms=ahead_ms,
            with_sequential=sequential,
            limit=DUE_BATCH,
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
        self._run(
            cursor,
            schedules_sql.SEQUENTIAL_DUE,
            namespace=namespace,
            ahead_ms=ahead_ms,
            limit=DUE_BATCH,
        )
        return [ScheduleKey(namespace=namespace, identifier=row[0]) for row in cursor.fetchall()]

    def schedule_advance(self, cursor: CursorWrapper, advance: ScheduleAdvance) -> bool:
        """Move a schedule on, only if it is still at ``advance.version``;
        return whether it moved (the caller then enqueues its occurrences in
        the same transaction)."""
        self._run(
            cursor,
            schedules_sql.ADVANCE,
            next_run_ms=advance.next_run_ms,
            last_job_id=advance.last_job_id,
            last_run_ms=advance.last_run_ms,
            namespace=advance.key.namespace,
            identifier=advance.key.identifier,
            version=advance.version,
        )
        return bool(cursor.rowcount == 1)

    def insert_occurrence(
        self,
        cursor: CursorWrapper,
        job: NewJob,
        recurring: str,
        slot: PartitionSlot | None = None,
    ) -> str:
        """Insert an occurrence of schedule ``recurring``, due at exactly
        ``job.run_at_ms`` (at ``slot`` of the reserved topic for a sequential
        schedule: its own lane, no queue or concurrency key); return its
        stage (enqueued when already due)."""
        self._run(
            cursor,
            schedules_sql.INSERT_OCCURRENCE,
            job_id=job.id,
            namespace=job.namespace,
            type_name=job.type_name,
            payload=job.payload,
            priority=job.priority,
            retry_policy=job.retry_policy,
            run_at_ms=job.run_at_ms,
            recurring=recurring,
            queue="" if slot else column_value(name_of(job.queue)),
            concurrency_key=None if slot else job.concurrency_key,
            concurrency_limit=None if slot else job.concurrency_limit,
            topic=slot.lane.topic if slot else None,
            partition=slot.lane.partition if slot else None,
            sequence=slot.sequence if slot else None,
        )
        return str(cursor.fetchone()[0])

    def cancel_occurrences(self, cursor: CursorWrapper, key: ScheduleKey, retention_ms: int) -> int:
        """Cancel the occurrences of schedule ``key`` enqueued ahead and not
        due yet, and fail their waiting descendants, as control.cancel does; return
        how many were cancelled. Run in one transaction."""
        self._run(
            cursor,
            schedules_sql.CANCEL_OCCURRENCES,
            retention_ms=retention_ms,
            namespace=key.namespace,
            recurring=key.identifier,
        )
        cancelled = [row[0] for row in cursor.fetchall()]
        for job_id in cancelled:
            fail_descendants(self._sql, cursor, job_id=job_id, retention_ms=retention_ms)
        return len(cancelled)
