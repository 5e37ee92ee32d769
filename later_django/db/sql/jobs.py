"""SQL both databases run on ``later_job``: enqueue, the worker's writes under
its fence, and maintenance. The claim and the batch completion differ per
vendor (postgresql.py, sqlite.py)."""

from __future__ import annotations

from typing import Final

from later_django.states import PARENT_FAILED

# What a claim returns, in ClaimedJob's order (db/rows/jobs.py claimed_jobs).
CLAIM_RETURNING: Final = (
    "id, type_name, payload, attempts, retry_policy, created_ms, run_at_ms, uncounted"
)

INSERT_COLUMNS: Final = (
    "id, namespace, type_name, payload, stage, priority, attempts, retry_policy, "
    "parent_id, created_ms, run_at_ms, changed_ms, history"
)

# One ready or delayed job; returns its stage. The stage follows from the
# database's clock: a run_at already past makes the job ready at once.
JOB_INSERT_SQL: Final = f"""
INSERT INTO later_job ({INSERT_COLUMNS})
SELECT %s, %s, %s, %s, t.stage, %s, 0, %s, NULL, t.now, t.run_at, t.now,
    t.stage || '@' || t.now || ';'
FROM (
    SELECT r.now, {{greatest}}(r.run_at, r.now) AS run_at,
        CASE WHEN r.run_at > r.now THEN 'delayed' ELSE 'enqueued' END AS stage
    FROM (
        SELECT n.now, COALESCE(%s, n.now + %s) AS run_at
        FROM (SELECT {{now}} AS now) n
    ) r
) t
 RETURNING stage"""

# The child's stage follows its parent's, read in the same statement without
# a lock: a caller's transaction left open must not hold up the parent's
# renewal or completion. A parent that finishes while the child's
# transaction is still open is caught by job_settle_child after its commit.
JOB_INSERT_CONTINUATION_SQL: Final = f"""
INSERT INTO later_job ({INSERT_COLUMNS}, finished_ms, expires_ms, last_error)
SELECT %s, p.namespace, %s, %s, p.child_stage, %s, 0, %s, p.id, {{now}}, {{now}}, {{now}},
       p.child_stage || '@' || {{now}} || ';',
       CASE WHEN p.child_stage = 'failed' THEN {{now}} END,
       CASE WHEN p.child_stage = 'failed' THEN {{now}} + %s END,
       CASE WHEN p.child_stage = 'failed' THEN '{PARENT_FAILED}' END
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

# A continuation's parent, read after the continuation committed. The share
# lock (held for this one statement only) waits for a finish of the parent
# that is under way, so one of the two always sees the other.
JOB_PARENT_STAGE_SQL: Final = """
SELECT p.stage FROM later_job c JOIN later_job p ON p.id = c.parent_id
WHERE c.id = %s AND c.stage = 'waiting' {share_lock}
"""

# Fences. A claim is (job id, attempt): every claim adds one to attempts, so
# a write made for an earlier claim of the same job, even by the same server,
# matches no row. The worker's own writes also name the owner; the rescuer's
# act only on a lease still expired when they run. A lease exists only while
# a job runs (a check constraint says so), so the fence alone finds a running
# job, by primary key: a "stage = 'running'" term would lead the planner to
# the small partial index of running jobs, slow while it holds dead entries
# between vacuums.
OWNER_FENCE: Final = "lease_owner = %s AND attempts = %s"
EXPIRED_FENCE: Final = "lease_expires_ms < {now} - %s AND attempts = %s"

# Fenced like every write of a claim: a renewal for attempt n never extends
# attempt n + 1 of the same job, so a handler of a recovered attempt learns
# that it lost its lease even when this server claimed the job again.
JOB_RENEW_SQL: Final = """
UPDATE later_job SET lease_expires_ms = {now} + %s
WHERE id IN ({ids}) AND (id, attempts) IN (VALUES {pairs}) AND lease_owner = %s
RETURNING id, attempts
"""

# The plain jobs ``owner`` claimed within the last ``%s`` ms that are still
# running: what a claim abandoned mid-statement may have taken. One claim
# statement stamps all its jobs with one started_ms.
JOB_CLAIMED_SINCE_SQL: Final = """
SELECT id, attempts FROM later_job
WHERE namespace = %s AND stage = 'running' AND lease_owner = %s AND topic IS NULL
  AND started_ms >= {now} - %s
"""

# The stage a claim left its job in, once it no longer runs: what an outcome
# whose store may or may not have committed finds.
JOB_STAGE_AFTER_SQL: Final = """
SELECT stage FROM later_job WHERE id = %s AND attempts = %s AND stage <> 'running'
"""

# Gives back a claim whose handler never started, or was stopped by its own
# worker: ready again, and the claim does not count as an attempt. attempts
# keeps it, so a write of that claim never matches a later one.
JOB_UNCLAIM_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = {stamp},
    uncounted = COALESCE(uncounted, 0) + 1,
    lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'enqueued@' || {stamp} || ';'
WHERE id = %s AND attempts = %s AND lease_owner = %s
"""

