"""The public read API: one job's state and history, and counts per stage."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections

from later_django import schema
from later_django.clock import to_datetime
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.ids import JobId, as_job_id
from later_django.types import JobInfo, StageChange


def _opt_datetime(ms: int | None):  # type: ignore[no-untyped-def]
    return None if ms is None else to_datetime(ms)


def parse_history(history: str) -> tuple[StageChange, ...]:
    changes = []
    for entry in history.split(";"):
        if entry:
            stage, _, at = entry.partition("@")
            changes.append(StageChange(stage=stage, at=to_datetime(int(at))))
    return tuple(changes)


def get_job(job_id: str) -> JobInfo | None:
    """Return the job's stage, attempts, times, history and parents, or None
    if unknown."""
    from later_django.models import FanIn, Job  # models load after the app registry

    job_id = as_job_id(job_id)
    alias = conf.database
    parents: tuple[JobId, ...] = ()
    try:
        row = (
            Job.objects.using(alias)
            .filter(namespace=conf.namespace, id=job_id)
            .defer("payload")
            .first()
        )
        if row is not None and row.parent_id:
            # Only a continuation can be a fan-in job: no other job pays this read.
            listed = FanIn.objects.using(alias).filter(child_id=job_id).order_by("parent_id")
            parents = tuple(JobId(p) for p in listed.values_list("parent_id", flat=True))
            parents = parents or (JobId(row.parent_id),)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    if row is None:
        return None
    return JobInfo(
        id=JobId(row.id),
        type_name=row.type_name,
        stage=row.stage,
        priority=row.priority,
        attempts=row.attempts - (row.uncounted or 0),  # claims given back do not count
        created_at=to_datetime(row.created_ms),
        run_at=to_datetime(row.run_at_ms),
        started_at=_opt_datetime(row.started_ms),
        finished_at=_opt_datetime(row.finished_ms),
        expires_at=_opt_datetime(row.expires_ms),
        last_error=row.last_error,
        parent_id=JobId(row.parent_id) if row.parent_id else None,
        history=parse_history(row.history),
        recurring=row.recurring,
        topic=row.topic,
        partition=row.partition,
        sequence=row.sequence,
        unique_key=row.unique_key,
        parents=parents,
    )


def stage_counts() -> dict[str, int]:
    """Return the exact number of jobs per stage in this namespace.

    Read from counters kept in the same transaction as every change, so the
    cost does not grow with the number of jobs.
    """
    alias = conf.database
    try:
        with connections[alias].cursor() as cursor:
            return dialect_for(alias).reads.stage_counts(cursor, namespace=conf.namespace)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise


aget_job = sync_to_async(get_job)
astage_counts = sync_to_async(stage_counts)
