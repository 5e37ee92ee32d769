"""The dialect interface, and the SQL both databases share.

Each method is one operation on later's tables, run on a Django cursor of
the LATER database; callers own the transaction. Vendor files override only
what differs (row locking, triggers, notifications).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.clock import history_entry
from later_django.states import PARENT_FAILED, Stage
from later_django.types import ClaimedJob, NewJob, StuckJob

if TYPE_CHECKING:
    from psycopg import AsyncCursor

INSERT_COLUMNS: Final = (
    "id, namespace, type_name, payload, stage, priority, attempts, retry_policy, "
    "parent_id, created_ms, run_at_ms, changed_ms, history"
)
INSERT_ROW: Final = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"

# The child's stage follows its parent's, read in the same statement so a
# parent finishing concurrently cannot miss the new child.
JOB_INSERT_CONTINUATION_SQL: Final = f"""
INSERT INTO later_job ({INSERT_COLUMNS}, finished_ms, expires_ms, last_error)
SELECT %s, p.namespace, %s, %s, p.child_stage, %s, 0, %s, p.id, %s, %s, %s,
       p.child_stage || %s,
       CASE WHEN p.child_stage = 'failed' THEN %s END,
       CASE WHEN p.child_stage = 'failed' THEN %s END,
       CASE WHEN p.child_stage = 'failed' THEN '{PARENT_FAILED}' END
FROM (
    SELECT id, namespace, CASE stage
        WHEN 'success' THEN 'enqueued'
        WHEN 'failed' THEN 'failed'
        WHEN 'cancelled' THEN 'failed'
        ELSE 'waiting' END AS child_stage
    FROM later_job WHERE id = %s AND namespace = %s {{lock}}
) p
RETURNING stage
"""

# Fences: the worker's own finish must still hold the lease it claimed; the
# rescuer may only act on a lease that is still expired when it writes. A
# lease exists only while a job runs (a check constraint says so), so the
# fence alone finds a running job, by primary key: a "stage = 'running'"
# term would lead the planner to the small partial index of running jobs,
# slow while it holds dead entries between vacuums.
OWNER_FENCE: Final = "lease_owner = %s AND attempts = %s"
EXPIRED_FENCE: Final = "lease_expires_ms < %s AND attempts = %s"

JOB_COMPLETE_SQL: Final = """
UPDATE later_job SET stage = 'success', changed_ms = %s, finished_ms = %s,
    expires_ms = %s, lease_owner = NULL, lease_expires_ms = NULL,
    history = history || %s
WHERE id = %s AND {fence}
"""

# Many successes in one statement: each row is fenced by its own attempt.
# The plain "id IN" finds the rows by primary key; a row-value IN alone
# would make SQLite scan the whole table.
JOB_COMPLETE_MANY_SQL: Final = """
UPDATE later_job SET stage = 'success', changed_ms = %s, finished_ms = %s,
    expires_ms = %s, lease_owner = NULL, lease_expires_ms = NULL,
    history = history || %s
WHERE id IN ({ids}) AND (id, attempts) IN (VALUES {pairs}) AND lease_owner = %s
RETURNING id
"""

JOB_RELEASE_CHILDREN_OF_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = %s, run_at_ms = %s,
    history = history || %s
WHERE parent_id IN ({ids}) AND stage = 'waiting'
"""

# Gives back a job that was claimed but never started (its worker went away
# first), as if the claim had not happened.
JOB_UNCLAIM_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = %s, attempts = attempts - 1,
    lease_owner = NULL, lease_expires_ms = NULL, history = history || %s
WHERE id = %s AND attempts = %s AND lease_owner = %s
"""

JOB_RETRY_SQL: Final = """
UPDATE later_job SET stage = 'requeued', changed_ms = %s, run_at_ms = %s,
    last_error = %s, retry_policy = COALESCE(%s, retry_policy),
    lease_owner = NULL, lease_expires_ms = NULL, history = history || %s
