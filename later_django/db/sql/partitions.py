"""SQL of sequential partition mode: sequences (``later_partition_seq``),
partition leases (``later_partition``) and partition jobs in ``later_job``
(docs/how-to/partitions.md).

A partition's unfinished jobs are written ``NOT (stage IN ('success',
'failed', 'cancelled'))`` everywhere, as the head index's predicate is:
SQLite uses a partial index only for a query whose terms imply it. A
partition's head is its unfinished job of the lowest sequence.

The partition leases follow the lease rule of sql/leases.py.
"""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# A partition's unfinished jobs (see above), for statements elsewhere.
UNFINISHED: Final = "NOT (stage IN ('success', 'failed', 'cancelled'))"


# The sequence of a new job: the counter row is created or incremented in the
# job's own transaction and stays locked until it ends, so the next enqueue
# to the partition waits for this one to commit or roll back. Sequences are
# therefore gapless and committed in order: a poller never sees sequence n+1
# before n.
SEQUENCE_NEXT: Final = Statement("""
INSERT INTO later_partition_seq (namespace, topic, partition, next_seq)
VALUES (%(namespace)s, %(topic)s, %(partition)s, 1)
ON CONFLICT (namespace, topic, partition)
DO UPDATE SET next_seq = later_partition_seq.next_seq + 1
RETURNING next_seq - 1
""")

# Where a job is (its topic and partition), to chain a job after it.
PLACE: Final = Statement(
    "SELECT topic, partition FROM later_job WHERE id = %(job_id)s AND namespace = %(namespace)s"
)

# Every partition of the namespace that has had a job, with its head's id
# and stage (NULL when it has no unfinished job), one index probe each. A
# read without a lock: it never waits for an enqueue's open transaction.
PARTITION_HEADS: Final = Statement("""
SELECT s.topic, s.partition, j.id, j.stage
FROM later_partition_seq s LEFT JOIN later_job j ON j.id = (SELECT h.id FROM later_job h
    WHERE h.namespace = s.namespace AND h.topic = s.topic AND h.partition = s.partition
      AND NOT (h.stage IN ('success', 'failed', 'cancelled'))
    ORDER BY h.sequence LIMIT 1)
WHERE s.namespace = %(namespace)s
""")

# -- the claim of a partition's head ---------------------------------------------------
# The claim of a partition's head in one statement (the lease rule's take,
# then the head's claim). The lease is taken or kept, also when it is held
# by a server whose heartbeat expired (it crashed: no need to wait out its
# lease); the upsert locks the partition's row for the whole statement, so
# two servers never claim in one partition at once, and the head is claimed
# only if the upsert returned the lease: only a ready head. The head is read
# in the statement's snapshot, which may predate the lock: an older head
# found so has finished since, and its "stage = 'enqueued'", checked again on
# the row's newest version, claims nothing; a sequence never comes back, so
# no later job can be claimed before its turn. No row: another live server
# holds the lease.
PARTITION_CLAIM_PG: Final = Statement("""
WITH lease AS (
    INSERT INTO later_partition (namespace, topic, partition, owner, epoch, lease_expires_ms)
    VALUES (%(namespace)s, %(topic)s, %(partition)s, %(owner)s, 1,
        {now} + %(partition_lease_ms)s)
    ON CONFLICT (namespace, topic, partition) DO UPDATE SET
        epoch = later_partition.epoch
            + CASE WHEN later_partition.owner = excluded.owner
                AND later_partition.lease_expires_ms >= {now} THEN 0 ELSE 1 END,
        owner = excluded.owner, lease_expires_ms = excluded.lease_expires_ms
    WHERE later_partition.owner IS NULL OR later_partition.owner = excluded.owner
       OR later_partition.lease_expires_ms < {now}
       OR NOT EXISTS (
           SELECT 1 FROM later_server s
           WHERE s.id = later_partition.owner AND s.heartbeat_ms >= {now} - %(server_ttl_ms)s)
    RETURNING epoch
),
head AS (
    UPDATE later_job SET stage = 'running', attempts = attempts + 1,
        changed_ms = {greatest}({now}, changed_ms), started_ms = {greatest}({now}, changed_ms),
        lease_owner = %(owner)s, lease_expires_ms = {now} + %(job_lease_ms)s,
        history = history || 'running@' || {greatest}({now}, changed_ms) || ';'
    WHERE id = (SELECT h.id FROM later_job h
        WHERE h.namespace = %(namespace)s AND h.topic = %(topic)s
          AND h.partition = %(partition)s
          AND NOT (h.stage IN ('success', 'failed', 'cancelled'))
        ORDER BY h.sequence LIMIT 1)
      AND stage = 'enqueued' AND EXISTS (SELECT 1 FROM lease)
    RETURNING id, type_name, payload, attempts, retry_policy, created_ms, run_at_ms, uncounted,
        timeout_ms
)
SELECT lease.epoch, head.* FROM lease LEFT JOIN head ON true
""")