_JOB_RETRY_SQL: Final = """
UPDATE later_job SET stage = 'requeued', changed_ms = {stamp}, run_at_ms = {now} + %s,
    last_error = %s, retry_policy = COALESCE(%s, retry_policy),
    lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'requeued@' || {stamp} || ';'
WHERE id = %s AND {fence}
"""
JOB_RETRY_OWNED_SQL: Final = _JOB_RETRY_SQL.replace("{fence}", OWNER_FENCE)
JOB_RETRY_EXPIRED_SQL: Final = _JOB_RETRY_SQL.replace("{fence}", EXPIRED_FENCE)

_JOB_FAIL_SQL: Final = """
UPDATE later_job SET stage = 'failed', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, last_error = %s, lease_owner = NULL,
    lease_expires_ms = NULL, history = history || 'failed@' || {stamp} || ';'
WHERE id = %s AND {fence}
"""
JOB_FAIL_OWNED_SQL: Final = _JOB_FAIL_SQL.replace("{fence}", OWNER_FENCE)
JOB_FAIL_EXPIRED_SQL: Final = _JOB_FAIL_SQL.replace("{fence}", EXPIRED_FENCE)

# Continuations of continuations fail too: a chain never waits on a parent
# that can no longer succeed.
JOB_FAIL_DESCENDANTS_SQL: Final = """
WITH RECURSIVE d(id) AS (
    SELECT id FROM later_job WHERE parent_id = %s AND stage = 'waiting'
    UNION
    SELECT j.id FROM later_job j JOIN d ON j.parent_id = d.id
    WHERE j.stage = 'waiting'
)
UPDATE later_job SET stage = 'failed', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, last_error = %s,
    history = history || 'failed@' || {stamp} || ';'
WHERE id IN (SELECT id FROM d) AND stage = 'waiting'
"""

JOB_CANCEL_SQL: Final = """
UPDATE later_job SET stage = 'cancelled', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, history = history || 'cancelled@' || {stamp} || ';'
WHERE id = %s AND namespace = %s
  AND stage IN ('enqueued', 'delayed', 'waiting', 'requeued')
"""

JOB_PROMOTE_DUE_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = {stamp},
    history = history || 'enqueued@' || {stamp} || ';'
WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND stage IN ('delayed', 'requeued') AND run_at_ms <= {now}
    ORDER BY run_at_ms LIMIT %s {skip_locked})
  AND stage IN ('delayed', 'requeued')
"""

# How long until the first delayed or requeued job is due: the worker then
# promotes it on time instead of at its next maintenance tick.
JOB_NEXT_DUE_SQL: Final = """
SELECT MIN(run_at_ms) - {now} FROM later_job
WHERE namespace = %s AND stage IN ('delayed', 'requeued')
"""

JOB_STUCK_SQL: Final = """
SELECT id, type_name, attempts, retry_policy, COALESCE(uncounted, 0) FROM later_job
WHERE namespace = %s AND stage = 'running' AND lease_expires_ms < {now} - %s
ORDER BY lease_expires_ms LIMIT %s
"""

# Servers pruning at once skip each other's rows instead of queueing on them.
JOB_PRUNE_SQL: Final = """
DELETE FROM later_job WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %s AND expires_ms IS NOT NULL AND expires_ms <= {now}
    LIMIT %s {skip_locked})
RETURNING id
"""

# The Tasks backend's results of jobs just pruned, in the same transaction.
TASK_RESULT_PRUNE_SQL: Final = "DELETE FROM later_task_result WHERE job_id IN ({ids})"

JOB_ORPHANS_SQL: Final = """
SELECT c.id, p.stage FROM later_job c
LEFT JOIN later_job p ON p.id = c.parent_id
WHERE c.namespace = %s AND c.stage = 'waiting'
  AND (p.id IS NULL OR p.stage IN ('success', 'failed', 'cancelled'))
LIMIT %s
"""

JOB_RELEASE_ONE_SQL: Final = """
UPDATE later_job SET stage = 'enqueued', changed_ms = {stamp}, run_at_ms = {now},
    history = history || 'enqueued@' || {stamp} || ';'
WHERE id = %s AND stage = 'waiting'
"""

JOB_FAIL_WAITING_SQL: Final = """
UPDATE later_job SET stage = 'failed', changed_ms = {stamp}, finished_ms = {stamp},
    expires_ms = {now} + %s, last_error = %s,
    history = history || 'failed@' || {stamp} || ';'
WHERE id = %s AND stage = 'waiting'
"""

# SQLite's wake-up check after another connection committed: a read, no lock.
JOB_READY_EXISTS_SQL: Final = """
SELECT 1 FROM later_job WHERE namespace = %s AND stage = 'enqueued' AND topic IS NULL LIMIT 1
"""

# The database's clock, for callers that compute times from it in Python.
CLOCK_NOW_SQL: Final = "SELECT {now}"

# Tracing only: the enqueuing span's context, set in the enqueue's own
# transaction right after the insert, and read by the worker before the run.
# The statement-level counter trigger finds no stage change in it.
JOB_SET_TRACE_SQL: Final = "UPDATE later_job SET trace_context = %s WHERE id IN ({ids})"
JOB_TRACE_CONTEXT_SQL: Final = "SELECT trace_context FROM later_job WHERE id = %s"
