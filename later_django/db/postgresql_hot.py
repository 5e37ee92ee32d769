"""PostgreSQL's hot path: the worker's claims and completions, of plain
jobs (PostgresHot), of jobs on limited queues (PostgresLimitStore) and of
partition heads (PostgresPartitionStore), each one statement or one
transaction.

The worker runs them on its own asyncio connection (db/sessions.py), as
prepared statements when its caller says so (``prepare``, from
LATER["PREPARED_STATEMENTS"]): their text never changes between calls of
one size, so the server plans them once per connection instead of on every
batch. The same statements run on a Django cursor (claim, complete_many,
partition_claim, partition_complete_many) for callers in a transaction of
their own. Kept apart from db/postgresql.py (the dialect, its enqueue,
upkeep and log) so each module stays small.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from django.db.backends.utils import CursorWrapper

from later_django.db.hot import HotStore
from later_django.db.limits import LimitStore
from later_django.db.partitions import PartitionStore, partition_heads
from later_django.db.rows import (
    ClaimRequest,
    Completion,
    HeadsStored,
    HeadSuccesses,
    LimitedClaim,
    LimitedClaimRequest,
    PartitionClaim,
    PartitionClaimRequest,
    PartitionHead,
    SuccessBatch,
    claimed_jobs,
)
from later_django.db.sql import Statement
from later_django.db.sql import hot as hot_sql
from later_django.db.sql import partitions as partitions_sql
from later_django.db.statements import Statements
from later_django.queue_names import column_value
from later_django.types import ClaimedJob, PartitionLane

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor


class PostgresHot(HotStore):
    def _claim_statement(self, request: ClaimRequest) -> tuple[str, list[Any]]:
        return plain_claim(self._sql, request)

    async def aclaim(
        self, cursor: AsyncCursor[Any], request: ClaimRequest, *, prepare: bool
    ) -> list[ClaimedJob]:
        sql, params = self._claim_statement(request)
        await cursor.execute(sql, params, prepare=prepare)
        return claimed_jobs(await cursor.fetchall())

    def complete_many(self, cursor: CursorWrapper, batch: SuccessBatch) -> Completion:
        if not batch.jobs:
            return Completion(done_ids=[], released=0)
        cursor.execute(*self._complete(batch))
        return _completion(cursor.fetchone())

    async def acomplete_many(
        self, conn: AsyncConnection[Any], batch: SuccessBatch, *, prepare: bool
    ) -> Completion:
        if not batch.jobs:
            return Completion(done_ids=[], released=0)
        sql, params = self._complete(batch)
        async with conn.cursor() as cursor:
            await cursor.execute(sql, params, prepare=prepare)
            return _completion(await cursor.fetchone())

    def _complete(self, batch: SuccessBatch) -> tuple[str, list[Any]]:
        """The completion of ``batch``, bound: later_complete_many's
        arguments are the batch as two arrays, so the call's text never
        changes; a batch with task jobs writes their results in the same
        statement."""
        job_ids = [job_id for job_id, _ in batch.jobs]
        attempts = [attempts for _, attempts in batch.jobs]
        if not batch.results:
            return self._sql.bind(
                hot_sql.COMPLETE_MANY_PG,
                job_ids=job_ids,
                attempts=attempts,
                owner=batch.owner,
                retention_ms=batch.retention_ms,
            )
        rows = [end.row(batch.owner) for end in batch.results]
        result_job_ids, worker_ids, errors, return_values = (
            list(column) for column in zip(*rows, strict=True)
        )
        return self._sql.bind(
            hot_sql.COMPLETE_MANY_WITH_RESULTS_PG,
            job_ids=job_ids,
            attempts=attempts,
            owner=batch.owner,
            retention_ms=batch.retention_ms,
            result_job_ids=result_job_ids,
            worker_ids=worker_ids,
            errors=errors,
            return_values=return_values,
        )


def _completion(row: Any) -> Completion:
    assert row is not None
    return Completion(done_ids=[str(job_id) for job_id in row[0]], released=int(row[1]))


def plain_claim(sql: Statements, request: ClaimRequest) -> tuple[str, list[Any]]:
    """The plain claim of ``request``, bound: the worker's, and a limited
    queue's without concurrency keys."""
    return sql.bind(
        hot_sql.CLAIM_PG,
        namespace=request.namespace,
        queue_column=column_value(request.queue),
        queue=request.queue,
        limit=request.limit,
        owner=request.owner,
        lease_ms=request.lease_ms,
    )


