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

from later_django.states import PARENT_FAILED, TERMINAL, Stage
from later_django.types import ClaimedJob, NewJob, StuckJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor

# later's tables, as its migrations create them.
TABLES: Final = (
    "later_job",
    "later_stage_count",
    "later_server",
    "later_maintenance",
    "later_topic",
    "later_lease",
)

INSERT_COLUMNS: Final = (
    "id, namespace, type_name, payload, stage, priority, attempts, retry_policy, "
    "parent_id, created_ms, run_at_ms, changed_ms, history"
)

# Every time written or compared below is the database's, never a host's:
# {now} is the database clock in epoch ms ({cutoff} the same, fixed for the
# statement, where it bounds an index search), so hosts with skewed clocks agree
# on when a lease expires or a job is due, and a stage's time is taken when
# its write runs, not before it waited for a lock. {stamp} is the time of a
# stage change: never before the row's previous change, so a job's history
# never goes backwards (two writers' clocks, or a writer that waited).
STAMP: Final = "{greatest}({now}, changed_ms)"

# One ready or delayed job. The stage follows from the database's clock:
# a run_at already past makes the job ready at once.
JOB_INSERT_SQL: Final = f"""
INSERT INTO later_job ({INSERT_COLUMNS})
SELECT %s, %s, %s, %s, t.stage, %s, 0, %s, NULL, t.now, t.run_at, t.now,
    t.stage || '@' || t.now || ';'
FROM (
    SELECT r.now, {{greatest}}(r.run_at, r.now) AS run_at,
        CASE WHEN r.run_at > r.now THEN 'delayed' ELSE 'enqueued' END AS stage
    FROM (
        SELECT n.now, COALESCE(%s, n.now + %s) AS run_at
        FROM (SELECT {{now}} AS now) n
    ) r
) t
"""

# Ready jobs in bulk: a row carries NewJob's first six fields (id, namespace,
# type_name, payload, priority, retry_policy); the rest is the clock.
INSERT_MANY_ROW: Final = (
    "(%s, %s, %s, %s, 'enqueued', %s, 0, %s, NULL, {now}, {now}, {now}, "
    "'enqueued@' || {now} || ';')"
)

# The child's stage follows its parent's, read in the same statement without
# a lock: a caller's transaction left open must not hold up the parent's
# renewal or completion. A parent that finishes while the child's
# transaction is still open is caught by job_settle_child after its commit.
JOB_INSERT_CONTINUATION_SQL: Final = f"""
INSERT INTO later_job ({INSERT_COLUMNS}, finished_ms, expires_ms, last_error)
SELECT %s, p.namespace, %s, %s, p.child_stage, %s, 0, %s, p.id, {{now}}, {{now}}, {{now}},
       p.child_stage || '@' || {{now}} || ';',
       CASE WHEN p.child_stage = 'failed' THEN {{now}} END,
       CASE WHEN p.child_stage = 'failed' THEN {{now}} + %s END,
       CASE WHEN p.child_stage = 'failed' THEN '{PARENT_FAILED}' END
FROM (
    SELECT id, namespace, CASE stage
        WHEN 'success' THEN 'enqueued'
        WHEN 'failed' THEN 'failed'
        WHEN 'cancelled' THEN 'failed'
        ELSE 'waiting' END AS child_stage
    FROM later_job WHERE id = %s AND namespace = %s
) p
RETURNING stage
"""

# Fences. A claim is (job id, attempt): every claim adds one to attempts, so
# a write made for an earlier claim of the same job, even by the same server,
# matches no row. The worker's own writes also name the owner; the rescuer's
# act only on a lease still expired when they run. A lease exists only while
# a job runs (a check constraint says so), so the fence alone finds a running
# job, by primary key: a "stage = 'running'" term would lead the planner to
# the small partial index of running jobs, slow while it holds dead entries
# between vacuums.
OWNER_FENCE: Final = "lease_owner = %s AND attempts = %s"
EXPIRED_FENCE: Final = "lease_expires_ms < {cutoff} - %s AND attempts = %s"

