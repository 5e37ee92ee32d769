"""SQL of sequential partition mode: sequences (``later_partition_seq``),
partition leases (``later_partition``) and partition jobs in ``later_job``
(docs/partitions.md)."""

from __future__ import annotations

from typing import Final

from later_django.db.sql.jobs import CLAIM_RETURNING, INSERT_COLUMNS

# A partition's unfinished jobs, written as the head index's predicate is
# (SQLite uses a partial index only for a query whose terms imply it).
UNFINISHED: Final = "NOT (stage IN ('success', 'failed', 'cancelled'))"

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

PARTITION_COLUMNS: Final = f"{INSERT_COLUMNS}, topic, partition, sequence"

# As jobs.JOB_INSERT_SQL, with the partition's columns.
JOB_INSERT_SQL: Final = f"""
INSERT INTO later_job ({PARTITION_COLUMNS})
SELECT %s, %s, %s, %s, t.stage, %s, 0, %s, NULL, t.now, t.run_at, t.now,
    t.stage || '@' || t.now || ';', %s, %s, %s
FROM (
    SELECT r.now, {{greatest}}(r.run_at, r.now) AS run_at,
        CASE WHEN r.run_at > r.now THEN 'delayed' ELSE 'enqueued' END AS stage
    FROM (
        SELECT n.now, COALESCE(%s, n.now + %s) AS run_at
        FROM (SELECT {{now}} AS now) n
    ) r
) t
RETURNING stage"""

# As jobs.JOB_INSERT_CONTINUATION_SQL, with the partition's columns.
JOB_INSERT_CONTINUATION_SQL: Final = f"""
INSERT INTO later_job ({PARTITION_COLUMNS}, finished_ms, expires_ms, last_error)
SELECT %s, p.namespace, %s, %s, p.child_stage, %s, 0, %s, p.id, {{now}}, {{now}}, {{now}},
       p.child_stage || '@' || {{now}} || ';', %s, %s, %s,
       CASE WHEN p.child_stage = 'failed' THEN {{now}} END,
       CASE WHEN p.child_stage = 'failed' THEN {{now}} + %s END,
       CASE WHEN p.child_stage = 'failed' THEN %s END
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

# The head of a partition: its unfinished job of the lowest sequence.
HEAD_ID: Final = f"""
SELECT h.id FROM later_job h
WHERE h.namespace = %s AND h.topic = %s AND h.partition = %s
  AND {UNFINISHED.replace("stage", "h.stage")}
ORDER BY h.sequence LIMIT 1
"""

# Every partition of the namespace that has had a job, with its head's id
# and stage (NULL when it has no unfinished job), one index probe each. A
# read without a lock: it never waits for an enqueue's open transaction.
# The head of each partition ``s`` of later_partition_seq, joined as ``j``.
JOIN_HEAD_OF_SEQ: Final = f"""
LEFT JOIN later_job j ON j.id = (
    SELECT h.id FROM later_job h
    WHERE h.namespace = s.namespace AND h.topic = s.topic AND h.partition = s.partition
      AND {UNFINISHED.replace("stage", "h.stage")}
    ORDER BY h.sequence LIMIT 1)"""

PARTITION_HEADS_SQL: Final = f"""
SELECT s.topic, s.partition, j.id, j.stage
FROM later_partition_seq s {JOIN_HEAD_OF_SEQ}
WHERE s.namespace = %s
"""

# Take or keep a partition's lease. A new holder gets the next epoch; the
# holder renewing a live lease keeps its epoch. Taken only when the lease is
# free, expired, already this server's, or held by a server whose heartbeat
# expired (it crashed: no need to wait out its lease). The row lock this
# takes (PostgreSQL) is held until the claim's transaction ends, so two
# servers never claim in one partition at once. No row returned: another
# live server holds it.
ACQUIRE: Final = """INSERT INTO later_partition
    (namespace, topic, partition, owner, epoch, lease_expires_ms)
VALUES (%s, %s, %s, %s, 1, {now} + %s)
ON CONFLICT (namespace, topic, partition) DO UPDATE SET
    epoch = CASE WHEN later_partition.owner = excluded.owner
                  AND later_partition.lease_expires_ms >= {now}
            THEN later_partition.epoch ELSE later_partition.epoch + 1 END,
    owner = excluded.owner, lease_expires_ms = excluded.lease_expires_ms
