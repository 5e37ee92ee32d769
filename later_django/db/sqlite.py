"""SQLite: one writer at a time, so a single UPDATE ... RETURNING claims atomically.

The worker's claims and completions run inline (db/sessions.py); another
process's commits are seen through the file's change counter.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import time
from collections.abc import Iterable
from typing import Any, ClassVar, Final
from urllib.parse import unquote, urlsplit

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.base import TABLES, Dialect
from later_django.db.descendants import resolve_fan_in
from later_django.db.enqueue import EnqueueStore, insert_statement, ready_now
from later_django.db.errors import SQLITE_ERROR, sqlite_code
from later_django.db.hot import HotStore
from later_django.db.limits import LimitStore
from later_django.db.partitions import PartitionStore
from later_django.db.past_django import log_query, qmark, ready
from later_django.db.rows import (
    ClaimRequest,
    Completion,
    HeadsStored,
    HeadSuccesses,
    PartitionClaim,
    PartitionClaimRequest,
    SuccessBatch,
    claimed_jobs,
)
from later_django.db.sql import Statement
from later_django.db.sql import database as database_sql
from later_django.db.sql import descendants as descendants_sql
from later_django.db.sql import enqueue as enqueue_sql
from later_django.db.sql import hot as hot_sql
from later_django.db.sql import partitions as partitions_sql
from later_django.db.sql import sqlite as sqlite_sql
from later_django.db.sql import upkeep as upkeep_sql
from later_django.db.statements import Statements, VendorSql, Walks, run
from later_django.db.upkeep import UpkeepStore
from later_django.queue_names import column_value
from later_django.states import Stage
from later_django.types import ClaimedJob, NewJob, PartitionLane

# 6 parameters a row; SQLite allows 32,766 parameters a statement.
INSERT_BATCH_SIZE: Final = 1000
ENQUEUED: Final = Stage.ENQUEUED.value


class SqliteEnqueue(EnqueueStore):
    def insert_one(self, db: BaseDatabaseWrapper, job: NewJob, *, prepare: bool) -> str:
        # Straight on the sqlite3 connection under Django's (the same
        # session and transaction): Django's cursor would add a fifth.
        # (``prepare`` is PostgreSQL's: sqlite3 caches its statements itself.)
        ready(db)
        if ready_now(job):
            sql, values = self._sql.bind(
                enqueue_sql.INSERT_READY_SQLITE,
                job_id=job.id,
                namespace=job.namespace,
                type_name=job.type_name,
                payload=job.payload,
                priority=job.priority,
                retry_policy=job.retry_policy,
            )
            insert = qmark(sql)
            started = time.monotonic()
            with db.wrap_database_errors:
                db.connection.execute(insert, values)
            log_query(db, insert, started)
            return ENQUEUED
        statement, params = insert_statement(job)
        sql, values = self._sql.bind(statement, **params)
        insert = qmark(sql)
        started = time.monotonic()
        with db.wrap_database_errors:
            row = db.connection.execute(insert, values).fetchone()
        log_query(db, insert, started)
        return str(row[0])

    def insert_many(
        self, db: BaseDatabaseWrapper, jobs: Iterable[NewJob], *, queued: bool = False
    ) -> None:
        # One multi-row INSERT per batch.
        remaining = iter(jobs)
        with db.cursor() as cursor:
            while batch := list(itertools.islice(remaining, INSERT_BATCH_SIZE)):
                if queued:
                    rows = [(*job[:6], column_value(job.queue)) for job in batch]
                    self._run(cursor, enqueue_sql.INSERT_MANY_QUEUED_SQLITE, rows=rows)
                else:
                    self._run(
                        cursor, enqueue_sql.INSERT_MANY_SQLITE, rows=[job[:6] for job in batch]
                    )


class SqliteHot(HotStore):
    # The worker runs these inline (db/sessions.py).
    def _claim_statement(self, request: ClaimRequest) -> tuple[str, list[Any]]:
        return plain_claim(self._sql, request)

    def complete_many(self, cursor: CursorWrapper, batch: SuccessBatch) -> Completion:
        jobs, owner = batch.jobs, batch.owner
        if not jobs:
            return Completion(done_ids=[], released=0)
        self._run(
            cursor,
            hot_sql.COMPLETE_MANY_SQLITE,
            retention_ms=batch.retention_ms,
            job_ids=[job_id for job_id, _ in jobs],
            claims=[tuple(claim) for claim in jobs],
            owner=owner,
        )
        done = [str(row[0]) for row in cursor.fetchall()]
        if not done:
            return Completion(done_ids=done, released=0)
        if batch.results:
            finished = set(done)
            ended = [end for end in batch.results if end.job_id in finished]
            self.task_results_write(cursor, owner=owner, ends=ended)
        # A statement of its own, after the parents' completion: it sees
        # every child committed before it runs.
        self._run(cursor, hot_sql.WAITING_CHILDREN_OF_SQLITE, parent_ids=done)
        children = cursor.fetchall()
        if not children:
            return Completion(done_ids=done, released=0)
        released = 0
        plain = [str(job_id) for job_id, fan_in in children if not fan_in]
        if plain:
            self._run(cursor, hot_sql.RELEASE_SQLITE, job_ids=plain)
            released = int(cursor.rowcount)
        fan_in = [str(job_id) for job_id, fan_in in children if fan_in]
        if fan_in:
            released += resolve_fan_in(
                self._sql, cursor, fan_in, retention_ms=batch.retention_ms
            ).released
        return Completion(done_ids=done, released=released)


class SqliteUpkeep(UpkeepStore):
    promote_due_statement: ClassVar[Statement] = upkeep_sql.PROMOTE_DUE_SQLITE

    def counter_compact(self, cursor: CursorWrapper, *, namespace: str) -> int:
        # The triggers keep one row per stage already: nothing to fold.
        return 0


def plain_claim(sql: Statements, request: ClaimRequest) -> tuple[str, list[Any]]:
    """The plain claim of ``request``, bound: the worker's, and a limited
    queue's without concurrency keys."""
    return sql.bind(
        hot_sql.CLAIM_SQLITE,
        owner=request.owner,
        lease_ms=request.lease_ms,
        namespace=request.namespace,
        queue_column=column_value(request.queue),
        queue=request.queue,
        limit=request.limit,
    )


