"""SQL of the retained log: ``later_log_topic``, ``later_log_partition`` (the
per-partition offset counters), ``later_log_record`` and ``later_log_consumer``
(a consumer group's lease and committed offset per partition).

Every statement names its namespace and topic; none reads or writes
``later_job`` or ``later_topic`` (job topics drive pollers, log topics do not).

A group member's hold on a partition of the log is a lease by the rule of
sql/leases.py, where every take is a new epoch: a member that takes a
partition it holds (a restarted process under the same name) takes over
from its earlier life at once, whose commits and renewals are refused from
then on.
"""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# -- topics ---------------------------------------------------------------------------
# Registers a topic, or updates the retention of one registered with the
# same partition count. A different count matches no row: the caller then
# reads the stored count and refuses, with nothing changed.
TOPIC_REGISTER: Final = Statement("""
INSERT INTO later_log_topic (namespace, name, partitions, retention_ms, created_ms)
VALUES (%(namespace)s, %(name)s, %(partitions)s, %(retention_ms)s, {now})
ON CONFLICT (namespace, name) DO UPDATE SET retention_ms = excluded.retention_ms
WHERE later_log_topic.partitions = excluded.partitions
RETURNING partitions
""")

# A topic as stored.
TOPIC_GET: Final = Statement("""
SELECT name, partitions, retention_ms FROM later_log_topic
WHERE namespace = %(namespace)s AND name = %(name)s
""")

# The topics of a namespace that have a retention, by name.
TOPIC_RETAINED: Final = Statement("""
SELECT name, partitions, retention_ms FROM later_log_topic
WHERE namespace = %(namespace)s AND retention_ms IS NOT NULL ORDER BY name
""")

# -- appends ------------------------------------------------------------------------
# Reserves ``count`` offsets of a partition and returns the new end (the
# next offset after them): the caller's records take end - count .. end - 1.
# The upsert locks the counter row until the caller's transaction ends, so
# a concurrent appender waits and continues from the committed end: offsets
# are gapless, and per partition they commit in offset order. The topic row
# must exist with the partition count the caller computed the partition
# with (a stale count in a process's cache selects nothing).
PARTITION_ADVANCE: Final = Statement("""
INSERT INTO later_log_partition (namespace, topic, part, next_offset)
SELECT namespace, name, %(partition)s, %(count)s FROM later_log_topic
WHERE namespace = %(namespace)s AND name = %(topic)s AND partitions = %(partitions)s
ON CONFLICT (namespace, topic, part) DO UPDATE
SET next_offset = later_log_partition.next_offset + excluded.next_offset
RETURNING next_offset
""")

# Stores records at offsets PARTITION_ADVANCE reserved in the same
# transaction, stamped with the database's now: ``records`` is a row
# (partition, offset, key, value) per record.
RECORD_INSERT: Final = Statement(
    """
INSERT INTO later_log_record
    (namespace, topic, part, log_offset, record_key, record_value, appended_ms)
SELECT %(namespace)s, %(topic)s, column1, column2, column3, column4, {now}
FROM (VALUES %(records)s) AS records
""",
    lists=("records",),
)

# An append in one statement, one round trip, atomic by itself: the offset
# counters of its partitions raised in ascending order (the order every
# append locks them in, so two appends never deadlock), and its records
# stored at the offsets reserved; the rows stay locked until the
# transaction ends, as in the form of one statement per step
# (PARTITION_ADVANCE, RECORD_INSERT), which SQLite runs. ``wanted`` is a row
# (partition, count) per partition, ``records`` a row (partition, index in
# its partition's records, key, value) per record. Returns each partition's
# first offset; no row when the topic is not stored with the partition count
# given (nothing is written then).
APPEND_PG: Final = Statement(
    """
WITH wanted(part, n) AS (VALUES %(wanted)s),
advanced AS (
    INSERT INTO later_log_partition (namespace, topic, part, next_offset)
    SELECT t.namespace, t.name, w.part, w.n FROM later_log_topic t CROSS JOIN wanted w
    WHERE t.namespace = %(namespace)s AND t.name = %(topic)s AND t.partitions = %(partitions)s
    ORDER BY w.part
    ON CONFLICT (namespace, topic, part) DO UPDATE
    SET next_offset = later_log_partition.next_offset + excluded.next_offset
    RETURNING part, next_offset
),
given(part, idx, record_key, record_value) AS (VALUES %(records)s),
stored AS (
    INSERT INTO later_log_record
        (namespace, topic, part, log_offset, record_key, record_value, appended_ms)
    SELECT %(namespace)s, %(topic)s, g.part, a.next_offset - w.n + g.idx, g.record_key,
        g.record_value, {now}
    FROM given g JOIN advanced a ON a.part = g.part JOIN wanted w ON w.part = g.part
)
SELECT a.part, a.next_offset - w.n FROM advanced a JOIN wanted w ON w.part = a.part
""",
    lists=("wanted", "records"),
)

