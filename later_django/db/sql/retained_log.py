"""SQL of the retained log: ``later_log_topic``, ``later_log_partition`` (the
per-partition offset counters), ``later_log_record`` and ``later_log_consumer``
(a consumer group's lease and committed offset per partition).

Every statement names its namespace and topic; none reads or writes
``later_job`` or ``later_topic`` (job topics drive pollers, log topics do not).
"""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose
from later_django.db.sql.leases import LeaseTable, fence, release_sql, renew_sql, take_sql

# Registers a topic, or updates the retention of one registered with the
# same partition count. A different count matches no row: the caller then
# reads the stored count and refuses, with nothing changed.
LOG_TOPIC_REGISTER_SQL: Final = """
INSERT INTO later_log_topic (namespace, name, partitions, retention_ms, created_ms)
VALUES (%s, %s, %s, %s, {now})
ON CONFLICT (namespace, name) DO UPDATE SET retention_ms = excluded.retention_ms
WHERE later_log_topic.partitions = excluded.partitions
RETURNING partitions
"""

LOG_TOPIC_GET_SQL: Final = """
SELECT name, partitions, retention_ms FROM later_log_topic WHERE namespace = %s AND name = %s
"""

LOG_TOPIC_RETAINED_SQL: Final = """
SELECT name, partitions, retention_ms FROM later_log_topic
WHERE namespace = %s AND retention_ms IS NOT NULL ORDER BY name
"""

# Reserves ``count`` offsets of a partition and returns the new end (the
# next offset after them): the caller's records take end - count .. end - 1.
# The upsert locks the counter row until the caller's transaction ends, so
# a concurrent appender waits and continues from the committed end: offsets
# are gapless, and per partition they commit in offset order. The topic row
# must exist with the partition count the caller computed the partition
# with (a stale count in a process's cache selects nothing).
LOG_PARTITION_ADVANCE_SQL: Final = """
INSERT INTO later_log_partition (namespace, topic, part, next_offset)
SELECT namespace, name, %s, %s FROM later_log_topic
WHERE namespace = %s AND name = %s AND partitions = %s
ON CONFLICT (namespace, topic, part) DO UPDATE
SET next_offset = later_log_partition.next_offset + excluded.next_offset
RETURNING next_offset
"""

LOG_PARTITION_ENDS_SQL: Final = """
SELECT part, next_offset FROM later_log_partition
WHERE namespace = %s AND topic = %s ORDER BY part
"""

# {values} is one "(%s, %s, %s, %s, %s, %s, {now})" per record.
LOG_RECORD_INSERT_SQL: Final = """
INSERT INTO later_log_record
    (namespace, topic, part, log_offset, record_key, record_value, appended_ms)
VALUES {values}
"""
LOG_RECORD_VALUES: Final = "(%s, %s, %s, %s, %s, %s, {now})"

LOG_RECORD_READ_SQL: Final = """
SELECT log_offset, record_key, record_value, appended_ms FROM later_log_record
WHERE namespace = %s AND topic = %s AND part = %s AND log_offset >= %s
ORDER BY log_offset LIMIT %s
"""

# Deletes the oldest records of a partition, looking at most at its first
# %s records: those before the first one not older than the cutoff. Only a
# prefix goes, so what remains is always a contiguous range of offsets; a
# record older than a newer one before it (the clock stepped back) waits
# until that one is old enough too.
LOG_RECORD_PRUNE_SQL: Final = """
DELETE FROM later_log_record
WHERE namespace = %s AND topic = %s AND part = %s AND log_offset < (
    SELECT COALESCE(MIN(CASE WHEN head.appended_ms >= {now} - %s THEN head.log_offset END),
                    MAX(head.log_offset) + 1, 0)
    FROM (
        SELECT log_offset, appended_ms FROM later_log_record
        WHERE namespace = %s AND topic = %s AND part = %s
        ORDER BY log_offset LIMIT %s
    ) head
)
"""

# A group member's hold on a partition of the log. Every take is a new
# epoch: a member that takes a partition it holds (a restarted process under
# the same name) takes over from its earlier life at once, whose commits and
# renewals are refused from then on.
CONSUMER_LEASE: Final = LeaseTable(
    "later_log_consumer",
    ("namespace", "topic", "consumer_group", "part"),
    "member",
    "expires_ms",
    take_is_new_tenure=True,
)

# Taken by sql/leases.py's rule; the topic must have the partition. Another
# live holder: no row.
LOG_CONSUMER_ACQUIRE_SQL: Final = take_sql(
    CONSUMER_LEASE,
    source="""(namespace, topic, consumer_group, part, member, epoch, expires_ms, committed_offset)
SELECT namespace, name, %s, %s, %s, 1, {now} + %s, 0 FROM later_log_topic
WHERE namespace = %s AND name = %s AND partitions > %s""",
    returning=", committed_offset",
)

LOG_CONSUMER_RENEW_SQL: Final = renew_sql(CONSUMER_LEASE)

# Stores the next offset to read, and renews the lease (a commit proves the
# holder is alive). Refused, changing nothing, when the fence fails, when the
# offset is behind the committed one or past the partition's end.
LOG_CONSUMER_COMMIT_SQL: Final = compose(
    """
UPDATE later_log_consumer SET committed_offset = %s, expires_ms = {now} + %s
WHERE {fence} AND committed_offset <= %s AND %s <= COALESCE((
    SELECT next_offset FROM later_log_partition p
    WHERE p.namespace = later_log_consumer.namespace AND p.topic = later_log_consumer.topic
        AND p.part = later_log_consumer.part), 0)
""",
    fence=fence(CONSUMER_LEASE),
)

# The committed offset stays for the next holder.
LOG_CONSUMER_RELEASE_SQL: Final = release_sql(CONSUMER_LEASE)

# A partition's lease as stored, and the partition's end: read only to say
# why a commit was refused.
LOG_CONSUMER_STATE_SQL: Final = """
SELECT c.epoch, c.committed_offset, COALESCE((
    SELECT next_offset FROM later_log_partition p
    WHERE p.namespace = c.namespace AND p.topic = c.topic AND p.part = c.part), 0)
FROM later_log_consumer c
WHERE c.namespace = %s AND c.topic = %s AND c.consumer_group = %s AND c.part = %s
"""

# Per group and partition of a topic: records appended minus the group's
# committed offset.
LOG_LAG_SQL: Final = """
SELECT c.consumer_group, c.part, COALESCE(p.next_offset, 0) - c.committed_offset
FROM later_log_consumer c
LEFT JOIN later_log_partition p
    ON p.namespace = c.namespace AND p.topic = c.topic AND p.part = c.part
WHERE c.namespace = %s AND c.topic = %s
ORDER BY c.consumer_group, c.part
"""