# Many successes in one statement: each row is fenced by its own attempt.
# The plain "id IN" finds the rows by primary key; a row-value IN alone
# would make SQLite scan the whole table.
JOB_COMPLETE_MANY_SQL: Final = """
UPDATE later_job SET stage = 'success', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'success@' || {stamp} || ';'
WHERE id IN ({ids}) AND (id, attempts) IN (VALUES {pairs}) AND lease_owner = %s
RETURNING id
"""

# Waiting continuations of parents that succeeded. A statement of its own,
# after the parents' completion: it sees every child committed before it
# runs, including one whose transaction was still open when the parents'
# completion began.
JOB_RELEASE_CHILDREN_OF_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = {stamp}, run_at_ms = {now},
    history = history || 'enqueued@' || {stamp} || ';'
WHERE parent_id IN ({ids}) AND stage = 'waiting'
"""

# Gives back a job that was claimed but never started (its worker went away
# first), as if the claim had not happened.
JOB_UNCLAIM_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = {stamp}, attempts = attempts - 1,
    lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'enqueued@' || {stamp} || ';'
WHERE id = %s AND attempts = %s AND lease_owner = %s
"""

JOB_RETRY_SQL: Final = """
UPDATE later_job SET stage = 'requeued', changed_ms = {stamp}, run_at_ms = {now} + %s,
    last_error = %s, retry_policy = COALESCE(%s, retry_policy),
    lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'requeued@' || {stamp} || ';'
WHERE id = %s AND {fence}
"""

JOB_FAIL_SQL: Final = """
UPDATE later_job SET stage = 'failed', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, last_error = %s, lease_owner = NULL,
    lease_expires_ms = NULL, history = history || 'failed@' || {stamp} || ';'
WHERE id = %s AND {fence}
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
UPDATE later_job SET stage = 'failed', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, last_error = %s,
    history = history || 'failed@' || {stamp} || ';'
WHERE id IN (SELECT id FROM d) AND stage = 'waiting'
"""

JOB_CANCEL_SQL: Final = """
UPDATE later_job SET stage = 'cancelled', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, history = history || 'cancelled@' || {stamp} || ';'
WHERE id = %s AND namespace = %s
  AND stage IN ('enqueued', 'delayed', 'waiting', 'requeued')
"""

# Fenced like every write of a claim: a renewal for attempt n never extends
# attempt n + 1 of the same job, so a handler of a recovered attempt learns
# that it lost its lease even when this server claimed the job again.
JOB_RENEW_SQL: Final = """
UPDATE later_job SET lease_expires_ms = {now} + %s
WHERE id IN ({ids}) AND (id, attempts) IN (VALUES {pairs}) AND lease_owner = %s
RETURNING id, attempts
"""

JOB_PROMOTE_DUE_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = {stamp},
    history = history || 'enqueued@' || {stamp} || ';'
WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND stage IN ('delayed', 'requeued') AND run_at_ms <= {cutoff}
    ORDER BY run_at_ms LIMIT %s {skip_locked})
  AND stage IN ('delayed', 'requeued')
"""

JOB_STUCK_SQL: Final = """
SELECT id, type_name, attempts, retry_policy FROM later_job
WHERE namespace = %s AND stage = 'running' AND lease_expires_ms < {cutoff} - %s
ORDER BY lease_expires_ms LIMIT %s
"""

# Servers pruning at once skip each other's rows instead of queueing on them.
JOB_PRUNE_SQL: Final = """
DELETE FROM later_job WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND expires_ms IS NOT NULL AND expires_ms <= {cutoff}
    LIMIT %s {skip_locked})
"""

JOB_ORPHANS_SQL: Final = """
SELECT c.id, p.stage FROM later_job c
LEFT JOIN later_job p ON p.id = c.parent_id
WHERE c.namespace = %s AND c.stage = 'waiting'
  AND (p.id IS NULL OR p.stage IN ('success', 'failed', 'cancelled'))