class SqliteLimitStore(LimitStore):
    def _claim_statement(
        self, request: ClaimRequest, *, keyed: bool, scan: int
    ) -> tuple[str, list[Any]]:
        if not keyed:
            return plain_claim(self._sql, request)
        return self._sql.bind(
            hot_sql.CLAIM_KEYED_SQLITE,
            owner=request.owner,
            lease_ms=request.lease_ms,
            namespace=request.namespace,
            queue_column=column_value(request.queue),
            queue=request.queue,
            scan=scan,
            limit=request.limit,
        )


class SqlitePartitionStore(PartitionStore):
    # A claim and a success take several statements, in one transaction:
    # its write lock keeps every other writer out until it ends.
    def partition_claim(
        self, cursor: CursorWrapper, request: PartitionClaimRequest
    ) -> PartitionClaim | None:
        lane = request.lane
        self._run(
            cursor,
            partitions_sql.PARTITION_ACQUIRE_SQLITE,
            namespace=lane.namespace,
            topic=lane.topic,
            partition=lane.partition,
            owner=request.owner,
            partition_lease_ms=request.partition_lease_ms,
            server_ttl_ms=request.server_ttl_ms,
        )
        row = cursor.fetchone()
        if row is None:
            return None
        epoch = int(row[0])
        lane = lane._replace(epoch=epoch)
        jobs = self._claim_head(cursor, lane, owner=request.owner, lease_ms=request.job_lease_ms)
        return PartitionClaim(epoch, jobs[0] if jobs else None)

    def partition_complete_many(self, cursor: CursorWrapper, batch: HeadSuccesses) -> HeadsStored:
        owner = batch.owner
        held = [job for job in batch.heads if self.partition_fence(cursor, job.lane, owner=owner)]
        if not held:
            return HeadsStored([], 0, [])
        completion = self._hot.complete_many(
            cursor,
            SuccessBatch(
                owner=owner,
                jobs=[(job.id, job.attempts) for job in held],
                retention_ms=batch.retention_ms,
            ),
        )
        done = set(completion.done_ids)
        next_heads = []
        for job, chain in zip(batch.heads, batch.chain, strict=True):
            if chain and job.id in done:
                # The stored head is finished in this transaction: the head
                # is now the next job.
                assert job.lane is not None
                next_heads += self._claim_head(
                    cursor, job.lane, owner=owner, lease_ms=batch.job_lease_ms
                )
        return HeadsStored(completion.done_ids, completion.released, next_heads)

    def _claim_head(
        self, cursor: CursorWrapper, lane: PartitionLane, *, owner: str, lease_ms: int
    ) -> list[ClaimedJob]:
        """Claim the head of ``lane``'s partition, whose lease ``owner``
        holds at ``lane.epoch``, if it is ready: the job, on ``lane``."""
        self._run(
            cursor,
            partitions_sql.HEAD_CLAIM_SQLITE,
            owner=owner,
            job_lease_ms=lease_ms,
            namespace=lane.namespace,
            topic=lane.topic,
            partition=lane.partition,
        )
        return [job._replace(lane=lane) for job in claimed_jobs(cursor.fetchall())]