# SQLite claims in two statements in one transaction (its write lock keeps
# every other claim out until it ends): first the lease, by the lease
# rule's take, also from a server whose heartbeat expired (it crashed: no
# need to wait out its lease). No row: another live server holds it.
PARTITION_ACQUIRE_SQLITE: Final = Statement("""
INSERT INTO later_partition (namespace, topic, partition, owner, epoch, lease_expires_ms)
VALUES (%(namespace)s, %(topic)s, %(partition)s, %(owner)s, 1, {now} + %(partition_lease_ms)s)
ON CONFLICT (namespace, topic, partition) DO UPDATE SET
    epoch = later_partition.epoch
        + CASE WHEN later_partition.owner = excluded.owner
            AND later_partition.lease_expires_ms >= {now} THEN 0 ELSE 1 END,
    owner = excluded.owner, lease_expires_ms = excluded.lease_expires_ms
WHERE later_partition.owner IS NULL OR later_partition.owner = excluded.owner
   OR later_partition.lease_expires_ms < {now}
   OR NOT EXISTS (
       SELECT 1 FROM later_server s
       WHERE s.id = later_partition.owner AND s.heartbeat_ms >= {now} - %(server_ttl_ms)s)
RETURNING epoch
""")

# Then the head of the partition whose lease this transaction just took, or
# whose head it just stored (the next head): only a ready head, fenced by
# the lease's owner and epoch.
HEAD_CLAIM_SQLITE: Final = Statement("""
UPDATE later_job SET stage = 'running', attempts = attempts + 1,
    changed_ms = {greatest}({now}, changed_ms), started_ms = {greatest}({now}, changed_ms),
    lease_owner = %(owner)s, lease_expires_ms = {now} + %(job_lease_ms)s,
    history = history || 'running@' || {greatest}({now}, changed_ms) || ';'
WHERE id = (SELECT h.id FROM later_job h
    WHERE h.namespace = %(namespace)s AND h.topic = %(topic)s AND h.partition = %(partition)s
      AND NOT (h.stage IN ('success', 'failed', 'cancelled'))
    ORDER BY h.sequence LIMIT 1)
  AND stage = 'enqueued'
RETURNING id, type_name, payload, attempts, retry_policy, created_ms, run_at_ms, uncounted,
    timeout_ms
""")

# -- the successes of partition heads ------------------------------------------------
# The successes of partition heads in one statement, each behind its
# partition's fence, and the next head of each partition asked for
# (``chain``) claimed by the same statement. The fence locks the rows the
# server still holds at the heads' epochs, in the order of their key, as
# every statement that locks several partitions does (PARTITION_RENEW,
# PARTITION_RELEASE_ALL), so two never deadlock; the locks are held to the
# end of the statement. The heads behind a fence that held are stored by
# later_complete_many (each also fenced by its claim).
#
# A next head is the partition's lowest unfinished job but the head just
# stored: the statement's snapshot predates the store, so the stored head
# still looks unfinished in it. The next head must be ready in that
# snapshot and still on its newest version; a continuation the store itself
# released is not seen, and its partition is claimed the usual way. No job
# of a lower sequence can be missing from the snapshot: sequences commit in
# order (SEQUENCE_NEXT). One row per next head claimed (done_ids and
# released repeated), or one row without one. SQLite stores them with a
# statement each (PARTITION_FENCE, the hot store's batch completion,
# HEAD_CLAIM_SQLITE) in one transaction.
PARTITION_COMPLETE_MANY_PG: Final = Statement("""
WITH given(topic, partition, epoch, id, attempts, chain) AS (
    SELECT * FROM unnest(
        %(topics)s::text[], %(partitions)s::integer[], %(epochs)s::bigint[], %(ids)s::text[],
        %(attempts)s::integer[], %(chain)s::boolean[])
),
fence AS MATERIALIZED (
    SELECT p.namespace, p.topic, p.partition FROM later_partition p
    WHERE p.namespace = %(namespace)s AND p.owner = %(owner)s
      AND (p.topic, p.partition, p.epoch) IN (SELECT topic, partition, epoch FROM given)
    ORDER BY p.topic, p.partition
    FOR UPDATE
),
held AS MATERIALIZED (
    SELECT f.namespace, g.topic, g.partition, g.id, g.attempts, g.chain
    FROM given g JOIN fence f ON f.topic = g.topic AND f.partition = g.partition
),
c AS MATERIALIZED (
    SELECT c.done_ids, c.released FROM (
        SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids,
               coalesce(array_agg(attempts ORDER BY id), '{}') AS attempts
        FROM held
    ) h CROSS JOIN LATERAL later_complete_many(h.ids, h.attempts, %(owner)s, %(retention_ms)s) c
),
next AS (
    UPDATE later_job SET stage = 'running', attempts = attempts + 1,
        changed_ms = {greatest}({now}, changed_ms), started_ms = {greatest}({now}, changed_ms),
        lease_owner = %(owner)s, lease_expires_ms = {now} + %(job_lease_ms)s,
        history = history || 'running@' || {greatest}({now}, changed_ms) || ';'
    WHERE id IN (
        SELECT (
            SELECT n.id FROM later_job n
            WHERE n.namespace = h.namespace AND n.topic = h.topic
              AND n.partition = h.partition AND NOT (n.stage IN ('success', 'failed', 'cancelled'))
              AND n.id <> h.id
            ORDER BY n.sequence LIMIT 1)
        FROM held h, c WHERE h.chain AND h.id = ANY (c.done_ids)
    ) AND stage = 'enqueued'
    RETURNING topic, partition, id, type_name, payload, attempts, retry_policy, created_ms,
        run_at_ms, uncounted, timeout_ms
)
SELECT c.done_ids, c.released, next.* FROM c LEFT JOIN next ON true
""")

