"""Sequential partition mode: registered topics (``later_topic``),
sequences, partition jobs, the partition leases pollers hold, and what
operators do to a partition (docs/how-to/partitions.md). A partition job's
insert as a fan-in child, and its success and failure, are the enqueue and
hot stores' writes (given to this one), behind the partition's fence."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

from django.db.backends.utils import CursorWrapper

from later_django.db.descendants import fail_descendants
from later_django.db.enqueue import (
    EnqueueStore,
    continuation_params,
    insert_params,
    option_columns,
)
from later_django.db.hot import HotStore
from later_django.db.rows import (
    ExtraColumns,
    HeadFailure,
    HeadsStored,
    HeadSuccesses,
    JobPlace,
    PartitionClaim,
    PartitionClaimRequest,
    PartitionCompletion,
    PartitionHead,
    PartitionSlot,
)
from later_django.db.sql import enqueue as enqueue_sql
from later_django.db.sql import partitions as partitions_sql
from later_django.db.sql import topics as topics_sql
from later_django.db.statements import Operations, Statements
from later_django.types import NewJob, PartitionLane, PartitionStats

if TYPE_CHECKING:
    from psycopg import AsyncConnection


class PartitionStore(Operations, abc.ABC):
    """Topics, sequences, partition leases and partition heads."""

    # Do partition_claim and partition_complete take one statement? Then
    # callers run them without a transaction of their own (else in one).
    writes_one_statement: ClassVar[bool] = False

    def __init__(self, sql: Statements, enqueue: EnqueueStore, hot: HotStore) -> None:
        super().__init__(sql)
        self._enqueue = enqueue
        self._hot = hot

    # -- topics ---------------------------------------------------------------------
    def topic_partitions(self, cursor: CursorWrapper, *, namespace: str) -> dict[str, int]:
        """Every topic registered in ``namespace`` and its partition count."""
        self._run(cursor, topics_sql.TOPIC_PARTITIONS, namespace=namespace)
        return {str(name): int(count) for name, count in cursor.fetchall()}

    def topic_register(
        self, cursor: CursorWrapper, *, namespace: str, name: str, partitions: int
    ) -> bool:
        """Register a topic unless it exists; return whether it was new."""
        self._run(
            cursor, topics_sql.TOPIC_REGISTER, namespace=namespace, name=name, partitions=partitions
        )
        return bool(cursor.rowcount == 1)

    # -- enqueue --------------------------------------------------------------------
    def partition_next_sequence(self, cursor: CursorWrapper, lane: PartitionLane) -> int:
        """Take the next sequence of ``lane``'s partition; its counter stays
        locked until the caller's transaction ends."""
        self._run(
            cursor,
            partitions_sql.SEQUENCE_NEXT,
            namespace=lane.namespace,
            topic=lane.topic,
            partition=lane.partition,
        )
        return int(cursor.fetchone()[0])

    def insert_partitioned(
        self,
        cursor: CursorWrapper,
        job: NewJob,
        slot: PartitionSlot,
        retention_ms: int,
    ) -> str | None:
        """Insert ``job`` at ``slot`` (a partition and a sequence taken from
        it): ready, delayed or (with parents) a continuation. Return its
        stage, or None when a parent does not exist in the namespace
        (nothing of a fan-in job is left written then)."""
        options, values = option_columns(job)  # a partition job has no unique key
        place = {
            "topic": slot.lane.topic,
            "partition": slot.lane.partition,
            "sequence": slot.sequence,
        }
        columns = ("topic", "partition", "sequence", *options)
        if job.parents is not None:
            lane = ExtraColumns(columns=columns, values={**place, **values})
            return self._enqueue.insert_fan_in(cursor, job, retention_ms, lane).stage
        if job.parent_id is None:
            statement = enqueue_sql.insert_with_options(columns)
            params = {**insert_params(job), **place, **values}
        else:
            statement = enqueue_sql.continuation_with_options(columns)
            params = {**continuation_params(job, retention_ms), **place, **values}
        cursor.execute(*self._sql.bind(statement, **params))
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def place_of(self, cursor: CursorWrapper, *, namespace: str, job_id: str) -> JobPlace | None:
        """The topic and partition of ``job_id`` (None: no such job in
        ``namespace``)."""
        self._run(cursor, partitions_sql.PLACE, job_id=job_id, namespace=namespace)
        row = cursor.fetchone()
        return None if row is None else JobPlace(row[0], None if row[1] is None else int(row[1]))

    # -- pollers --------------------------------------------------------------------
    def partition_heads(self, cursor: CursorWrapper, *, namespace: str) -> list[PartitionHead]:
        """Every partition of ``namespace`` that has had a job, with its head."""
        self._run(cursor, partitions_sql.PARTITION_HEADS, namespace=namespace)
        return partition_heads(cursor.fetchall())

    async def apartition_heads(
        self, conn: AsyncConnection[Any], *, namespace: str, prepare: bool
    ) -> list[PartitionHead]:
        """(supports_async_connection) partition_heads on the worker's
        asyncio connection; ``prepare``: whether the statement is prepared
        on the server (LATER["PREPARED_STATEMENTS"], read by the caller)."""
        raise NotImplementedError(f"{type(self).__name__} has no asyncio connection")

    async def apartition_claim(
        self, conn: AsyncConnection[Any], request: PartitionClaimRequest, *, prepare: bool
    ) -> PartitionClaim | None:
        """(supports_async_connection) partition_claim on the worker's
        asyncio connection, in autocommit: one statement; ``prepare`` as
        apartition_heads'."""
        raise NotImplementedError(f"{type(self).__name__} has no asyncio connection")

    async def apartition_complete_many(
        self, conn: AsyncConnection[Any], batch: HeadSuccesses, *, prepare: bool
    ) -> HeadsStored:
        """(supports_async_connection) partition_complete_many on the worker's
        asyncio connection, in autocommit: one statement; ``prepare`` as
        apartition_heads'."""
        raise NotImplementedError(f"{type(self).__name__} has no asyncio connection")

    @abc.abstractmethod
    def partition_claim(
        self, cursor: CursorWrapper, request: PartitionClaimRequest
    ) -> PartitionClaim | None:
        """Take or keep the partition lease ``request`` asks for and claim the
        partition's head if it is ready. None: another live server holds the
        lease. Run in one transaction unless writes_one_statement."""

    def partition_complete(self, cursor: CursorWrapper, done: PartitionCompletion) -> bool:
        """Store the success of ``done.job``, a partition head, if its claim
        and its partition's lease (owner, epoch) both still hold, and release
        its waiting continuations; return whether it was stored. Run in one
        transaction unless writes_one_statement."""
        batch = HeadSuccesses(
            owner=done.owner, heads=[done.job], chain=[False], retention_ms=done.retention_ms
        )
        return bool(self.partition_complete_many(cursor, batch).done_ids)

    @abc.abstractmethod
    def partition_complete_many(self, cursor: CursorWrapper, batch: HeadSuccesses) -> HeadsStored:
        """Store the successes of ``batch.heads`` whose claim and partition
        lease both still hold, release their waiting continuations, and
        claim the next head of each partition ``batch.chain`` asks for if it
        is ready. Run in one transaction unless writes_one_statement: the
        fences' row locks hold off a takeover until it ends."""

    def partition_fence(
        self, cursor: CursorWrapper, lane: PartitionLane | None, *, owner: str
    ) -> bool:
        """Does ``owner`` still hold ``lane``'s partition at ``lane.epoch``?
        Holds the row until the transaction ends, so an outcome stored in it
        is the current holder's."""
        assert lane is not None
        self._run(
            cursor,
            partitions_sql.PARTITION_FENCE,
            namespace=lane.namespace,
            topic=lane.topic,
            partition=lane.partition,
            owner=owner,
            epoch=lane.epoch,
        )
        return cursor.fetchone() is not None

    def partition_renew(
        self, cursor: CursorWrapper, *, namespace: str, owner: str, lease_ms: int
    ) -> list[PartitionLane]:
        """Extend every partition lease ``owner`` holds; return them, with
        their epoch."""
        self._run(
            cursor,
            partitions_sql.PARTITION_RENEW,
            lease_ms=lease_ms,
            namespace=namespace,
            owner=owner,
        )
        return [PartitionLane(namespace, str(t), int(p), int(e)) for t, p, e in cursor.fetchall()]

    def partition_release(
        self,
        cursor: CursorWrapper,
        *,
        namespace: str,
        owner: str,
        partition: tuple[str, int] | None = None,
    ) -> None:
        """Let go of one partition lease of ``owner``, or of all of them."""
        if partition is None:
            self._run(
                cursor, partitions_sql.PARTITION_RELEASE_ALL, namespace=namespace, owner=owner
            )
        else:
            topic, number = partition
            self._run(
                cursor,
                partitions_sql.PARTITION_RELEASE,
                namespace=namespace,
                owner=owner,
                topic=topic,
                partition=number,
            )

    def topic_servers(self, cursor: CursorWrapper, *, namespace: str, ttl_ms: int) -> list[str]:
        """Ids of the live servers of ``namespace`` that poll topics."""
        self._run(cursor, partitions_sql.TOPIC_SERVERS, namespace=namespace, ttl_ms=ttl_ms)
        return [str(row[0]) for row in cursor.fetchall()]

    # -- operators ------------------------------------------------------------------
    def partition_force_fail_head(self, cursor: CursorWrapper, fail: HeadFailure) -> str | None:
        """Fail the head of ``fail.lane``'s partition whatever its stage (only
        if it is ``fail.job_id``, when given), fail its waiting continuations,
        and move the partition's epoch on; return the head's id, or None when
        the partition has no unfinished job or another head. Run in one
        transaction.

        The partition's row is locked first, as every outcome of a head
        locks it (partition_fence), so the head read next cannot finish
        before this transaction ends; the lease and the epoch change only
        once a head is failed, so a call that returns None changed nothing
        (an operator's stale page never disturbs the job running now)."""
        namespace, topic, partition = fail.lane.namespace, fail.lane.topic, fail.lane.partition
        self._run(
            cursor,
            partitions_sql.PARTITION_LOCK,
            namespace=namespace,
            topic=topic,
            partition=partition,
        )
        self._run(
            cursor, partitions_sql.HEAD, namespace=namespace, topic=topic, partition=partition
        )
        row = cursor.fetchone()
        if row is None or (fail.job_id is not None and row[0] != fail.job_id):
            return None
        job_id = str(row[0])
        self._run(
            cursor,
            partitions_sql.FORCE_FAIL,
            retention_ms=fail.retention_ms,
            error=fail.error,
            job_id=job_id,
        )
        if cursor.rowcount != 1:
            return None
        self._run(
            cursor,
            partitions_sql.PARTITION_BUMP_EPOCH,
            namespace=namespace,
            topic=topic,
            partition=partition,
        )
        fail_descendants(self._sql, cursor, job_id=job_id, retention_ms=fail.retention_ms)
        return job_id

    def partition_truncate_history(
        self, cursor: CursorWrapper, lane: PartitionLane, keep: int
    ) -> int:
        """Delete the finished jobs of ``lane``'s partition but the newest
        ``keep``, and the parent lists of those that were fan-in jobs; return
        how many jobs were deleted. Run in one transaction."""
        self._run(
            cursor,
            partitions_sql.FAN_IN_TRUNCATE_HISTORY,
            namespace=lane.namespace,
            topic=lane.topic,
            partition=lane.partition,
            keep=keep,
        )
        self._run(
            cursor,
            partitions_sql.TRUNCATE_HISTORY,
            namespace=lane.namespace,
            topic=lane.topic,
            partition=lane.partition,
            keep=keep,
        )
        return int(cursor.rowcount)

    def partition_stats(self, cursor: CursorWrapper, *, namespace: str) -> list[PartitionStats]:
        """Depth, head and lease of every partition of the topics registered
        in ``namespace`` (``later_topic``), and of every other partition that
        has had a job: one index probe each, no count over jobs."""
        self._run(cursor, partitions_sql.PARTITION_STATS, namespace=namespace)
        rows = cursor.fetchall()
        return [
            PartitionStats(
                topic=str(topic),
                partition=int(partition),
                next_sequence=int(next_seq),
                head_sequence=None if head is None else int(head),
                head_run_at_ms=None if run_at is None else int(run_at),
                head_stage=stage,
                owner=owner,
                epoch=int(epoch or 0),
                lease_expires_ms=int(expires or 0),
            )
            for topic, partition, next_seq, head, run_at, stage, owner, epoch, expires in rows
        ]


def partition_heads(rows: list[Any]) -> list[PartitionHead]:
    """partition_heads' rows as PartitionHeads."""
    return [PartitionHead(topic=str(t), partition=int(p), job_id=j, stage=s) for t, p, j, s in rows]
