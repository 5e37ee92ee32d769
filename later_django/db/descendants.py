"""What a finished job does to the jobs waiting on it: its waiting
descendants failed, a fan-in child resolved by all its parents, an orphan
released or failed.

Functions, not a store: every store that finishes a job runs them (enqueue
when it settles a child, the worker's hot path, an operator's control,
upkeep, schedules, partitions), so none calls into another store for them.
They run the vendor's walks (statements.Walks) and sql/descendants.py's
statements on the caller's cursor, in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import FanInResolution, Orphan
from later_django.db.sql import descendants as descendants_sql
from later_django.db.statements import Statements, run
from later_django.states import PARENT_FAILED, PARENT_MISSING, Stage


def fail_descendants(
    sql: Statements,
    cursor: CursorWrapper,
    *,
    job_id: str,
    retention_ms: int,
    error: str = PARENT_FAILED,
) -> None:
    """Fail the waiting continuations of ``job_id``, and theirs, with
    ``error``: those of one parent and fan-in children alike, whichever
    parent they wait on."""
    run(cursor, sql, sql.walks.fail, job_id=job_id, retention_ms=retention_ms, error=error)


def resolve_fan_in(
    sql: Statements, cursor: CursorWrapper, child_ids: Sequence[str], *, retention_ms: int
) -> FanInResolution:
    """Resolve the waiting fan-in children ``child_ids`` by all their
    parents: fail those with a parent failed or cancelled (and their
    waiting descendants), release those whose every parent succeeded,
    and make the others wait on an unfinished parent when the one they
    waited on finished. Run in one transaction."""
    if not child_ids:
        return FanInResolution()
    run(
        cursor,
        sql,
        descendants_sql.FAN_IN_FAIL,
        retention_ms=retention_ms,
        error=PARENT_FAILED,
        child_ids=child_ids,
    )
    failed = tuple(str(row[0]) for row in cursor.fetchall())
    for job_id in failed:
        fail_descendants(sql, cursor, job_id=job_id, retention_ms=retention_ms)
    run(cursor, sql, descendants_sql.FAN_IN_RELEASE, child_ids=child_ids)
    released = int(cursor.rowcount)
    if released < len(child_ids) - len(failed):
        run(cursor, sql, descendants_sql.FAN_IN_REPOINT, child_ids=child_ids)
    return FanInResolution(released=released, failed=failed)


def resolve_orphan(
    sql: Statements, cursor: CursorWrapper, orphan: Orphan, *, retention_ms: int
) -> None:
    """Release ``orphan`` (its parent succeeded) or fail it and its waiting
    descendants; resolve a fan-in child by all its parents (it waits on
    another one while one has not finished). Run in one transaction."""
    if orphan.fan_in:
        resolve_fan_in(sql, cursor, [orphan.job_id], retention_ms=retention_ms)
        return
    if orphan.parent_stage == Stage.SUCCESS:
        run(cursor, sql, descendants_sql.RELEASE_ONE, job_id=orphan.job_id)
        return
    reason = PARENT_FAILED if orphan.parent_stage else PARENT_MISSING
    run(
        cursor,
        sql,
        descendants_sql.FAIL_WAITING,
        retention_ms=retention_ms,
        error=reason,
        job_id=orphan.job_id,
    )
    fail_descendants(sql, cursor, job_id=orphan.job_id, retention_ms=retention_ms)