# -- the leases a server holds -------------------------------------------------------
# Is (owner, epoch) still the partition's lease (the lease rule's fence)?
# Locks the row (PostgreSQL) until the outcome's transaction ends, so a
# takeover waits for the outcome or the outcome sees the takeover.
PARTITION_FENCE: Final = Statement("""
SELECT 1 FROM later_partition
WHERE namespace = %(namespace)s AND topic = %(topic)s AND partition = %(partition)s
  AND owner = %(owner)s AND epoch = %(epoch)s {for_update}
""")

# Extend every partition lease a server holds (the lease rule's renewal,
# fenced by the server's id, which no other holder ever has); each one's
# epoch returned. Its rows are locked in the order of their key first, as
# every statement that changes several partitions locks them
# (PARTITION_COMPLETE_MANY_PG), so two such statements never deadlock.
PARTITION_RENEW: Final = Statement("""
UPDATE later_partition SET lease_expires_ms = {now} + %(lease_ms)s
WHERE (namespace, topic, partition) IN (
    SELECT namespace, topic, partition FROM later_partition
    WHERE namespace = %(namespace)s AND owner = %(owner)s ORDER BY topic, partition {for_update})
RETURNING topic, partition, epoch
""")

# Let one partition of a server go now (the lease rule's release, by the
# server's id): expired at once, the row (and its epoch) kept; released
# partitions show no owner.
PARTITION_RELEASE: Final = Statement("""
UPDATE later_partition SET lease_expires_ms = 0, owner = NULL
WHERE namespace = %(namespace)s AND owner = %(owner)s AND topic = %(topic)s
  AND partition = %(partition)s
""")

# Let every partition of a server go now (the lease rule's release, by the
# server's id), its rows locked in the order of their key as PARTITION_RENEW
# locks them.
PARTITION_RELEASE_ALL: Final = Statement("""
UPDATE later_partition SET lease_expires_ms = 0, owner = NULL
WHERE (namespace, topic, partition) IN (
    SELECT namespace, topic, partition FROM later_partition
    WHERE namespace = %(namespace)s AND owner = %(owner)s ORDER BY topic, partition {for_update})
""")

# Servers that poll topics and whose heartbeat is fresh: who partitions are
# shared among.
TOPIC_SERVERS: Final = Statement("""
SELECT id FROM later_server
WHERE namespace = %(namespace)s AND topics AND heartbeat_ms >= {now} - %(ttl_ms)s
ORDER BY id
""")

# -- an operator's actions ---------------------------------------------------------
# A force-fail of a partition's head first takes the partition's row lock
# (and, on SQLite, the write lock) with a write that changes no value, so
# the head it reads next cannot finish before it decides; a call that fails
# nothing has then changed nothing.
PARTITION_LOCK: Final = Statement("""
UPDATE later_partition SET epoch = epoch
WHERE namespace = %(namespace)s AND topic = %(topic)s AND partition = %(partition)s
""")