LIMIT %s
"""

# A continuation's parent, read after the continuation committed. The share
# lock (held for this one statement only) waits for a finish of the parent
# that is under way, so one of the two always sees the other.
JOB_PARENT_STAGE_SQL: Final = """
SELECT p.stage FROM later_job c JOIN later_job p ON p.id = c.parent_id
WHERE c.id = %s AND c.stage = 'waiting' {share_lock}
"""

JOB_RELEASE_ONE_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = {stamp}, run_at_ms = {now},
    history = history || 'enqueued@' || {stamp} || ';'
WHERE id = %s AND stage = 'waiting'
"""

JOB_FAIL_WAITING_SQL: Final = """
UPDATE later_job SET stage = 'failed', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, last_error = %s,
    history = history || 'failed@' || {stamp} || ';'
WHERE id = %s AND stage = 'waiting'
"""

JOB_READY_EXISTS_SQL: Final = """
SELECT 1 FROM later_job WHERE namespace = %s AND stage = 'enqueued' LIMIT 1
"""

STAGE_COUNTS_SQL: Final = """
SELECT stage, SUM(n) FROM later_stage_count WHERE namespace = %s GROUP BY stage
"""

SERVER_HEARTBEAT_SQL: Final = """
INSERT INTO later_server (id, namespace, hostname, pid, workers, started_ms, heartbeat_ms)
VALUES (%s, %s, %s, %s, %s, {now}, {now})
ON CONFLICT (id) DO UPDATE SET workers = excluded.workers,
    heartbeat_ms = excluded.heartbeat_ms
"""

SERVER_PRUNE_SQL: Final = """
DELETE FROM later_server WHERE namespace = %s AND heartbeat_ms < {cutoff} - %s
"""

# A new holder (no row, or the last one expired) gets the next epoch; the
# live holder renews and keeps its epoch; anyone else gets no row.
LEASE_ACQUIRE_SQL: Final = """
INSERT INTO later_lease (namespace, name, owner, epoch, expires_ms)
VALUES (%s, %s, %s, 1, {now} + %s)
ON CONFLICT (namespace, name) DO UPDATE SET
    epoch = later_lease.epoch + CASE
        WHEN later_lease.owner = excluded.owner AND later_lease.expires_ms >= {now}
        THEN 0 ELSE 1 END,
    owner = excluded.owner,
    expires_ms = excluded.expires_ms
WHERE later_lease.owner = excluded.owner OR later_lease.expires_ms < {now}
RETURNING epoch
"""

# Released leases expire at once; the row stays, so epochs keep growing.
LEASE_RELEASE_SQL: Final = """
UPDATE later_lease SET expires_ms = 0
WHERE namespace = %s AND name = %s AND owner = %s AND epoch = %s
"""

MAINTENANCE_CLAIM_SQL: Final = """
INSERT INTO later_maintenance (namespace, step, last_run_ms) VALUES (%s, %s, {now})
ON CONFLICT (namespace, step) DO UPDATE SET last_run_ms = excluded.last_run_ms
WHERE later_maintenance.last_run_ms <= {now} - %s
RETURNING 1
"""