WHERE id = %s AND {fence}
"""

JOB_FAIL_SQL: Final = """
UPDATE later_job SET stage = 'failed', changed_ms = %s, finished_ms = %s,
    expires_ms = %s, last_error = %s, lease_owner = NULL,
    lease_expires_ms = NULL, history = history || %s
WHERE id = %s AND {fence}
"""

JOB_RELEASE_CHILDREN_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = %s, run_at_ms = %s,
    history = history || %s
WHERE parent_id = %s AND stage = 'waiting'
"""

# Continuations of continuations fail too: a chain never waits on a parent
# that can no longer succeed.
JOB_FAIL_DESCENDANTS_SQL: Final = """
WITH RECURSIVE d(id) AS (
    SELECT id FROM later_job WHERE parent_id = %s AND stage = 'waiting'
    UNION
    SELECT j.id FROM later_job j JOIN d ON j.parent_id = d.id
    WHERE j.stage = 'waiting'
)
UPDATE later_job SET stage = 'failed', changed_ms = %s, finished_ms = %s,
    expires_ms = %s, last_error = %s, history = history || %s
WHERE id IN (SELECT id FROM d) AND stage = 'waiting'
"""

JOB_CANCEL_SQL: Final = """
UPDATE later_job SET stage = 'cancelled', changed_ms = %s, finished_ms = %s,
    expires_ms = %s, history = history || %s
WHERE id = %s AND namespace = %s
  AND stage IN ('enqueued', 'delayed', 'waiting', 'requeued')
"""

JOB_RENEW_SQL: Final = """
UPDATE later_job SET lease_expires_ms = %s
WHERE id IN ({ids}) AND lease_owner = %s
RETURNING id
"""

# Servers pruning at once skip each other's rows instead of queueing on them.
JOB_PRUNE_SQL: Final = """
DELETE FROM later_job WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND expires_ms IS NOT NULL AND expires_ms <= %s
    LIMIT %s {skip_locked})
"""

JOB_ORPHANS_SQL: Final = """
SELECT c.id, p.stage FROM later_job c
LEFT JOIN later_job p ON p.id = c.parent_id
WHERE c.namespace = %s AND c.stage = 'waiting'
  AND (p.id IS NULL OR p.stage IN ('success', 'failed', 'cancelled'))
LIMIT %s
"""

JOB_READY_EXISTS_SQL: Final = """
SELECT 1 FROM later_job WHERE namespace = %s AND stage = 'enqueued' LIMIT 1
"""

STAGE_COUNTS_SQL: Final = """
SELECT stage, SUM(n) FROM later_stage_count WHERE namespace = %s GROUP BY stage
"""

SERVER_HEARTBEAT_SQL: Final = """
INSERT INTO later_server (id, namespace, hostname, pid, workers, started_ms, heartbeat_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (id) DO UPDATE SET workers = excluded.workers,
    heartbeat_ms = excluded.heartbeat_ms
"""

MAINTENANCE_CLAIM_SQL: Final = """
INSERT INTO later_maintenance (namespace, step, last_run_ms) VALUES (%s, %s, %s)
ON CONFLICT (namespace, step) DO UPDATE SET last_run_ms = excluded.last_run_ms
WHERE later_maintenance.last_run_ms <= %s
RETURNING 1
"""