# The head of a partition, read under PARTITION_LOCK.
HEAD: Final = Statement("""
SELECT h.id FROM later_job h
WHERE h.namespace = %(namespace)s AND h.topic = %(topic)s AND h.partition = %(partition)s
  AND NOT (h.stage IN ('success', 'failed', 'cancelled'))
ORDER BY h.sequence LIMIT 1
""")

# The head fails whatever its stage: a running one's lease is dropped, so
# its owner's outcome is discarded. Its row expires the retention after.
FORCE_FAIL: Final = Statement("""
UPDATE later_job SET stage = 'failed', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    last_error = %(error)s, history = history || 'failed@' || {greatest}({now}, changed_ms) || ';',
    lease_owner = NULL, lease_expires_ms = NULL
WHERE id = %(job_id)s AND NOT (stage IN ('success', 'failed', 'cancelled'))
""")

# Then the partition's epoch moves on and its lease is released (the lease
# rule: an operator's force-fail ends the tenure), so no write of the
# former holder passes.
PARTITION_BUMP_EPOCH: Final = Statement("""
UPDATE later_partition SET epoch = epoch + 1, owner = NULL, lease_expires_ms = 0
WHERE namespace = %(namespace)s AND topic = %(topic)s AND partition = %(partition)s
""")

# A partition's history truncated: the parent lists of the fan-in jobs
# among its finished jobs but the newest ``keep`` (by sequence), deleted
# first (sql/enqueue.py): only continuations can have one.
FAN_IN_TRUNCATE_HISTORY: Final = Statement("""
DELETE FROM later_fan_in WHERE child_id IN (
    SELECT id FROM later_job
    WHERE namespace = %(namespace)s AND topic = %(topic)s AND partition = %(partition)s
      AND stage IN ('success', 'failed', 'cancelled')
      AND id NOT IN (
        SELECT id FROM later_job
        WHERE namespace = %(namespace)s AND topic = %(topic)s AND partition = %(partition)s
          AND stage IN ('success', 'failed', 'cancelled')
        ORDER BY sequence DESC LIMIT %(keep)s)
      AND parent_id IS NOT NULL)
""")

# Then the finished jobs of the partition but the newest ``keep``.
TRUNCATE_HISTORY: Final = Statement("""
DELETE FROM later_job
WHERE namespace = %(namespace)s AND topic = %(topic)s AND partition = %(partition)s
  AND stage IN ('success', 'failed', 'cancelled')
  AND id NOT IN (
    SELECT id FROM later_job
    WHERE namespace = %(namespace)s AND topic = %(topic)s AND partition = %(partition)s
      AND stage IN ('success', 'failed', 'cancelled')
    ORDER BY sequence DESC LIMIT %(keep)s)
""")

# Per partition: the next sequence, the head's sequence and due time, and
# its lease. Depth is next - head: no count over jobs. The partitions are
# 0..count-1 of every topic registered in later_topic, generated by the
# recursive CTE (one row per partition, never a read of later_job), and
# every partition that had a job (a topic no longer registered keeps its
# figures until its jobs are gone). A partition without a sequence row never
# had a job: next sequence 0, and its head probe finds nothing.
PARTITION_STATS: Final = Statement("""
WITH RECURSIVE registered(namespace, topic, partition, partitions) AS (
    SELECT namespace, name, 0, partitions FROM later_topic
    WHERE namespace = %(namespace)s AND partitions > 0
    UNION ALL
    SELECT namespace, topic, partition + 1, partitions FROM registered
    WHERE partition + 1 < partitions
), every_partition(namespace, topic, partition) AS (
    SELECT namespace, topic, partition FROM registered
    UNION
    SELECT namespace, topic, partition FROM later_partition_seq WHERE namespace = %(namespace)s
)
SELECT s.topic, s.partition, COALESCE(q.next_seq, 0), j.sequence, j.run_at_ms, j.stage,
       p.owner, p.epoch, p.lease_expires_ms
FROM every_partition s
LEFT JOIN later_partition_seq q
  ON q.namespace = s.namespace AND q.topic = s.topic AND q.partition = s.partition
LEFT JOIN later_job j ON j.id = (SELECT h.id FROM later_job h
    WHERE h.namespace = s.namespace AND h.topic = s.topic AND h.partition = s.partition
      AND NOT (h.stage IN ('success', 'failed', 'cancelled'))
    ORDER BY h.sequence LIMIT 1)
LEFT JOIN later_partition p
  ON p.namespace = s.namespace AND p.topic = s.topic AND p.partition = s.partition
ORDER BY s.topic, s.partition
""")