class Dialect:
    """SQL operations on later's tables for one database vendor."""

    vendor: ClassVar[str]
    # Can a worker be woken by the database, or must it poll?
    supports_listen: ClassVar[bool] = False
    # Can the worker's claims and completions run on an asyncio connection of
    # its own, in the event loop (ajob_claim, ajob_complete_many)? Else they
    # run inline on a connection that never waits for a lock (SQLite).
    supports_async_connection: ClassVar[bool] = False
    # Does the database take one writer at a time? Then a server writes through
    # one connection: two of its own would only wait on each other's lock.
    single_writer: ClassVar[bool] = False
    # How many rows one multi-row INSERT carries.
    insert_batch_size: ClassVar[int] = 500
    # Does the database file need VACUUM from time to time (VACUUM_INTERVAL)?
    needs_vacuum: ClassVar[bool] = False
    # The database's clock as epoch milliseconds, an SQL expression.
    now_sql: ClassVar[str]
    # The same clock as a bound a WHERE clause can search an index with: fixed
    # for the whole statement (a volatile now_sql is not an index bound).
    cutoff_sql: ClassVar[str]
    # The larger of two values (GREATEST, or SQLite's two-argument MAX).
    greatest_sql: ClassVar[str] = "GREATEST"
    # Appended to SELECTs that pick rows to change, where the vendor locks rows.
    skip_locked: ClassVar[str] = ""
    # Appended to a read that must wait for a concurrent write of the row.
    share_lock: ClassVar[str] = ""

    def __init__(self) -> None:
        # Statements with the vendor's clock filled in, once per dialect.
        self.insert_sql = self.render(JOB_INSERT_SQL)
        self.insert_many_row = self.render(INSERT_MANY_ROW)
        self.insert_continuation_sql = self.render(JOB_INSERT_CONTINUATION_SQL)
        self.complete_many_sql = self.render(JOB_COMPLETE_MANY_SQL)
        self.release_children_of_sql = self.render(JOB_RELEASE_CHILDREN_OF_SQL)
        self.unclaim_sql = self.render(JOB_UNCLAIM_SQL)
        self.fail_descendants_sql = self.render(JOB_FAIL_DESCENDANTS_SQL)
        self.cancel_sql = self.render(JOB_CANCEL_SQL)
        self.renew_sql = self.render(JOB_RENEW_SQL)
        self.promote_due_sql = self.render(JOB_PROMOTE_DUE_SQL)
        self.stuck_sql = self.render(JOB_STUCK_SQL)
        self.prune_sql = self.render(JOB_PRUNE_SQL)
        self.parent_stage_sql = self.render(JOB_PARENT_STAGE_SQL)
        self.release_one_sql = self.render(JOB_RELEASE_ONE_SQL)
        self.fail_waiting_sql = self.render(JOB_FAIL_WAITING_SQL)
        self.heartbeat_sql = self.render(SERVER_HEARTBEAT_SQL)
        self.server_prune_sql = self.render(SERVER_PRUNE_SQL)
        self.maintenance_claim_sql = self.render(MAINTENANCE_CLAIM_SQL)
        self.lease_acquire_sql = self.render(LEASE_ACQUIRE_SQL)
        self.lease_release_sql = self.render(LEASE_RELEASE_SQL)
        self.retry_sql = {
            fenced_by: self.render(JOB_RETRY_SQL.replace("{fence}", fence))
            for fenced_by, fence in (("owner", OWNER_FENCE), ("expiry", EXPIRED_FENCE))
        }
        self.fail_sql = {
            fenced_by: self.render(JOB_FAIL_SQL.replace("{fence}", fence))
            for fenced_by, fence in (("owner", OWNER_FENCE), ("expiry", EXPIRED_FENCE))
        }

    def render(self, template: str) -> str:
        """``template`` with this vendor's clock and locking clauses filled in;
        per-call parts ({ids}, {pairs}) are left for the caller."""
        return (
            template.replace("{stamp}", STAMP)
            .replace("{greatest}", self.greatest_sql)
            .replace("{now}", self.now_sql)
            .replace("{cutoff}", self.cutoff_sql)
            .replace("{skip_locked}", self.skip_locked)
            .replace("{share_lock}", self.share_lock)
        )

    # -- schema ---------------------------------------------------------------
    # The triggers ``install`` creates.
    trigger_names: ClassVar[frozenset[str]] = frozenset()

    def install(self, cursor: CursorWrapper) -> None:
        """Create or replace the triggers and vendor objects; idempotent."""
        raise NotImplementedError

    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        """Names of the triggers this dialect installs that exist now."""
        raise NotImplementedError

    def database_exists(self, db: BaseDatabaseWrapper) -> bool:
        """Does the database of ``db`` exist? Answered without connecting where
        connecting would create it."""
        return True

    def missing_tables(self, cursor: CursorWrapper) -> list[str]:
        """The tables of TABLES that do not exist, in that order."""
        raise NotImplementedError

    def missing_table_error(self, db: BaseDatabaseWrapper, exc: BaseException) -> bool:
        """Did ``exc``, raised by a statement on ``db``, fail because one of
        later's tables does not exist?"""
        raise NotImplementedError

    # -- jobs -----------------------------------------------------------------
    def job_insert_one(self, db: BaseDatabaseWrapper, job: NewJob) -> str:
        """Insert a ready or delayed ``job`` through the Django connection
        ``db`` (in its transaction); return its stage."""
        with db.cursor() as cursor:
            cursor.execute(self.insert_sql + " RETURNING stage", insert_one_params(job))
            return str(cursor.fetchone()[0])

    def job_insert_many(self, db: BaseDatabaseWrapper, jobs: Iterable[NewJob]) -> None:
        """Insert ready ``jobs`` through ``db``, in as few statements as the
        database allows.

        ``jobs`` may be built while it is consumed: an exception from it
        propagates, and the caller's transaction rolls the rows back."""
        remaining = iter(jobs)
        with db.cursor() as cursor:
            while batch := list(itertools.islice(remaining, self.insert_batch_size)):
                params: list[Any] = []
                for job in batch:
                    params += job[:6]  # the values of INSERT_MANY_ROW
                values = ", ".join([self.insert_many_row] * len(batch))
                cursor.execute(f"INSERT INTO later_job ({INSERT_COLUMNS}) VALUES {values}", params)

    def job_insert_continuation(
        self, cursor: CursorWrapper, job: NewJob, retention_ms: int
    ) -> str | None:
        """Insert ``job`` as a child of ``job.parent_id``; return its stage,
        or None when the parent does not exist in the namespace."""
        cursor.execute(
            self.insert_continuation_sql,
            [
                job.id,
                job.type_name,
                job.payload,
                job.priority,
                job.retry_policy,
                retention_ms,
                job.parent_id,
                job.namespace,
            ],
        )
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def job_settle_child(self, cursor: CursorWrapper, *, job_id: str, retention_ms: int) -> str:
        """Release or fail the waiting continuation ``job_id`` if its parent
        has finished; return what happened ("released", "failed" or "waiting").

        Run after the continuation's transaction committed, in a transaction
        of its own: a parent that finished while that transaction was open
        could not see the child."""
        cursor.execute(self.parent_stage_sql, [job_id])
        row = cursor.fetchone()
        if row is None or row[0] not in TERMINAL:
            return "waiting"
        self.job_resolve_orphan(
            cursor, job_id=job_id, parent_stage=str(row[0]), retention_ms=retention_ms
        )
        return "released" if row[0] == Stage.SUCCESS else "failed"

    def job_claim(
        self, cursor: CursorWrapper, *, namespace: str, owner: str, limit: int, lease_ms: int
    ) -> list[ClaimedJob]:
        raise NotImplementedError

    async def ajob_claim(
        self, cursor: AsyncCursor[Any], *, namespace: str, owner: str, limit: int, lease_ms: int
    ) -> list[ClaimedJob]:
        """job_claim on an asyncio connection (supports_async_connection)."""
        raise NotImplementedError

    async def ajob_complete_many(
        self,
        conn: AsyncConnection[Any],
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        retention_ms: int,
    ) -> tuple[list[str], int]:
        """job_complete_many on an asyncio connection (supports_async_connection)."""
        raise NotImplementedError

    def job_renew(
        self,
        cursor: CursorWrapper,
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        lease_ms: int,
    ) -> list[tuple[str, int]]:
        """Extend the leases ``owner`` holds on the claims ``jobs`` (id,
        attempt) to the database's now plus ``lease_ms``; return the claims it
        still holds."""
        if not jobs:
            return []
        ids = ", ".join(["%s"] * len(jobs))
        pairs = ", ".join(["(%s, %s)"] * len(jobs))
        params: list[Any] = [lease_ms, *(job_id for job_id, _ in jobs)]
        for job_id, attempts in jobs:
            params += [job_id, attempts]
        cursor.execute(self.renew_sql.format(ids=ids, pairs=pairs), [*params, owner])
        return [(str(row[0]), int(row[1])) for row in cursor.fetchall()]

    def job_complete_many(
        self,
        cursor: CursorWrapper,
        *,
        owner: str,
        jobs: Sequence[tuple[str, int]],
        retention_ms: int,
    ) -> tuple[list[str], int]:
        """Mark each claim (id, attempt) that ``owner`` still holds as
        succeeded and release their continuations; return the completed ids
        and how many continuations became ready. Run in one transaction."""
        if not jobs:
            return [], 0
        ids = ", ".join(["%s"] * len(jobs))
        pairs = ", ".join(["(%s, %s)"] * len(jobs))
        params: list[Any] = [retention_ms, *(job_id for job_id, _ in jobs)]
        for job_id, attempts in jobs:
            params += [job_id, attempts]
        cursor.execute(self.complete_many_sql.format(ids=ids, pairs=pairs), [*params, owner])
        done = [str(row[0]) for row in cursor.fetchall()]
        if not done:
            return done, 0
        ids = ", ".join(["%s"] * len(done))
        cursor.execute(self.release_children_of_sql.format(ids=ids), done)
        return done, int(cursor.rowcount)

    def job_unclaim(self, cursor: CursorWrapper, *, job_id: str, attempts: int, owner: str) -> bool:
        cursor.execute(self.unclaim_sql, [job_id, attempts, owner])
        return bool(cursor.rowcount == 1)

    def job_retry(
        self,
        cursor: CursorWrapper,
        *,
        job_id: str,
        attempts: int,
        delay_ms: int,
        error: str,
        retry_policy: str | None,
        owner: str | None = None,
        expired_for_ms: int | None = None,
    ) -> bool:
        """Move claim (``job_id``, ``attempts``) to requeued, due ``delay_ms``
        from the database's now. Fenced by ``owner`` (the worker's own
        finish) or by a lease expired at least ``expired_for_ms`` ago (the
        rescuer); return whether the fence held."""
        fenced_by, fence_value = _fence(owner, expired_for_ms)
        cursor.execute(
            self.retry_sql[fenced_by],
            [delay_ms, error, retry_policy, job_id, fence_value, attempts],
        )
        return bool(cursor.rowcount == 1)

    def job_fail(
        self,
        cursor: CursorWrapper,
        *,
        job_id: str,
        attempts: int,
        retention_ms: int,
        error: str,
        owner: str | None = None,
        expired_for_ms: int | None = None,
    ) -> bool:
        """Fail claim (``job_id``, ``attempts``) and its waiting descendants;
        fenced as job_retry. Run in one transaction."""
        fenced_by, fence_value = _fence(owner, expired_for_ms)
        cursor.execute(
            self.fail_sql[fenced_by], [retention_ms, error, job_id, fence_value, attempts]
        )
        if cursor.rowcount != 1:
            return False
        self._fail_descendants(cursor, job_id=job_id, retention_ms=retention_ms)
        return True

    def _fail_descendants(self, cursor: CursorWrapper, *, job_id: str, retention_ms: int) -> None:
        cursor.execute(self.fail_descendants_sql, [job_id, retention_ms, PARENT_FAILED])

    def job_cancel(
        self, cursor: CursorWrapper, *, namespace: str, job_id: str, retention_ms: int
    ) -> bool:
        cursor.execute(self.cancel_sql, [retention_ms, job_id, namespace])
        if cursor.rowcount != 1:
            return False
        self._fail_descendants(cursor, job_id=job_id, retention_ms=retention_ms)
        return True

    def job_promote_due(self, cursor: CursorWrapper, *, namespace: str, limit: int) -> int:
        cursor.execute(self.promote_due_sql, [namespace, limit])
        return int(cursor.rowcount)

    def job_stuck(
        self, cursor: CursorWrapper, *, namespace: str, expired_for_ms: int, limit: int
    ) -> list[StuckJob]:
        """Running jobs whose lease expired at least ``expired_for_ms`` ago."""
        cursor.execute(self.stuck_sql, [namespace, expired_for_ms, limit])
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
        retention_ms: int,
    ) -> None:
        if parent_stage == Stage.SUCCESS:
            cursor.execute(self.release_one_sql, [job_id])
            return
        reason = PARENT_FAILED if parent_stage else "parent missing"
        cursor.execute(self.fail_waiting_sql, [retention_ms, reason, job_id])
        self._fail_descendants(cursor, job_id=job_id, retention_ms=retention_ms)

    def job_prune(self, cursor: CursorWrapper, *, namespace: str, limit: int) -> int:
        cursor.execute(self.prune_sql, [namespace, limit])
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
    ) -> None:
        cursor.execute(self.heartbeat_sql, [server_id, namespace, hostname, pid, workers])

    def server_remove(self, cursor: CursorWrapper, *, server_id: str) -> None:
        cursor.execute("DELETE FROM later_server WHERE id = %s", [server_id])

    def server_prune(self, cursor: CursorWrapper, *, namespace: str, silent_for_ms: int) -> int:
        """Delete servers of ``namespace`` silent for more than ``silent_for_ms``."""
        cursor.execute(self.server_prune_sql, [namespace, silent_for_ms])
        return int(cursor.rowcount)

    def maintenance_claim(
        self, cursor: CursorWrapper, *, namespace: str, step: str, interval_ms: int
    ) -> bool:
        """Record that ``step`` runs now, unless it ran less than ``interval_ms``
        ago anywhere in the namespace; return whether this caller should run it."""
        cursor.execute(self.maintenance_claim_sql, [namespace, step, interval_ms])
        return cursor.fetchone() is not None

    # -- topics and files ---------------------------------------------------------
    def topic_partitions(self, cursor: CursorWrapper) -> dict[str, int]:
        """Every registered topic and its partition count."""
        cursor.execute("SELECT name, partitions FROM later_topic")
        return {str(name): int(count) for name, count in cursor.fetchall()}

    def topic_register(self, cursor: CursorWrapper, *, name: str, partitions: int) -> bool:
        """Register a topic unless it exists; return whether it was new."""
        cursor.execute(
            "INSERT INTO later_topic (name, partitions) VALUES (%s, %s) "
            "ON CONFLICT (name) DO NOTHING",
            [name, partitions],
        )
        return bool(cursor.rowcount == 1)

    def journal_wal(self, cursor: CursorWrapper) -> bool:
        """Switch the database to write-ahead logging where that is a
        setting of the file; return whether it changed."""
        return False

    # -- leases -----------------------------------------------------------------
    def lease_acquire(
        self, cursor: CursorWrapper, *, namespace: str, name: str, owner: str, ttl_ms: int
    ) -> int | None:
        """Take or renew the lease ``name`` for ``owner`` until the database's
        now plus ``ttl_ms``; return its epoch, or None while another owner
        holds it. A new holder gets a higher epoch than any before it."""
        cursor.execute(self.lease_acquire_sql, [namespace, name, owner, ttl_ms])
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def lease_release(
        self, cursor: CursorWrapper, *, namespace: str, name: str, owner: str, epoch: int
    ) -> bool:
        """Let the lease go now, if it is still held as (``owner``, ``epoch``)."""
        cursor.execute(self.lease_release_sql, [namespace, name, owner, epoch])
        return bool(cursor.rowcount == 1)

    def vacuum(self, cursor: CursorWrapper) -> bool:
        """Compact the database file where that is a separate step."""
        return False


def _fence(owner: str | None, expired_for_ms: int | None) -> tuple[str, str | int]:
    if owner is not None:
        return "owner", owner
    if expired_for_ms is None:
        raise ValueError("a fenced write needs an owner or an expiry cut-off")
    return "expiry", expired_for_ms


def insert_one_params(job: NewJob) -> list[Any]:
    """The parameters of JOB_INSERT_SQL for ``job``."""
    return [*job[:6], job.run_at_ms, job.delay_ms]


def claimed_jobs(rows: Sequence[Sequence[Any]]) -> list[ClaimedJob]:
    # Columns in CLAIM_RETURNING order, which is ClaimedJob's field order.
    return [ClaimedJob(r[0], r[1], bytes(r[2]), r[3], r[4], r[5], r[6]) for r in rows]


CLAIM_RETURNING: Final = "id, type_name, payload, attempts, retry_policy, created_ms, run_at_ms"
CLAIM_SET: Final = """
    stage = 'running', attempts = attempts + 1, changed_ms = {stamp}, started_ms = {stamp},
    lease_owner = %s, lease_expires_ms = {now} + %s,
    history = history || 'running@' || {stamp} || ';'
"""
