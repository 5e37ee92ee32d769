"""SQL of what a finished job does to the jobs waiting on it
(db/descendants.py): its waiting descendants failed, those that failed
because it did made to wait again (a retry), a fan-in child resolved by all
its parents, an orphan released or failed.

A job's children are found by both links, parent_id and later_fan_in
(sql/enqueue.py). Each vendor writes the recursion its own way, so each walk
is two whole statements: PostgreSQL's takes both links in one LATERAL union
(a step of a recursive query may name the recursive table once only);
SQLite's, two recursive terms.
"""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Fail the waiting continuations of a job, and theirs, with an error (a
# stage change as every failure's).
FAIL_DESCENDANTS_PG: Final = Statement("""
WITH RECURSIVE d(id) AS (
    SELECT CAST(%(job_id)s AS text)
    UNION
    SELECT n.id FROM d CROSS JOIN LATERAL (
        SELECT c.id::text AS id FROM later_job c WHERE c.parent_id = d.id AND c.stage = 'waiting'
        UNION ALL
        SELECT c.id::text FROM later_fan_in f JOIN later_job c ON c.id = f.child_id
        WHERE f.parent_id = d.id AND c.stage = 'waiting') n
)
UPDATE later_job SET stage = 'failed', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    last_error = %(error)s, history = history || 'failed@' || {greatest}({now}, changed_ms) || ';'
WHERE id IN (SELECT id FROM d) AND stage = 'waiting'
""")
FAIL_DESCENDANTS_SQLITE: Final = Statement("""
WITH RECURSIVE d(id) AS (
    SELECT %(job_id)s
    UNION
    SELECT c.id FROM later_job c JOIN d ON c.parent_id = d.id WHERE c.stage = 'waiting'
    UNION
    SELECT c.id FROM later_fan_in f JOIN d ON f.parent_id = d.id
    JOIN later_job c ON c.id = f.child_id WHERE c.stage = 'waiting'
)
UPDATE later_job SET stage = 'failed', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    last_error = %(error)s, history = history || 'failed@' || {greatest}({now}, changed_ms) || ';'
WHERE id IN (SELECT id FROM d) AND stage = 'waiting'
""")

# The descendants of a retried job that failed because it did ('parent
# failed': states.PARENT_FAILED), waiting again, each on the parent it is
# reached through (the smallest id of those). Not a partition job, and not
# a unique one whose key another unfinished job of its type holds now: the
# key is that job's (control.py's RETRY_FAILED keeps the same rule, so both
# keep later_job_unique alike).
REVIVE_DESCENDANTS_PG: Final = Statement("""
UPDATE later_job SET stage = 'waiting', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = NULL, expires_ms = NULL, last_error = NULL, parent_id = r.via,
    history = history || 'waiting@' || {greatest}({now}, changed_ms) || ';'
FROM (
    WITH RECURSIVE d(id, via) AS (
        SELECT CAST(%(job_id)s AS text), CAST(NULL AS text)
        UNION
        SELECT n.id, d.id FROM d CROSS JOIN LATERAL (
            SELECT c.id::text AS id FROM later_job c
            WHERE c.parent_id = d.id AND c.stage = 'failed' AND c.last_error = 'parent failed'
              AND c.topic IS NULL
              AND NOT (c.unique_key IS NOT NULL AND EXISTS (
                SELECT 1 FROM later_job o
                WHERE o.namespace = c.namespace AND o.type_name = c.type_name
                  AND o.unique_key = c.unique_key
                  AND o.stage IN ('enqueued', 'delayed', 'waiting', 'running', 'requeued')))
            UNION ALL
            SELECT c.id::text FROM later_fan_in f JOIN later_job c ON c.id = f.child_id
            WHERE f.parent_id = d.id AND c.stage = 'failed' AND c.last_error = 'parent failed'
              AND c.topic IS NULL
              AND NOT (c.unique_key IS NOT NULL AND EXISTS (
                SELECT 1 FROM later_job o
                WHERE o.namespace = c.namespace AND o.type_name = c.type_name
                  AND o.unique_key = c.unique_key
                  AND o.stage IN ('enqueued', 'delayed', 'waiting', 'running', 'requeued')))
        ) n
    )
    SELECT id, MIN(via) AS via FROM d WHERE via IS NOT NULL GROUP BY id
) r
WHERE later_job.id = r.id AND later_job.stage = 'failed'
""")
REVIVE_DESCENDANTS_SQLITE: Final = Statement("""
UPDATE later_job SET stage = 'waiting', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = NULL, expires_ms = NULL, last_error = NULL, parent_id = r.via,
    history = history || 'waiting@' || {greatest}({now}, changed_ms) || ';'
FROM (
    WITH RECURSIVE d(id, via) AS (
        SELECT %(job_id)s, NULL
        UNION
        SELECT c.id, d.id FROM later_job c JOIN d ON c.parent_id = d.id
        WHERE c.stage = 'failed' AND c.last_error = 'parent failed' AND c.topic IS NULL
          AND NOT (c.unique_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM later_job o
            WHERE o.namespace = c.namespace AND o.type_name = c.type_name
              AND o.unique_key = c.unique_key
              AND o.stage IN ('enqueued', 'delayed', 'waiting', 'running', 'requeued')))
        UNION
        SELECT c.id, d.id FROM later_fan_in f JOIN d ON f.parent_id = d.id
        JOIN later_job c ON c.id = f.child_id
        WHERE c.stage = 'failed' AND c.last_error = 'parent failed' AND c.topic IS NULL
          AND NOT (c.unique_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM later_job o
            WHERE o.namespace = c.namespace AND o.type_name = c.type_name
              AND o.unique_key = c.unique_key
              AND o.stage IN ('enqueued', 'delayed', 'waiting', 'running', 'requeued')))
    )
    SELECT id, MIN(via) AS via FROM d WHERE via IS NOT NULL GROUP BY id
) AS r
WHERE later_job.id = r.id AND later_job.stage = 'failed'
""")

# REVIVE_DESCENDANTS for those without a unique key only: when reviving
# them all breaks later_job_unique (two failed continuations sharing a key,
# an enqueue taking one meanwhile), these still wait again.
REVIVE_KEYLESS_DESCENDANTS_PG: Final = Statement("""
UPDATE later_job SET stage = 'waiting', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = NULL, expires_ms = NULL, last_error = NULL, parent_id = r.via,
    history = history || 'waiting@' || {greatest}({now}, changed_ms) || ';'
FROM (
    WITH RECURSIVE d(id, via) AS (
        SELECT CAST(%(job_id)s AS text), CAST(NULL AS text)
        UNION
        SELECT n.id, d.id FROM d CROSS JOIN LATERAL (
            SELECT c.id::text AS id FROM later_job c
            WHERE c.parent_id = d.id AND c.stage = 'failed' AND c.last_error = 'parent failed'
              AND c.topic IS NULL AND c.unique_key IS NULL
            UNION ALL
            SELECT c.id::text FROM later_fan_in f JOIN later_job c ON c.id = f.child_id
            WHERE f.parent_id = d.id AND c.stage = 'failed' AND c.last_error = 'parent failed'
              AND c.topic IS NULL AND c.unique_key IS NULL
        ) n
    )
    SELECT id, MIN(via) AS via FROM d WHERE via IS NOT NULL GROUP BY id
) r
WHERE later_job.id = r.id AND later_job.stage = 'failed'
""")
REVIVE_KEYLESS_DESCENDANTS_SQLITE: Final = Statement("""
UPDATE later_job SET stage = 'waiting', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = NULL, expires_ms = NULL, last_error = NULL, parent_id = r.via,
    history = history || 'waiting@' || {greatest}({now}, changed_ms) || ';'
FROM (
    WITH RECURSIVE d(id, via) AS (
        SELECT %(job_id)s, NULL
        UNION
        SELECT c.id, d.id FROM later_job c JOIN d ON c.parent_id = d.id
        WHERE c.stage = 'failed' AND c.last_error = 'parent failed' AND c.topic IS NULL
          AND c.unique_key IS NULL
        UNION
        SELECT c.id, d.id FROM later_fan_in f JOIN d ON f.parent_id = d.id
        JOIN later_job c ON c.id = f.child_id
        WHERE c.stage = 'failed' AND c.last_error = 'parent failed' AND c.topic IS NULL
          AND c.unique_key IS NULL
    )
    SELECT id, MIN(via) AS via FROM d WHERE via IS NOT NULL GROUP BY id
) AS r
WHERE later_job.id = r.id AND later_job.stage = 'failed'
""")

# -- fan-in children, resolved by all their parents --------------------------------
# Of the children listed, the waiting ones with a parent failed or
# cancelled: failed with an error; their ids.
FAN_IN_FAIL: Final = Statement(
    """
UPDATE later_job SET stage = 'failed', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    last_error = %(error)s, history = history || 'failed@' || {greatest}({now}, changed_ms) || ';'
WHERE id IN (%(child_ids)s) AND stage = 'waiting' AND EXISTS (
    SELECT 1 FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = later_job.id AND p.stage IN ('failed', 'cancelled'))
RETURNING id
""",
    lists=("child_ids",),
)

# Of the children listed, the waiting ones whose every parent succeeded:
# due now. A parent listed but gone was pruned after it finished: a failed
# or cancelled one fails its fan-in children in the same transaction (or,
# at the latest, at the maintenance tick after), long before its retention
# ends, so a gone parent counts as succeeded.
FAN_IN_RELEASE: Final = Statement(
    """
UPDATE later_job SET stage = 'enqueued', changed_ms = {greatest}({now}, changed_ms),
    history = history || 'enqueued@' || {greatest}({now}, changed_ms) || ';', run_at_ms = {now}
WHERE id IN (%(child_ids)s) AND stage = 'waiting' AND NOT EXISTS (
    SELECT 1 FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = later_job.id AND p.stage <> 'success')
""",
    lists=("child_ids",),
)

# Of the children listed, those still waiting on a parent that finished:
# made to wait on an unfinished one, the one likely to finish last (not
# running, due last, newest).
FAN_IN_REPOINT: Final = Statement(
    """
UPDATE later_job SET parent_id = (
    SELECT p.id FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = later_job.id AND p.stage NOT IN ('success', 'failed', 'cancelled')
    ORDER BY CASE p.stage WHEN 'running' THEN 1 ELSE 0 END, p.run_at_ms DESC, p.id DESC
    LIMIT 1)
WHERE id IN (%(child_ids)s) AND stage = 'waiting'
  AND NOT EXISTS (
    SELECT 1 FROM later_job w
    WHERE w.id = later_job.parent_id AND w.stage NOT IN ('success', 'failed', 'cancelled'))
  AND EXISTS (SELECT 1 FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
    WHERE f.child_id = later_job.id AND p.stage NOT IN ('success', 'failed', 'cancelled'))
""",
    lists=("child_ids",),
)

# -- orphans ------------------------------------------------------------------------
# A waiting continuation whose parent succeeded: due now.
RELEASE_ONE: Final = Statement("""
UPDATE later_job SET stage = 'enqueued', changed_ms = {greatest}({now}, changed_ms),
    history = history || 'enqueued@' || {greatest}({now}, changed_ms) || ';', run_at_ms = {now}
WHERE id = %(job_id)s AND stage = 'waiting'
""")

# A waiting continuation whose parent failed or is gone: failed with an error.
FAIL_WAITING: Final = Statement("""
UPDATE later_job SET stage = 'failed', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    last_error = %(error)s, history = history || 'failed@' || {greatest}({now}, changed_ms) || ';'
WHERE id = %(job_id)s AND stage = 'waiting'
""")
