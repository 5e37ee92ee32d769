"""Maintenance of ``later_job`` rows (``dialect.upkeep``): due jobs made
ready, stuck jobs found, orphaned continuations resolved, finished jobs
pruned, the stage counters folded.

The rescue of a stuck job stores its retry or failure through the worker's
fenced writes (db/hot.py), with a fence of an expired lease; failing a
job's waiting descendants is db/descendants.py's, which every store that
finishes a job runs, so it is no operation of this store. The promotion's
statement and the counters' folding differ per vendor.
"""

from __future__ import annotations

import abc
from typing import ClassVar

from django.db.backends.utils import CursorWrapper

from later_django.db.descendants import resolve_orphan
from later_django.db.rows import Orphan, StuckJob
from later_django.db.sql import Statement
from later_django.db.sql import upkeep as upkeep_sql
from later_django.db.statements import Operations


class UpkeepStore(Operations, abc.ABC):
    """The maintenance steps' operations on jobs."""

    # The promotion of due jobs, in the vendor's form.
    promote_due_statement: ClassVar[Statement]

    def next_due_in(self, cursor: CursorWrapper, *, namespace: str) -> int | None:
        """Milliseconds until the first delayed or requeued job of
        ``namespace`` is due (<= 0 when one already is); None when none waits."""
        self._run(cursor, upkeep_sql.NEXT_DUE, namespace=namespace)
        row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def promote_due(self, cursor: CursorWrapper, *, namespace: str, limit: int) -> int:
        """Make up to ``limit`` delayed or requeued jobs whose time has come
        ready; return how many."""
        self._run(cursor, self.promote_due_statement, namespace=namespace, limit=limit)
        return int(cursor.rowcount)

    def stuck(
        self, cursor: CursorWrapper, *, namespace: str, expired_for_ms: int, limit: int
    ) -> list[StuckJob]:
        """Running jobs whose lease expired at least ``expired_for_ms`` ago."""
        self._run(
            cursor,
            upkeep_sql.STUCK,
            namespace=namespace,
            expired_for_ms=expired_for_ms,
            limit=limit,
        )
        return [
            StuckJob(
                id=r[0],
                type_name=r[1],
                attempts=r[2],
                retry_policy=r[3],
                attempt=r[2] - r[4],
                cancel_requested=bool(r[5]),
            )
            for r in cursor.fetchall()
        ]

    def orphans(self, cursor: CursorWrapper, *, namespace: str, limit: int) -> list[Orphan]:
        """Waiting continuations whose parent is finished or gone, and
        fan-in children with a parent failed or cancelled."""
        self._run(cursor, upkeep_sql.ORPHANS, namespace=namespace, limit=limit)
        return [
            Orphan(job_id=r[0], parent_stage=r[1], fan_in=bool(r[2])) for r in cursor.fetchall()
        ]

    def resolve_orphan(self, cursor: CursorWrapper, orphan: Orphan, *, retention_ms: int) -> None:
        """Release ``orphan`` (its parent succeeded) or fail it and its waiting
        descendants; resolve a fan-in child by all its parents (it waits on
        another one while one has not finished). Run in one transaction."""
        resolve_orphan(self._sql, cursor, orphan, retention_ms=retention_ms)

    def prune(self, cursor: CursorWrapper, *, namespace: str, limit: int) -> int:
        """Delete up to ``limit`` finished jobs past their retention, and the
        task results of those that were tasks; return how many jobs.

        Run it in a transaction: a result must not outlive its job."""
        self._run(cursor, upkeep_sql.PRUNE, namespace=namespace, limit=limit)
        rows = cursor.fetchall()
        pruned = [row[0] for row in rows]
        if pruned:
            self._run(cursor, upkeep_sql.PRUNE_TASK_RESULTS, job_ids=pruned)
        # A fan-in child's parent list goes with it; only continuations have one.
        continuations = [row[0] for row in rows if row[1]]
        if continuations:
            self._run(cursor, upkeep_sql.PRUNE_FAN_IN, job_ids=continuations)
        return len(pruned)

    @abc.abstractmethod
    def counter_compact(self, cursor: CursorWrapper, *, namespace: str) -> int:
        """Fold the stage counter rows of ``namespace`` together; return how
        many rows were folded."""
