"""Operations on the retained log's tables: topics, per-partition offset
counters, records and consumer groups' leases and offsets.

Both databases run the same statements. The caller owns the transaction:
an append's advance and its record insert must share one.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.backends.utils import CursorWrapper

from later_django.db.rows import (
    LogAcquired,
    LogAdvance,
    LogAppend,
    LogCommit,
    LogConsumerKey,
    LogConsumerState,
    LogFence,
    LogLag,
    LogLeaseRequest,
    LogPartitionKey,
    LogPrune,
    LogRead,
    LogTopicRow,
    NewLogRecord,
    StoredRecord,
)
from later_django.db.sql import retained_log as log_sql
from later_django.db.statements import Operations

# Records per INSERT statement: 4 parameters each stays far below SQLite's
# limit of 32,766 bound parameters.
INSERT_CHUNK = 1000


class LogStore(Operations):
    """Appending, reading and consuming retained-log records."""

    def log_append_is_one_statement(self, count: int) -> bool:
        """Does ``log_append`` of ``count`` records run as one statement (so
        needs no transaction of its own)?"""
        return False

    def log_append(
        self, cursor: CursorWrapper, append: LogAppend, *, prepare: bool
    ) -> dict[int, int] | None:
        """Reserve offsets for ``append``'s records and store them; return
        each partition's first offset, or None, writing nothing, when the
        topic is not stored with ``append.partitions`` partitions.
        ``prepare``: whether a vendor that can prepares a statement of one
        append on the server (LATER["PREPARED_STATEMENTS"], read by the
        caller).

        Here a statement per partition and per chunk of records: run it in a
        transaction (log_append_is_one_statement says whether it must be)."""
        firsts: dict[int, int] = {}
        rows: list[NewLogRecord] = []
        for partition, records in append.groups:
            key = LogPartitionKey(
                namespace=append.namespace, topic=append.topic, partition=partition
            )
            advance = LogAdvance(key=key, count=len(records), partitions=append.partitions)
            end = self._partition_advance(cursor, advance)
            if end is None:
                if rows:  # the topic row was deleted meanwhile: roll back
                    raise RuntimeError(
                        f"retained-log topic {append.topic!r} was removed during an append"
                    )
                return None  # nothing was written
            firsts[partition] = first = end - len(records)
            rows += [
                NewLogRecord(partition, offset, key_, value)
                for offset, (key_, value) in enumerate(records, start=first)
            ]
        self._records_insert(cursor, namespace=append.namespace, topic=append.topic, records=rows)
        return firsts

    def log_topic_register(self, cursor: CursorWrapper, topic: LogTopicRow, namespace: str) -> bool:
        """Store ``topic``, or update the retention of the stored one with the
        same partition count; return False, changing nothing, when it is
        stored with another count."""
        self._run(
            cursor,
            log_sql.TOPIC_REGISTER,
            namespace=namespace,
            name=topic.name,
            partitions=topic.partitions,
            retention_ms=topic.retention_ms,
        )
        return cursor.fetchone() is not None

    def log_topic_get(
        self, cursor: CursorWrapper, *, namespace: str, name: str
    ) -> LogTopicRow | None:
        self._run(cursor, log_sql.TOPIC_GET, namespace=namespace, name=name)
        row = cursor.fetchone()
        return None if row is None else _topic(row)

    def log_topic_retained(self, cursor: CursorWrapper, *, namespace: str) -> list[LogTopicRow]:
        """The topics of ``namespace`` that have a retention, by name."""
        self._run(cursor, log_sql.TOPIC_RETAINED, namespace=namespace)
        return [_topic(row) for row in cursor.fetchall()]

    def _partition_advance(self, cursor: CursorWrapper, advance: LogAdvance) -> int | None:
        """Reserve ``advance.count`` offsets; return the partition's new end
        (the reserved ones are the ``count`` before it), or None when the
        topic is not stored with ``advance.partitions`` partitions.

        Locks the partition's counter until the transaction ends: needs one."""
        key = advance.key
        self._run(
            cursor,
            log_sql.PARTITION_ADVANCE,
            partition=key.partition,
            count=advance.count,
            namespace=key.namespace,
            topic=key.topic,
            partitions=advance.partitions,
        )
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def _records_insert(
        self, cursor: CursorWrapper, *, namespace: str, topic: str, records: Sequence[NewLogRecord]
    ) -> None:
        """Store ``records``, stamped with the database's now. Their offsets
        must have been reserved by _partition_advance in this transaction."""
        for start in range(0, len(records), INSERT_CHUNK):
            # A NewLogRecord is the row (partition, offset, key, value).
            chunk = records[start : start + INSERT_CHUNK]
            self._run(
                cursor, log_sql.RECORD_INSERT, namespace=namespace, topic=topic, records=chunk
            )

    def log_record_read(self, cursor: CursorWrapper, read: LogRead) -> list[StoredRecord]:
        """Up to ``read.limit`` records from ``read.from_offset`` on, by offset."""
        key = read.key
        self._run(
            cursor,
            log_sql.RECORD_READ,
            namespace=key.namespace,
            topic=key.topic,
            partition=key.partition,
            from_offset=read.from_offset,
            limit=read.limit,
        )
        return [
            StoredRecord(int(r[0]), bytes(r[1]), bytes(r[2]), int(r[3])) for r in cursor.fetchall()
        ]

    def log_record_prune(self, cursor: CursorWrapper, prune: LogPrune) -> int:
        """Delete the oldest records of a partition older than the cutoff
        (a prefix, looking at ``prune.limit`` records); return how many."""
        key = prune.key
        self._run(
            cursor,
            log_sql.RECORD_PRUNE,
            namespace=key.namespace,
            topic=key.topic,
            partition=key.partition,
            older_than_ms=prune.older_than_ms,
            limit=prune.limit,
        )
        return int(cursor.rowcount)

    def log_consumer_acquire(
        self, cursor: CursorWrapper, request: LogLeaseRequest
    ) -> LogAcquired | None:
        """Take a partition's lease for a group's member: a new, higher epoch.
        None while another member holds it, or when the topic has no such
        partition."""
        key = request.key
        self._run(
            cursor,
            log_sql.CONSUMER_ACQUIRE,
            group=key.group,
            partition=key.partition,
            member=request.member,
            ttl_ms=request.ttl_ms,
            namespace=key.namespace,
            topic=key.topic,
        )
        row = cursor.fetchone()
        return None if row is None else LogAcquired(epoch=int(row[0]), committed_offset=int(row[1]))

    def log_consumer_renew(self, cursor: CursorWrapper, fence: LogFence, ttl_ms: int) -> bool:
        """Extend the lease to the database's now plus ``ttl_ms``; False when
        a newer holder took it."""
        key = fence.key
        self._run(
            cursor,
            log_sql.CONSUMER_RENEW,
            ttl_ms=ttl_ms,
            namespace=key.namespace,
            topic=key.topic,
            group=key.group,
            partition=key.partition,
            epoch=fence.epoch,
        )
        return bool(cursor.rowcount == 1)

    def log_consumer_commit(self, cursor: CursorWrapper, commit: LogCommit) -> bool:
        """Store the group's next offset and renew the lease; False, changing
        nothing, when the fence fails or the offset is behind the committed
        one or past the partition's end (log_consumer_state tells which)."""
        key = commit.fence.key
        self._run(
            cursor,
            log_sql.CONSUMER_COMMIT,
            next_offset=commit.next_offset,
            ttl_ms=commit.ttl_ms,
            namespace=key.namespace,
            topic=key.topic,
            group=key.group,
            partition=key.partition,
            epoch=commit.fence.epoch,
        )
        return bool(cursor.rowcount == 1)

    def log_consumer_release(self, cursor: CursorWrapper, fence: LogFence) -> bool:
        """Let the lease go now, if it is still at ``fence.epoch``."""
        key = fence.key
        self._run(
            cursor,
            log_sql.CONSUMER_RELEASE,
            namespace=key.namespace,
            topic=key.topic,
            group=key.group,
            partition=key.partition,
            epoch=fence.epoch,
        )
        return bool(cursor.rowcount == 1)

    def log_consumer_state(
        self, cursor: CursorWrapper, key: LogConsumerKey
    ) -> LogConsumerState | None:
        self._run(
            cursor,
            log_sql.CONSUMER_STATE,
            namespace=key.namespace,
            topic=key.topic,
            group=key.group,
            partition=key.partition,
        )
        row = cursor.fetchone()
        if row is None:
            return None
        return LogConsumerState(
            epoch=int(row[0]), committed_offset=int(row[1]), end_offset=int(row[2])
        )

    def log_lag(self, cursor: CursorWrapper, *, namespace: str, topic: str) -> list[LogLag]:
        """Per group and partition of ``topic``: appended minus committed."""
        self._run(cursor, log_sql.LAG, namespace=namespace, topic=topic)
        return [
            LogLag(group=str(r[0]), partition=int(r[1]), lag=int(r[2])) for r in cursor.fetchall()
        ]


def _topic(row: Sequence[object]) -> LogTopicRow:
    retention = row[2]
    return LogTopicRow(
        name=str(row[0]),
        partitions=int(row[1]),  # type: ignore[call-overload]  # an INTEGER column
        retention_ms=None if retention is None else int(retention),  # type: ignore[call-overload]  # a BIGINT column
    )