class Dialect:
    """SQL operations on later's tables for one database vendor."""

    vendor: ClassVar[str]
    # Can a claim skip rows another worker holds, instead of waiting on them?
    supports_skip_locked: ClassVar[bool] = False
    # Can a worker be woken by the database, or must it poll?
    supports_listen: ClassVar[bool] = False
    # Can the worker's claims and completions run on an asyncio connection of
    # its own, in the event loop (ajob_claim, ajob_complete_many)? Else they
    # hop to a thread holding a Django connection.
    supports_async_connection: ClassVar[bool] = False
    # Does the database take one writer at a time? Then a server writes through
    # one connection: two of its own would only wait on each other's lock.
    single_writer: ClassVar[bool] = False
    # Does job_complete_many run as one statement (no transaction needed)?
    atomic_complete_many: ClassVar[bool] = False
    # How many rows one multi-row INSERT carries.
    insert_batch_size: ClassVar[int] = 500
    # Appended to SELECTs that pick rows to change, where the vendor locks rows.
    skip_locked: ClassVar[str] = ""
    parent_lock: ClassVar[str] = ""

    # -- schema ---------------------------------------------------------------
    # The triggers ``install`` creates.
    trigger_names: ClassVar[frozenset[str]] = frozenset()

    def install(self, cursor: CursorWrapper) -> None:
        """Create or replace the triggers and vendor objects; idempotent."""
        raise NotImplementedError

    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        """Names of the triggers this dialect installs that exist now."""
        raise NotImplementedError

    # -- jobs -----------------------------------------------------------------
    def job_insert_one(self, db: BaseDatabaseWrapper, job: NewJob) -> None:
        """Insert ``job`` through the Django connection ``db`` (in its transaction)."""
        self.job_insert_many(db, [job])

    def job_insert_many(self, db: BaseDatabaseWrapper, jobs: Iterable[NewJob]) -> None:
        """Insert ``jobs`` through ``db``, in as few statements as the database allows.

        ``jobs`` may be built while it is consumed: an exception from it
        propagates, and the caller's transaction rolls the rows back."""
        remaining = iter(jobs)
        with db.cursor() as cursor:
            while batch := list(itertools.islice(remaining, self.insert_batch_size)):
                params: list[Any] = []
                for job in batch:
                    params += insert_row(job)
                values = ", ".join([INSERT_ROW] * len(batch))
                cursor.execute(f"INSERT INTO later_job ({INSERT_COLUMNS}) VALUES {values}", params)

    def job_insert_continuation(
        self, cursor: CursorWrapper, job: NewJob, expires_ms: int
    ) -> str | None:
        """Insert ``job`` as a child of ``job.parent_id``; return its stage,
        or None when the parent does not exist in the namespace."""
        now = job.created_ms
        cursor.execute(
            JOB_INSERT_CONTINUATION_SQL.format(lock=self.parent_lock),
            [
                job.id,
                job.type_name,
                job.payload,
                job.priority,
                job.retry_policy,
                now,
                now,
                now,
                f"@{now};",
                now,
                expires_ms,
                job.parent_id,
                job.namespace,
            ],
        )
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def job_claim(
        self,
        cursor: CursorWrapper,
        *,
        namespace: str,
        owner: str,
        limit: int,
        now_ms: int,
        lease_until_ms: int,
    ) -> list[ClaimedJob]:
        raise NotImplementedError

    async def ajob_claim(
        self,
        cursor: AsyncCursor[Any],
        *,
        namespace: str,
        owner: str,
        limit: int,
        now_ms: int,
        lease_until_ms: int,
    ) -> list[ClaimedJob]:
        """job_claim on an asyncio connection (supports_async_connection)."""
        raise NotImplementedError

    async def ajob_complete_many(
        self,
        cursor: AsyncCursor[Any],
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        now_ms: int,
        expires_ms: int,
    ) -> tuple[list[str], int]:
        """job_complete_many on an asyncio connection (supports_async_connection)."""
        raise NotImplementedError

    def job_renew(
        self,
        cursor: CursorWrapper,
        *,
        owner: str,
        job_ids: Sequence[str],
        lease_until_ms: int,
    ) -> list[str]:
        """Extend the leases ``owner`` holds on ``job_ids``; return the ids it still holds."""
        if not job_ids:
            return []
        ids = ", ".join(["%s"] * len(job_ids))
        cursor.execute(JOB_RENEW_SQL.format(ids=ids), [lease_until_ms, *job_ids, owner])
        return [str(row[0]) for row in cursor.fetchall()]

    def job_complete(
        self,
        cursor: CursorWrapper,
        *,
        job_id: str,
        owner: str,
        attempts: int,
        now_ms: int,
        expires_ms: int,
    ) -> bool:
        cursor.execute(
            JOB_COMPLETE_SQL.format(fence=OWNER_FENCE),
            [
                now_ms,
                now_ms,
                expires_ms,
                history_entry(Stage.SUCCESS, now_ms),
                job_id,
                owner,
                attempts,
            ],
        )
        if cursor.rowcount != 1:
            return False
        cursor.execute(
            JOB_RELEASE_CHILDREN_SQL,
            [now_ms, now_ms, history_entry(Stage.ENQUEUED, now_ms), job_id],
        )
        return True

    def job_complete_many(
        self,
        cursor: CursorWrapper,
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        now_ms: int,
        expires_ms: int,
    ) -> tuple[list[str], int]:
        """Mark each (id, attempts) that ``owner`` still holds as succeeded and
        release their continuations; return the completed ids and how many
        continuations became ready."""
        if not jobs:
            return [], 0
        ids = ", ".join(["%s"] * len(jobs))
        pairs = ", ".join(["(%s, %s)"] * len(jobs))
        params: list[Any] = [now_ms, now_ms, expires_ms, history_entry(Stage.SUCCESS, now_ms)]
        params += [job_id for job_id, _ in jobs]
        for job_id, attempts in jobs:
            params += [job_id, attempts]
        cursor.execute(JOB_COMPLETE_MANY_SQL.format(ids=ids, pairs=pairs), [*params, owner])
        done = [str(row[0]) for row in cursor.fetchall()]
        if not done:
            return done, 0
        ids = ", ".join(["%s"] * len(done))
        cursor.execute(
            JOB_RELEASE_CHILDREN_OF_SQL.format(ids=ids),
            [now_ms, now_ms, history_entry(Stage.ENQUEUED, now_ms), *done],
        )
        return done, int(cursor.rowcount)

    def job_unclaim(
        self, cursor: CursorWrapper, *, job_id: str, attempts: int, owner: str, now_ms: int
    ) -> bool:
        cursor.execute(
            JOB_UNCLAIM_SQL,
            [now_ms, history_entry(Stage.ENQUEUED, now_ms), job_id, attempts, owner],
        )
        return bool(cursor.rowcount == 1)

    def job_retry(
        self,
        cursor: CursorWrapper,
        *,
        job_id: str,
        attempts: int,
        now_ms: int,
        run_at_ms: int,
        error: str,
        retry_policy: str | None,
        owner: str | None = None,
        expired_before_ms: int | None = None,
    ) -> bool:
        fence, fence_value = self._fence(owner, expired_before_ms)
        cursor.execute(
            JOB_RETRY_SQL.format(fence=fence),
            [
                now_ms,
                run_at_ms,
                error,
                retry_policy,
                history_entry(Stage.REQUEUED, now_ms),
                job_id,
                fence_value,
                attempts,
            ],
        )
        return bool(cursor.rowcount == 1)

    def job_fail(
        self,
        cursor: CursorWrapper,
        *,
        job_id: str,
        attempts: int,
        now_ms: int,
        expires_ms: int,
        error: str,
        owner: str | None = None,
        expired_before_ms: int | None = None,
    ) -> bool:
        fence, fence_value = self._fence(owner, expired_before_ms)
        cursor.execute(
            JOB_FAIL_SQL.format(fence=fence),
            [
                now_ms,
                now_ms,
                expires_ms,
                error,
                history_entry(Stage.FAILED, now_ms),
                job_id,
                fence_value,
                attempts,
            ],
        )
        if cursor.rowcount != 1:
            return False
        self.job_fail_descendants(cursor, job_id=job_id, now_ms=now_ms, expires_ms=expires_ms)
        return True

    @staticmethod
    def _fence(owner: str | None, expired_before_ms: int | None) -> tuple[str, str | int]:
        if owner is not None:
            return OWNER_FENCE, owner
        if expired_before_ms is None:
            raise ValueError("a fenced write needs an owner or an expiry cut-off")
        return EXPIRED_FENCE, expired_before_ms

    def job_fail_descendants(
        self,
        cursor: CursorWrapper,
        *,
        job_id: str,
        now_ms: int,
        expires_ms: int,
        reason: str = PARENT_FAILED,
    ) -> int:
        cursor.execute(
            JOB_FAIL_DESCENDANTS_SQL,
            [job_id, now_ms, now_ms, expires_ms, reason, history_entry(Stage.FAILED, now_ms)],
        )
        return int(cursor.rowcount)

    def job_release_children(self, cursor: CursorWrapper, *, job_id: str, now_ms: int) -> int:
        cursor.execute(
            JOB_RELEASE_CHILDREN_SQL,
            [now_ms, now_ms, history_entry(Stage.ENQUEUED, now_ms), job_id],
        )
        return int(cursor.rowcount)

    def job_cancel(
        self,
        cursor: CursorWrapper,
        *,
        namespace: str,
        job_id: str,
        now_ms: int,
        expires_ms: int,
    ) -> bool:
        cursor.execute(
            JOB_CANCEL_SQL,
            [now_ms, now_ms, expires_ms, history_entry(Stage.CANCELLED, now_ms), job_id, namespace],
        )
        if cursor.rowcount != 1:
            return False
        self.job_fail_descendants(cursor, job_id=job_id, now_ms=now_ms, expires_ms=expires_ms)
        return True

    def job_promote_due(
        self, cursor: CursorWrapper, *, namespace: str, now_ms: int, limit: int
    ) -> int:
        cursor.execute(
            f"""
            UPDATE later_job SET stage = 'enqueued', changed_ms = %s,
                history = history || %s
            WHERE id IN (
                SELECT id FROM later_job
                WHERE namespace = %s AND stage IN ('delayed', 'requeued')
                  AND run_at_ms <= %s
                ORDER BY run_at_ms LIMIT %s {self.skip_locked})
              AND stage IN ('delayed', 'requeued')
            """,
            [now_ms, history_entry(Stage.ENQUEUED, now_ms), namespace, now_ms, limit],
        )
        return int(cursor.rowcount)

    def job_stuck(
        self, cursor: CursorWrapper, *, namespace: str, expired_before_ms: int, limit: int
    ) -> list[StuckJob]:
        cursor.execute(
            """
            SELECT id, type_name, attempts, retry_policy FROM later_job
            WHERE namespace = %s AND stage = 'running' AND lease_expires_ms < %s
            ORDER BY lease_expires_ms LIMIT %s
            """,
            [namespace, expired_before_ms, limit],
        )
        return [
            StuckJob(id=r[0], type_name=r[1], attempts=r[2], retry_policy=r[3])
            for r in cursor.fetchall()
        ]

    def job_orphans(
        self, cursor: CursorWrapper, *, namespace: str, limit: int
    ) -> list[tuple[str, str | None]]:
        """Waiting continuations whose parent is finished or gone."""
        cursor.execute(JOB_ORPHANS_SQL, [namespace, limit])
        return [(r[0], r[1]) for r in cursor.fetchall()]

    def job_resolve_orphan(
        self,
        cursor: CursorWrapper,
        *,
        job_id: str,
        parent_stage: str | None,
        now_ms: int,
        expires_ms: int,
    ) -> None:
        if parent_stage == Stage.SUCCESS:
            cursor.execute(
                """
                UPDATE later_job SET stage = 'enqueued', changed_ms = %s, run_at_ms = %s,
                    history = history || %s
                WHERE id = %s AND stage = 'waiting'
                """,
                [now_ms, now_ms, history_entry(Stage.ENQUEUED, now_ms), job_id],
            )
            return
        reason = PARENT_FAILED if parent_stage else "parent missing"
        cursor.execute(
            """
            UPDATE later_job SET stage = 'failed', changed_ms = %s, finished_ms = %s,
                expires_ms = %s, last_error = %s, history = history || %s
            WHERE id = %s AND stage = 'waiting'
            """,
            [now_ms, now_ms, expires_ms, reason, history_entry(Stage.FAILED, now_ms), job_id],
        )
        self.job_fail_descendants(cursor, job_id=job_id, now_ms=now_ms, expires_ms=expires_ms)

    def job_prune(self, cursor: CursorWrapper, *, namespace: str, now_ms: int, limit: int) -> int:
        cursor.execute(
            JOB_PRUNE_SQL.format(skip_locked=self.skip_locked), [namespace, now_ms, limit]
        )
        return int(cursor.rowcount)

    # -- change detection (databases that cannot notify) ----------------------
    # Does change_counter tell cheaply that another connection committed?
    supports_change_counter: ClassVar[bool] = False

    def change_counter(self, cursor: CursorWrapper) -> int:
        """A number that changes whenever another connection commits."""
        raise NotImplementedError

    def job_ready_exists(self, cursor: CursorWrapper, *, namespace: str) -> bool:
        """Is any job of ``namespace`` ready to claim? A read: takes no write lock."""
        cursor.execute(JOB_READY_EXISTS_SQL, [namespace])
        return cursor.fetchone() is not None

    # -- counters -------------------------------------------------------------
    def stage_counts(self, cursor: CursorWrapper, *, namespace: str) -> dict[str, int]:
        cursor.execute(STAGE_COUNTS_SQL, [namespace])
        counts = {stage.value: 0 for stage in Stage}
        for stage, n in cursor.fetchall():
            counts[stage] = int(n)
        return counts

    def counter_compact(self, cursor: CursorWrapper, *, namespace: str) -> int:
        """Fold counter rows together; return how many rows were folded."""
        return 0

    # -- servers and maintenance ----------------------------------------------
    def server_heartbeat(
        self,
        cursor: CursorWrapper,
        *,
        server_id: str,
        namespace: str,
        hostname: str,
        pid: int,
        workers: int,
        started_ms: int,
        now_ms: int,
    ) -> None:
        cursor.execute(
            SERVER_HEARTBEAT_SQL,
            [server_id, namespace, hostname, pid, workers, started_ms, now_ms],
        )

    def server_remove(self, cursor: CursorWrapper, *, server_id: str) -> None:
        cursor.execute("DELETE FROM later_server WHERE id = %s", [server_id])

    def server_prune(self, cursor: CursorWrapper, *, namespace: str, before_ms: int) -> int:
        cursor.execute(
            "DELETE FROM later_server WHERE namespace = %s AND heartbeat_ms < %s",
            [namespace, before_ms],
        )
        return int(cursor.rowcount)

    def maintenance_claim(
        self,
        cursor: CursorWrapper,
        *,
        namespace: str,
        step: str,
        now_ms: int,
        interval_ms: int,
    ) -> bool:
        """Record that ``step`` runs now, unless it ran less than ``interval_ms``
        ago anywhere in the namespace; return whether this caller should run it."""
        cursor.execute(MAINTENANCE_CLAIM_SQL, [namespace, step, now_ms, now_ms - interval_ms])
        return cursor.fetchone() is not None

    def vacuum(self, cursor: CursorWrapper) -> bool:
        """Compact the database file where that is a separate step."""
        return False

    # -- sizes ------------------------------------------------------------------
    def database_size(self, cursor: CursorWrapper) -> int | None:
        return None


def insert_row(job: NewJob) -> tuple[Any, ...]:
    """The values of INSERT_COLUMNS for a new job."""
    return (
        job.id,
        job.namespace,
        job.type_name,
        job.payload,
        job.stage,
        job.priority,
        0,
        job.retry_policy,
        job.parent_id,
        job.created_ms,
        job.run_at_ms,
        job.created_ms,
        history_entry(job.stage, job.created_ms),
    )


def claimed_jobs(rows: Sequence[Sequence[Any]]) -> list[ClaimedJob]:
    # Columns in CLAIM_RETURNING order, which is ClaimedJob's field order.
    return [ClaimedJob(r[0], r[1], bytes(r[2]), r[3], r[4], r[5], r[6]) for r in rows]


CLAIM_RETURNING: Final = "id, type_name, payload, attempts, retry_policy, created_ms, run_at_ms"
CLAIM_SET: Final = """
    stage = 'running', attempts = attempts + 1, changed_ms = %s, started_ms = %s,
    lease_owner = %s, lease_expires_ms = %s, history = history || %s
"""
