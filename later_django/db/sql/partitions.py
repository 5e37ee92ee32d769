"""SQL of sequential partition mode: sequences (``later_partition_seq``),
partition leases (``later_partition``) and partition jobs in ``later_job``
(docs/how-to/partitions.md)."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose
from later_django.db.sql.jobs import (
    CLAIM_RETURNING,
    LEASE_DROPPED,
    TO_FAILED,
    TO_RUNNING,
)
from later_django.db.sql.leases import LeaseTable, release_sql, renew_sql, take_sql

# A partition's unfinished jobs, written as the head index's predicate is
# (SQLite uses a partial index only for a query whose terms imply it).
UNFINISHED_OF: Final = "NOT ({stage} IN ('success', 'failed', 'cancelled'))"
UNFINISHED: Final = compose(UNFINISHED_OF, stage="stage")

# The sequence of a new job: the counter row is created or incremented in the
# job's own transaction and stays locked until it ends, so the next enqueue
# to the partition waits for this one to commit or roll back. Sequences are
# therefore gapless and committed in order: a poller never sees sequence n+1
# before n.
SEQUENCE_NEXT_SQL: Final = """
INSERT INTO later_partition_seq (namespace, topic, partition, next_seq) VALUES (%s, %s, %s, 1)
ON CONFLICT (namespace, topic, partition)
DO UPDATE SET next_seq = later_partition_seq.next_seq + 1
RETURNING next_seq - 1
"""

# Where a job is (its topic and partition), to chain a job after it.
JOB_PLACE_SQL: Final = "SELECT topic, partition FROM later_job WHERE id = %s AND namespace = %s"

# A partition job's own columns, after those of a plain job.
LANE_COLUMNS: Final = ", topic, partition, sequence"

# The head of a partition: its unfinished job of the lowest sequence.
HEAD_OF: Final = compose(
    """SELECT h.id FROM later_job h
    WHERE h.namespace = {namespace} AND h.topic = {topic} AND h.partition = {partition}
      AND {unfinished}
    ORDER BY h.sequence LIMIT 1""",
    unfinished=compose(UNFINISHED_OF, stage="h.stage"),
)
HEAD_ID: Final = compose(HEAD_OF, namespace="%s", topic="%s", partition="%s")

# Every partition of the namespace that has had a job, with its head's id
# and stage (NULL when it has no unfinished job), one index probe each. A
# read without a lock: it never waits for an enqueue's open transaction.
# The head of each partition ``s`` of later_partition_seq, joined as ``j``.
JOIN_HEAD_OF_SEQ: Final = compose(
    "LEFT JOIN later_job j ON j.id = ({head})",
    head=compose(HEAD_OF, namespace="s.namespace", topic="s.topic", partition="s.partition"),
)

PARTITION_HEADS_SQL: Final = compose(
    """
SELECT s.topic, s.partition, j.id, j.stage
FROM later_partition_seq s {join_head}
WHERE s.namespace = %s
""",
    join_head=JOIN_HEAD_OF_SEQ,
)

# A server's hold on a partition; released partitions show no owner.
PARTITION_LEASE: Final = LeaseTable(
    "later_partition",
    ("namespace", "topic", "partition"),
    "owner",
    "lease_expires_ms",
    release_clears_holder=True,
)

# Take or keep a partition's lease (sql/leases.py's rule), also when it is
# held by a server whose heartbeat expired (it crashed: no need to wait out
# its lease). The row lock this takes (PostgreSQL) is held until the claim's
# transaction ends, so two servers never claim in one partition at once. No
# row returned: another live server holds it.
ACQUIRE: Final = take_sql(
    PARTITION_LEASE,
    source="""(namespace, topic, partition, owner, epoch, lease_expires_ms)