class PostgresLimitStore(LimitStore):
    claim_lock: ClassVar[Statement | None] = hot_sql.CLAIM_KEYED_LOCK_PG

    def _claim_statement(
        self, request: ClaimRequest, *, keyed: bool, scan: int
    ) -> tuple[str, list[Any]]:
        # The sizes in the text, as the worker's plain claim has them (see
        # sql/hot.py): one prepared statement per size.
        if not keyed:
            return plain_claim(self._sql, request)
        return self._sql.bind(
            hot_sql.CLAIM_KEYED_PG,
            namespace=request.namespace,
            queue_column=column_value(request.queue),
            queue=request.queue,
            scan=scan,
            limit=request.limit,
            owner=request.owner,
            lease_ms=request.lease_ms,
        )

    async def aclaim_limited(
        self, conn: AsyncConnection[Any], request: LimitedClaimRequest, *, prepare: bool
    ) -> LimitedClaim:
        steps = self._claim_steps(request)
        rows: Any = None
        async with conn.transaction(), conn.cursor() as cursor:
            try:
                while True:
                    sql, params = steps.send(rows)
                    await cursor.execute(sql, params, prepare=prepare)
                    rows = await cursor.fetchall()
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]  # the generator's LimitedClaim


class PostgresPartitionStore(PartitionStore):
    writes_one_statement: ClassVar[bool] = True

    # -- partitions ---------------------------------------------------------------------
    # A claim and a success are one statement each: a partition job pays two
    # round trips, not a transaction of several statements each way. The
    # worker runs them on its asyncio connection (the a-prefixed twins),
    # prepared once per connection, as it does the claims of plain jobs.
    def partition_claim(
        self, cursor: CursorWrapper, request: PartitionClaimRequest
    ) -> PartitionClaim | None:
        cursor.execute(*self._claim(request))
        return _partition_claim(request, cursor.fetchone())

    async def apartition_claim(
        self, conn: AsyncConnection[Any], request: PartitionClaimRequest, *, prepare: bool
    ) -> PartitionClaim | None:
        sql, params = self._claim(request)
        async with conn.cursor() as cursor:
            await cursor.execute(sql, params, prepare=prepare)
            return _partition_claim(request, await cursor.fetchone())

    def partition_complete_many(self, cursor: CursorWrapper, batch: HeadSuccesses) -> HeadsStored:
        cursor.execute(*self._complete_many(batch))
        return _heads_stored(batch, cursor.fetchall())

    async def apartition_complete_many(
        self, conn: AsyncConnection[Any], batch: HeadSuccesses, *, prepare: bool
    ) -> HeadsStored:
        sql, params = self._complete_many(batch)
        async with conn.cursor() as cursor:
            await cursor.execute(sql, params, prepare=prepare)
            return _heads_stored(batch, await cursor.fetchall())

    async def apartition_heads(
        self, conn: AsyncConnection[Any], *, namespace: str, prepare: bool
    ) -> list[PartitionHead]:
        sql, params = self._sql.bind(partitions_sql.PARTITION_HEADS, namespace=namespace)
        async with conn.cursor() as cursor:
            await cursor.execute(sql, params, prepare=prepare)
            return partition_heads(await cursor.fetchall())

    def _claim(self, request: PartitionClaimRequest) -> tuple[str, list[Any]]:
        lane = request.lane
        return self._sql.bind(
            partitions_sql.PARTITION_CLAIM_PG,
            namespace=lane.namespace,
            topic=lane.topic,
            partition=lane.partition,
            owner=request.owner,
            partition_lease_ms=request.partition_lease_ms,
            server_ttl_ms=request.server_ttl_ms,
            job_lease_ms=request.job_lease_ms,
        )

    def _complete_many(self, batch: HeadSuccesses) -> tuple[str, list[Any]]:
        """The batch travels as arrays, one element per head, so the
        statement's text never changes."""
        lanes = [_lane_of(job) for job in batch.heads]
        return self._sql.bind(
            partitions_sql.PARTITION_COMPLETE_MANY_PG,
            topics=[lane.topic for lane in lanes],
            partitions=[lane.partition for lane in lanes],
            epochs=[lane.epoch for lane in lanes],
            ids=[job.id for job in batch.heads],
            attempts=[job.attempts for job in batch.heads],
            chain=list(batch.chain),
            namespace=lanes[0].namespace,
            owner=batch.owner,
            retention_ms=batch.retention_ms,
            job_lease_ms=batch.job_lease_ms,
        )


def _partition_claim(request: PartitionClaimRequest, row: Any) -> PartitionClaim | None:
    if row is None:
        return None
    epoch, lane = int(row[0]), request.lane
    if row[1] is None:
        return PartitionClaim(epoch, None)
    (job,) = claimed_jobs([row[1:]])
    return PartitionClaim(epoch, job._replace(lane=lane._replace(epoch=epoch)))


def _heads_stored(batch: HeadSuccesses, rows: list[Any]) -> HeadsStored:
    """One row per next head claimed, or one without (its topic NULL)."""
    lanes = {(lane.topic, lane.partition): lane for lane in map(_lane_of, batch.heads)}
    claimed = [row for row in rows if row[2] is not None]
    next_heads = [
        job._replace(lane=lanes[(str(row[2]), int(row[3]))])
        for row, job in zip(claimed, claimed_jobs([row[4:] for row in claimed]), strict=True)
    ]
    return HeadsStored(list(rows[0][0]), int(rows[0][1]), next_heads)


def _lane_of(job: ClaimedJob) -> PartitionLane:
    assert job.lane is not None, "a partition head has a lane"
    return job.lane
