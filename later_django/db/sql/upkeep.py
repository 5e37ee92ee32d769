"""SQL of maintenance on ``later_job`` (``dialect.upkeep``): due jobs made
ready, stuck jobs found, orphans, pruning, and PostgreSQL's folding of the
stage counters. Every statement is safe to run from many servers at once."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Make up to a limit of delayed and requeued jobs whose time has come ready,
# soonest due first; servers promoting at once skip each other's rows.
# PostgreSQL picks the due ids once, in a MATERIALIZED CTE: it may run the
# LIMIT subquery of "UPDATE ... WHERE id IN (SELECT ... LIMIT n)" more than
# once and change more rows than asked.
PROMOTE_DUE_PG: Final = Statement("""
WITH due AS MATERIALIZED (
    SELECT id FROM later_job
    WHERE namespace = %(namespace)s AND stage IN ('delayed', 'requeued') AND run_at_ms <= {now}
    ORDER BY run_at_ms LIMIT %(limit)s {skip_locked})
UPDATE later_job SET stage = 'enqueued', changed_ms = {greatest}({now}, changed_ms),
    history = history || 'enqueued@' || {greatest}({now}, changed_ms) || ';'
WHERE id IN (SELECT id FROM due) AND stage IN ('delayed', 'requeued')
""")
# SQLite's form: its driver reports no row count for a statement that starts
# with WITH (and one writer at a time runs the subquery once).
PROMOTE_DUE_SQLITE: Final = Statement("""
UPDATE later_job SET stage = 'enqueued', changed_ms = {greatest}({now}, changed_ms),
    history = history || 'enqueued@' || {greatest}({now}, changed_ms) || ';'
WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %(namespace)s AND stage IN ('delayed', 'requeued') AND run_at_ms <= {now}
    ORDER BY run_at_ms LIMIT %(limit)s)
  AND stage IN ('delayed', 'requeued')
""")

# How long until the first delayed or requeued job is due: the worker then
# promotes it on time instead of at its next maintenance tick.
NEXT_DUE: Final = Statement("""
SELECT MIN(run_at_ms) - {now} FROM later_job
WHERE namespace = %(namespace)s AND stage IN ('delayed', 'requeued')
""")

# Running jobs whose lease expired at least expired_for_ms ago, the longest
# expired first: what the rescuer retries or fails, with a fence of the
# expired lease.
STUCK: Final = Statement("""
SELECT id, type_name, attempts, retry_policy, COALESCE(uncounted, 0),
    cancel_requested_ms IS NOT NULL
FROM later_job
WHERE namespace = %(namespace)s AND stage = 'running'
  AND lease_expires_ms < {now} - %(expired_for_ms)s
ORDER BY lease_expires_ms LIMIT %(limit)s
""")

# Waiting continuations whose parent finished or is gone, and fan-in
# children with a parent that failed or was cancelled whatever the one they
# wait on (its failure missed them only if it committed before they did and
# their own check after the commit did not run); whether each is a fan-in
# child (sql/enqueue.py), which is resolved by all its parents.
ORPHANS: Final = Statement("""
SELECT c.id, p.stage, EXISTS (SELECT 1 FROM later_fan_in f WHERE f.child_id = c.id)
FROM later_job c
LEFT JOIN later_job p ON p.id = c.parent_id
WHERE c.namespace = %(namespace)s AND c.stage = 'waiting'
  AND (p.id IS NULL OR p.stage IN ('success', 'failed', 'cancelled') OR EXISTS (
    SELECT 1 FROM later_fan_in f JOIN later_job q ON q.id = f.parent_id
    WHERE f.child_id = c.id AND q.stage IN ('failed', 'cancelled')))
LIMIT %(limit)s
""")

# Finished jobs past their retention, deleted; servers pruning at once skip
# each other's rows instead of queueing on them. Whether each was a
# continuation: only those can have fan-in rows.
PRUNE: Final = Statement("""
DELETE FROM later_job WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %(namespace)s AND expires_ms IS NOT NULL AND expires_ms <= {now}
    LIMIT %(limit)s {skip_locked})
RETURNING id, parent_id IS NOT NULL
""")

# The Tasks backend's results of jobs just pruned, in the same transaction.
PRUNE_TASK_RESULTS: Final = Statement(
    "DELETE FROM later_task_result WHERE job_id IN (%(job_ids)s)", lists=("job_ids",)
)

# The parent lists of fan-in children just pruned, in the same transaction.
PRUNE_FAN_IN: Final = Statement(
    "DELETE FROM later_fan_in WHERE child_id IN (%(job_ids)s)", lists=("job_ids",)
)

# -- PostgreSQL's stage counters: delta rows folded ----------------------------------
# One folder at a time per namespace (a transaction-scoped advisory lock on
# a key of the namespace); the others skip this round.
COUNTER_FOLD_LOCK_PG: Final = Statement("SELECT pg_try_advisory_xact_lock(%(key)s)")

# How many counter rows the namespace has.
COUNTER_ROWS_PG: Final = Statement(
    "SELECT count(*) FROM later_stage_count WHERE namespace = %(namespace)s"
)

# The namespace's counter rows folded into one per stage and lane.
COUNTER_FOLD_PG: Final = Statement("""
WITH folded AS (
    DELETE FROM later_stage_count WHERE namespace = %(namespace)s RETURNING stage, lane, n
)
INSERT INTO later_stage_count (namespace, stage, lane, n)
SELECT %(namespace)s, stage, lane, SUM(n) FROM folded GROUP BY stage, lane
""")
