"""The dialect interface, over the SQL text of later_django/db/sql/.

Each method is one operation on later's tables, run on a Django cursor of
the LATER database; callers own the transaction. Vendor files override only
what differs (row locking, triggers, notifications).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.sql import STAMP, counters, leases, servers, topics
from later_django.db.sql import TABLES as TABLES
from later_django.db.sql import jobs as jobs_sql
from later_django.db.sql import sqlite as sqlite_sql
from later_django.states import PARENT_FAILED, TERMINAL, Stage
from later_django.types import ClaimedJob, NewJob, StuckJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor


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
        self.insert_sql = self.render(jobs_sql.JOB_INSERT_SQL)
        # SQLite's multi-row inserts and batch completion (PostgreSQL has its own).
        self.insert_many_row = self.render(sqlite_sql.JOB_INSERT_MANY_ROW)
        self.complete_many_sql = self.render(sqlite_sql.JOB_COMPLETE_MANY_SQL)
        self.release_children_of_sql = self.render(sqlite_sql.JOB_RELEASE_CHILDREN_OF_SQL)
        self.insert_continuation_sql = self.render(jobs_sql.JOB_INSERT_CONTINUATION_SQL)
        self.unclaim_sql = self.render(jobs_sql.JOB_UNCLAIM_SQL)
        self.fail_descendants_sql = self.render(jobs_sql.JOB_FAIL_DESCENDANTS_SQL)
        self.cancel_sql = self.render(jobs_sql.JOB_CANCEL_SQL)
        self.renew_sql = self.render(jobs_sql.JOB_RENEW_SQL)
        self.promote_due_sql = self.render(jobs_sql.JOB_PROMOTE_DUE_SQL)
        self.stuck_sql = self.render(jobs_sql.JOB_STUCK_SQL)
        self.prune_sql = self.render(jobs_sql.JOB_PRUNE_SQL)
        self.parent_stage_sql = self.render(jobs_sql.JOB_PARENT_STAGE_SQL)
        self.release_one_sql = self.render(jobs_sql.JOB_RELEASE_ONE_SQL)
        self.fail_waiting_sql = self.render(jobs_sql.JOB_FAIL_WAITING_SQL)
        self.heartbeat_sql = self.render(servers.SERVER_HEARTBEAT_SQL)
        self.server_prune_sql = self.render(servers.SERVER_PRUNE_SQL)
        self.maintenance_claim_sql = self.render(servers.MAINTENANCE_CLAIM_SQL)
        self.lease_acquire_sql = self.render(leases.LEASE_ACQUIRE_SQL)
        self.lease_release_sql = self.render(leases.LEASE_RELEASE_SQL)
        self.retry_sql = {
            "owner": self.render(jobs_sql.JOB_RETRY_OWNED_SQL),
            "expiry": self.render(jobs_sql.JOB_RETRY_EXPIRED_SQL),
        }
        self.fail_sql = {
            "owner": self.render(jobs_sql.JOB_FAIL_OWNED_SQL),
            "expiry": self.render(jobs_sql.JOB_FAIL_EXPIRED_SQL),
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
            cursor.execute(self.insert_sql, insert_one_params(job))
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
                    params += job[:6]  # the values of JOB_INSERT_MANY_ROW
                values = ", ".join([self.insert_many_row] * len(batch))
                cursor.execute(sqlite_sql.JOB_INSERT_MANY_SQL.format(values=values), params)

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
        cursor.execute(jobs_sql.JOB_ORPHANS_SQL, [namespace, limit])
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
        cursor.execute(jobs_sql.JOB_READY_EXISTS_SQL, [namespace])
        return cursor.fetchone() is not None

    # -- counters -------------------------------------------------------------
    def stage_counts(self, cursor: CursorWrapper, *, namespace: str) -> dict[str, int]:
        cursor.execute(counters.STAGE_COUNTS_SQL, [namespace])
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
        cursor.execute(servers.SERVER_REMOVE_SQL, [server_id])

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
        cursor.execute(topics.TOPIC_PARTITIONS_SQL)
        return {str(name): int(count) for name, count in cursor.fetchall()}

    def topic_register(self, cursor: CursorWrapper, *, name: str, partitions: int) -> bool:
        """Register a topic unless it exists; return whether it was new."""
        cursor.execute(topics.TOPIC_REGISTER_SQL, [name, partitions])
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