WHERE later_partition.owner IS NULL OR later_partition.owner = excluded.owner
   OR later_partition.lease_expires_ms < {now}
   OR NOT EXISTS (
       SELECT 1 FROM later_server s
       WHERE s.id = later_partition.owner AND s.heartbeat_ms >= {now} - %s)
RETURNING epoch"""
PARTITION_ACQUIRE_SQL: Final = ACQUIRE

# Claim the head of a partition whose lease this transaction just took: only
# a ready head, fenced by the lease's owner and epoch.
CLAIM_HEAD: Final = f"""UPDATE later_job SET stage = 'running', attempts = attempts + 1,
    changed_ms = {{stamp}}, started_ms = {{stamp}}, lease_owner = %s,
    lease_expires_ms = {{now}} + %s, history = history || 'running@' || {{stamp}} || ';'
WHERE id = ({HEAD_ID}) AND stage = 'enqueued'"""
PARTITION_CLAIM_HEAD_SQL: Final = f"""{CLAIM_HEAD}
RETURNING {CLAIM_RETURNING}
"""

# Is (owner, epoch) still the partition's lease? Locks the row (PostgreSQL)
# until the outcome's transaction ends, so a takeover waits for the outcome
# or the outcome sees the takeover.
PARTITION_FENCE_SQL: Final = """
SELECT 1 FROM later_partition
WHERE namespace = %s AND topic = %s AND partition = %s AND owner = %s AND epoch = %s
{for_update}
"""

PARTITION_RENEW_SQL: Final = """
UPDATE later_partition SET lease_expires_ms = {now} + %s
WHERE namespace = %s AND owner = %s
RETURNING topic, partition, epoch
"""

# A released lease expires at once but keeps its epoch: the next holder's is
# higher.
PARTITION_RELEASE_SQL: Final = """
UPDATE later_partition SET owner = NULL, lease_expires_ms = 0
WHERE namespace = %s AND owner = %s AND topic = %s AND partition = %s
"""
PARTITION_RELEASE_ALL_SQL: Final = """
UPDATE later_partition SET owner = NULL, lease_expires_ms = 0
WHERE namespace = %s AND owner = %s
"""

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
JOB_FORCE_FAIL_SQL: Final = f"""
UPDATE later_job SET stage = 'failed', changed_ms = {{stamp}}, finished_ms = {{stamp}},
    expires_ms = {{now}} + %s, last_error = %s, lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'failed@' || {{stamp}} || ';'
WHERE id = %s AND {UNFINISHED}
"""

# truncate_partition_history: finished jobs of the partition but the newest
# ``keep`` (by sequence).
JOB_TRUNCATE_HISTORY_SQL: Final = """
DELETE FROM later_job
WHERE namespace = %s AND topic = %s AND partition = %s
  AND stage IN ('success', 'failed', 'cancelled')
  AND id NOT IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND topic = %s AND partition = %s
      AND stage IN ('success', 'failed', 'cancelled')
    ORDER BY sequence DESC LIMIT %s)
"""

# Per partition: the next sequence, the head's sequence and due time, and
# its lease. Depth is next - head: no count over jobs. The partitions are
# 0..count-1 of every topic registered in later_topic, generated by the
# recursive CTE (one row per partition, never a read of later_job), and
# every partition that had a job (a topic no longer registered keeps its
# figures until its jobs are gone). A partition without a sequence row never
# had a job: next sequence 0, and its head probe finds nothing.
PARTITION_STATS_SQL: Final = f"""
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
{JOIN_HEAD_OF_SEQ}
LEFT JOIN later_partition p
  ON p.namespace = s.namespace AND p.topic = s.topic AND p.partition = s.partition
ORDER BY s.topic, s.partition
"""

# Servers that poll topics and whose heartbeat is fresh: who partitions are
# shared among.
TOPIC_SERVERS_SQL: Final = """
SELECT id FROM later_server
WHERE namespace = %s AND topics AND heartbeat_ms >= {now} - %s
ORDER BY id
"""