VALUES (%s, %s, %s, %s, 1, {now} + %s)""",
    takeover="""
   OR NOT EXISTS (
       SELECT 1 FROM later_server s
       WHERE s.id = later_partition.owner AND s.heartbeat_ms >= {now} - %s)""",
)
PARTITION_ACQUIRE_SQL: Final = ACQUIRE

# Claim the head of a partition whose lease this transaction just took: only
# a ready head, fenced by the lease's owner and epoch.
CLAIM_HEAD: Final = compose(
    "UPDATE later_job SET {to_running} WHERE id = ({head}) AND stage = 'enqueued'",
    to_running=TO_RUNNING,
    head=HEAD_ID,
)
PARTITION_CLAIM_HEAD_SQL: Final = compose(
    "{claim_head} RETURNING {returning}", claim_head=CLAIM_HEAD, returning=CLAIM_RETURNING
)

# Is (owner, epoch) still the partition's lease? Locks the row (PostgreSQL)
# until the outcome's transaction ends, so a takeover waits for the outcome
# or the outcome sees the takeover.
PARTITION_FENCE_SQL: Final = """SELECT 1 FROM later_partition
WHERE namespace = %s AND topic = %s AND partition = %s AND owner = %s AND epoch = %s {for_update}"""

# A server renews and releases its partitions by its id (never another's).
# A statement that changes several of them locks their rows in the order of
# their key first, as the batched success of heads does (PostgreSQL's
# PARTITION_COMPLETE_MANY_SQL), so two such statements never deadlock.
OWNED_IN_KEY_ORDER: Final = """(namespace, topic, partition) IN (
    SELECT namespace, topic, partition FROM later_partition
    WHERE namespace = %s AND owner = %s ORDER BY topic, partition {for_update})"""
PARTITION_RENEW_SQL: Final = renew_sql(
    PARTITION_LEASE, where=OWNED_IN_KEY_ORDER, returning="topic, partition, epoch"
)
PARTITION_RELEASE_SQL: Final = release_sql(
    PARTITION_LEASE, where="namespace = %s AND owner = %s AND topic = %s AND partition = %s"
)
PARTITION_RELEASE_ALL_SQL: Final = release_sql(PARTITION_LEASE, where=OWNED_IN_KEY_ORDER)

# force_fail_partition_head first takes the partition's row lock (and, on
# SQLite, the write lock) with a write that changes no value, so the head it
# reads next cannot finish before it decides; a call that fails nothing has
# then changed nothing.
PARTITION_LOCK_SQL: Final = """
UPDATE later_partition SET epoch = epoch
WHERE namespace = %s AND topic = %s AND partition = %s
"""
# The head fails whatever its stage (a running one's lease is dropped, so its
# owner's outcome is discarded), and the partition's epoch moves on so no
# write of the former holder passes.
PARTITION_BUMP_EPOCH_SQL: Final = """
UPDATE later_partition SET epoch = epoch + 1, owner = NULL, lease_expires_ms = 0
WHERE namespace = %s AND topic = %s AND partition = %s
"""
JOB_FORCE_FAIL_SQL: Final = compose(
    "UPDATE later_job SET {to_failed}, {lease_dropped} WHERE id = %s AND {unfinished}",
    to_failed=TO_FAILED,
    lease_dropped=LEASE_DROPPED,
    unfinished=UNFINISHED,
)

# truncate_partition_history: finished jobs of the partition but the newest
# ``keep`` (by sequence).
_TRUNCATED: Final = """namespace = %s AND topic = %s AND partition = %s
  AND stage IN ('success', 'failed', 'cancelled')
  AND id NOT IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND topic = %s AND partition = %s
      AND stage IN ('success', 'failed', 'cancelled')
    ORDER BY sequence DESC LIMIT %s)"""
JOB_TRUNCATE_HISTORY_SQL: Final = compose(
    "DELETE FROM later_job WHERE {truncated}", truncated=_TRUNCATED
)
# The parent lists of the fan-in jobs among them (sql/fan_in.py), deleted
# first: only continuations can have one.
FAN_IN_TRUNCATE_HISTORY_SQL: Final = compose(
    """
DELETE FROM later_fan_in WHERE child_id IN (
    SELECT id FROM later_job WHERE {truncated} AND parent_id IS NOT NULL)
""",
    truncated=_TRUNCATED,
)

# Per partition: the next sequence, the head's sequence and due time, and
# its lease. Depth is next - head: no count over jobs. The partitions are
# 0..count-1 of every topic registered in later_topic, generated by the
# recursive CTE (one row per partition, never a read of later_job), and
# every partition that had a job (a topic no longer registered keeps its
# figures until its jobs are gone). A partition without a sequence row never
# had a job: next sequence 0, and its head probe finds nothing.
PARTITION_STATS_SQL: Final = compose(
    """
WITH RECURSIVE registered(namespace, topic, partition, partitions) AS (
    SELECT namespace, name, 0, partitions FROM later_topic
    WHERE namespace = %s AND partitions > 0
    UNION ALL
    SELECT namespace, topic, partition + 1, partitions FROM registered
    WHERE partition + 1 < partitions
), every_partition(namespace, topic, partition) AS (
    SELECT namespace, topic, partition FROM registered
    UNION
    SELECT namespace, topic, partition FROM later_partition_seq WHERE namespace = %s
)
SELECT s.topic, s.partition, COALESCE(q.next_seq, 0), j.sequence, j.run_at_ms, j.stage,
       p.owner, p.epoch, p.lease_expires_ms
FROM every_partition s
LEFT JOIN later_partition_seq q
  ON q.namespace = s.namespace AND q.topic = s.topic AND q.partition = s.partition
{join_head}
LEFT JOIN later_partition p
  ON p.namespace = s.namespace AND p.topic = s.topic AND p.partition = s.partition
ORDER BY s.topic, s.partition
""",
    join_head=JOIN_HEAD_OF_SEQ,
)

# Servers that poll topics and whose heartbeat is fresh: who partitions are
# shared among.
TOPIC_SERVERS_SQL: Final = """
SELECT id FROM later_server
WHERE namespace = %s AND topics AND heartbeat_ms >= {now} - %s
ORDER BY id
"""