# -- records --------------------------------------------------------------------------
# Up to ``limit`` records of a partition from an offset on, by offset.
RECORD_READ: Final = Statement("""
SELECT log_offset, record_key, record_value, appended_ms FROM later_log_record
WHERE namespace = %(namespace)s AND topic = %(topic)s AND part = %(partition)s
  AND log_offset >= %(from_offset)s
ORDER BY log_offset LIMIT %(limit)s
""")

# Deletes the oldest records of a partition, looking at most at its first
# ``limit`` records: those before the first one not older than the cutoff.
# Only a prefix goes, so what remains is always a contiguous range of
# offsets; a record older than a newer one before it (the clock stepped
# back) waits until that one is old enough too.
RECORD_PRUNE: Final = Statement("""
DELETE FROM later_log_record
WHERE namespace = %(namespace)s AND topic = %(topic)s AND part = %(partition)s AND log_offset < (
    SELECT COALESCE(
        MIN(CASE WHEN head.appended_ms >= {now} - %(older_than_ms)s THEN head.log_offset END),
        MAX(head.log_offset) + 1, 0)
    FROM (
        SELECT log_offset, appended_ms FROM later_log_record
        WHERE namespace = %(namespace)s AND topic = %(topic)s AND part = %(partition)s
        ORDER BY log_offset LIMIT %(limit)s
    ) head
)
""")

# -- consumer groups --------------------------------------------------------------------
# Take a partition's lease for a group's member (the lease rule's take,
# every take a new epoch); the topic must have the partition. Returns the
# epoch and the committed offset; another live holder: no row.
CONSUMER_ACQUIRE: Final = Statement("""
INSERT INTO later_log_consumer
    (namespace, topic, consumer_group, part, member, epoch, expires_ms, committed_offset)
SELECT namespace, name, %(group)s, %(partition)s, %(member)s, 1, {now} + %(ttl_ms)s, 0
FROM later_log_topic
WHERE namespace = %(namespace)s AND name = %(topic)s AND partitions > %(partition)s
ON CONFLICT (namespace, topic, consumer_group, part) DO UPDATE SET
    epoch = later_log_consumer.epoch + 1, member = excluded.member,
    expires_ms = excluded.expires_ms
WHERE later_log_consumer.member IS NULL OR later_log_consumer.member = excluded.member
   OR later_log_consumer.expires_ms < {now}
RETURNING epoch, committed_offset
""")

# Extend a member's lease (the lease rule's renewal, fenced by its key and
# epoch).
CONSUMER_RENEW: Final = Statement("""
UPDATE later_log_consumer SET expires_ms = {now} + %(ttl_ms)s
WHERE namespace = %(namespace)s AND topic = %(topic)s AND consumer_group = %(group)s
  AND part = %(partition)s AND epoch = %(epoch)s
""")

# Stores the next offset to read, and renews the lease (a commit proves the
# holder is alive), under the lease rule's fence. Refused, changing nothing,
# when the fence fails, when the offset is behind the committed one or past
# the partition's end.
CONSUMER_COMMIT: Final = Statement("""
UPDATE later_log_consumer SET committed_offset = %(next_offset)s, expires_ms = {now} + %(ttl_ms)s
WHERE namespace = %(namespace)s AND topic = %(topic)s AND consumer_group = %(group)s
  AND part = %(partition)s AND epoch = %(epoch)s
  AND committed_offset <= %(next_offset)s AND %(next_offset)s <= COALESCE((
    SELECT next_offset FROM later_log_partition p
    WHERE p.namespace = later_log_consumer.namespace AND p.topic = later_log_consumer.topic
        AND p.part = later_log_consumer.part), 0)
""")

# Let a member's lease go now (the lease rule's release, fenced by its key
# and epoch): expired at once, the row kept, so the committed offset stays
# for the next holder.
CONSUMER_RELEASE: Final = Statement("""
UPDATE later_log_consumer SET expires_ms = 0
WHERE namespace = %(namespace)s AND topic = %(topic)s AND consumer_group = %(group)s
  AND part = %(partition)s AND epoch = %(epoch)s
""")

# A partition's lease as stored, and the partition's end: read only to say
# why a commit was refused.
CONSUMER_STATE: Final = Statement("""
SELECT c.epoch, c.committed_offset, COALESCE((
    SELECT next_offset FROM later_log_partition p
    WHERE p.namespace = c.namespace AND p.topic = c.topic AND p.part = c.part), 0)
FROM later_log_consumer c
WHERE c.namespace = %(namespace)s AND c.topic = %(topic)s AND c.consumer_group = %(group)s
  AND c.part = %(partition)s
""")

# Per group and partition of a topic: records appended minus the group's
# committed offset.
LAG: Final = Statement("""
SELECT c.consumer_group, c.part, COALESCE(p.next_offset, 0) - c.committed_offset
FROM later_log_consumer c
LEFT JOIN later_log_partition p
    ON p.namespace = c.namespace AND p.topic = c.topic AND p.part = c.part
WHERE c.namespace = %(namespace)s AND c.topic = %(topic)s
ORDER BY c.consumer_group, c.part
""")