class SqliteDialect(Dialect):
    vendor: ClassVar[str] = "sqlite"
    single_writer: ClassVar[bool] = True
    supports_change_counter: ClassVar[bool] = True
    needs_vacuum: ClassVar[bool] = True
    vendor_sql: ClassVar[VendorSql] = VendorSql(
        now=sqlite_sql.NOW_SQL,
        walks=Walks(
            fail=descendants_sql.FAIL_DESCENDANTS_SQLITE,
            revive=descendants_sql.REVIVE_DESCENDANTS_SQLITE,
            revive_keyless=descendants_sql.REVIVE_KEYLESS_DESCENDANTS_SQLITE,
        ),
        greatest="MAX",
    )
    enqueue_store: ClassVar[type[EnqueueStore]] = SqliteEnqueue
    hot_store: ClassVar[type[HotStore]] = SqliteHot
    upkeep_store: ClassVar[type[UpkeepStore]] = SqliteUpkeep
    limit_store: ClassVar[type[LimitStore]] = SqliteLimitStore
    partition_store: ClassVar[type[PartitionStore]] = SqlitePartitionStore

    # -- schema ----------------------------------------------------------------------------
    def installed_objects(self, cursor: CursorWrapper) -> set[str]:
        run(cursor, self._sql, database_sql.INSTALLED_OBJECTS_SQLITE)
        return {row[0] for row in cursor.fetchall()}

    def database_exists(self, db: BaseDatabaseWrapper) -> bool:
        # Opening a missing file creates it, empty: look before connecting.
        name = str(db.settings_dict["NAME"] or "")
        if name.startswith("file:"):  # a URI: Django opens every NAME with uri=True
            parts = urlsplit(name)
            if "mode=memory" in parts.query:
                return True
            name = unquote(parts.path)
        if not name or name == ":memory:":
            return True  # nothing on disk to create; Django reports an empty NAME
        return os.path.exists(name)

    def missing_tables(self, cursor: CursorWrapper) -> list[str]:
        run(cursor, self._sql, database_sql.TABLES_FOUND_SQLITE, tables=TABLES)
        found = {row[0] for row in cursor.fetchall()}
        return [table for table in TABLES if table not in found]

    def missing_table_error(self, db: BaseDatabaseWrapper, exc: BaseException) -> bool:
        # "no such table" has only SQLite's generic code, so ask the schema.
        # A failed statement leaves SQLite's transaction usable for this
        # read, even where Django refuses queries until the atomic block
        # ends: hence the driver's connection.
        raw = db.connection
        if sqlite_code(exc) != SQLITE_ERROR or raw is None:
            return False
        try:
            sql, tables = self._sql.bind(database_sql.TABLES_FOUND_SQLITE, tables=TABLES)
            found = {row[0] for row in raw.execute(qmark(sql), tables)}
        except sqlite3.Error:
            return False
        return not found.issuperset(TABLES)

    def journal_wal(self, cursor: CursorWrapper) -> bool:
        # WAL lets readers run while a worker writes; it persists in the file.
        run(cursor, self._sql, database_sql.JOURNAL_MODE_SQLITE)
        if str(cursor.fetchone()[0]).lower() == "wal":
            return False
        run(cursor, self._sql, database_sql.JOURNAL_WAL_SQLITE)
        return True

    def vacuum(self, cursor: CursorWrapper) -> bool:
        run(cursor, self._sql, database_sql.VACUUM_SQLITE)
        return True

    def database_size(self, cursor: CursorWrapper) -> int:
        run(cursor, self._sql, database_sql.DATABASE_SIZE_SQLITE)
        return int(cursor.fetchone()[0])

    # -- wake-ups --------------------------------------------------------------------------
    def change_counter(self, cursor: CursorWrapper) -> int:
        run(cursor, self._sql, database_sql.DATA_VERSION_SQLITE)
        return int(cursor.fetchone()[0])
