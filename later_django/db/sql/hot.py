"""SQL of the worker's hot path (``dialect.hot``): its writes under the
fence of a claim — renewal, give-back, retry, snooze, failure, a requested
cancel — and the reads it makes between claims.

Fences. A claim is (job id, attempt): every claim adds one to attempts, so
a write made for an earlier claim of the same job, even by the same server,
matches no row. The worker's own writes also name the owner (the _OWNED
statements); the rescuer's act only on a lease still expired when they run
(the _EXPIRED ones). A lease exists only while a job runs (a check
constraint says so), so the fence alone finds a running job, by primary
key: a "stage = 'running'" term would lead the planner to the small partial
index of running jobs, slow while it holds dead entries between vacuums.
Every stage change stamps the larger of the clock and the row's last
change, so a job's history never goes backwards.
"""

from __future__ import annotations

from typing import Final

from later_django.db.sql import Statement

# Extend the leases owner holds on the claims listed; the claims it still
# holds. Fenced like every write of a claim: a renewal for attempt n never
# extends attempt n + 1 of the same job, so a handler of a recovered
# attempt learns that it lost its lease even when this server claimed the
# job again.
RENEW: Final = Statement(
    """
UPDATE later_job SET lease_expires_ms = {now} + %(lease_ms)s
WHERE id IN (%(job_ids)s) AND (id, attempts) IN (VALUES %(claims)s) AND lease_owner = %(owner)s
RETURNING id, attempts
""",
    lists=("job_ids", "claims"),
)

# The plain jobs owner claimed from a queue within the last within_ms that
# are still running: what a claim abandoned mid-statement may have taken.
# One claim statement stamps all its jobs with one started_ms. A server
# claims each queue on a connection of its own, so this looks at the claims
# of one queue: another's may be in flight.
CLAIMED_SINCE: Final = Statement("""
SELECT id, attempts FROM later_job
WHERE namespace = %(namespace)s AND stage = 'running' AND lease_owner = %(owner)s
  AND topic IS NULL AND queue = %(queue_column)s AND started_ms >= {now} - %(within_ms)s
""")

# The stage a claim left its job in, once it no longer runs: what an
# outcome whose store may or may not have committed finds.
STAGE_AFTER: Final = Statement("""
SELECT stage, last_error FROM later_job
WHERE id = %(job_id)s AND attempts = %(attempts)s AND stage <> 'running'
""")

# Give back a claim whose handler never started, or was stopped by its own
# worker: ready again, and the claim does not count as an attempt. attempts
# keeps it, so a write of that claim never matches a later one. A job whose
# cancel was requested is not given back: its lease runs out and the
# rescue cancels it.
UNCLAIM: Final = Statement("""
UPDATE later_job SET stage = 'enqueued', changed_ms = {greatest}({now}, changed_ms),
    history = history || 'enqueued@' || {greatest}({now}, changed_ms) || ';',
    uncounted = COALESCE(uncounted, 0) + 1, lease_owner = NULL, lease_expires_ms = NULL
WHERE id = %(job_id)s AND attempts = %(attempts)s AND lease_owner = %(owner)s
  AND cancel_requested_ms IS NULL
""")

# A retry: requeued, due delay_ms from now, its error kept and its retry
# policy replaced when one is given. It does not pass once a cancel was
# requested: the job ends cancelled instead (CANCEL_RUNNING_*). Under the
# worker's own fence, or the rescuer's of an expired lease.
RETRY_OWNED: Final = Statement("""
UPDATE later_job SET stage = 'requeued', changed_ms = {greatest}({now}, changed_ms),
    run_at_ms = {now} + %(delay_ms)s, last_error = %(error)s,
    retry_policy = COALESCE(%(retry_policy)s, retry_policy),
    lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'requeued@' || {greatest}({now}, changed_ms) || ';'
WHERE id = %(job_id)s AND cancel_requested_ms IS NULL
  AND lease_owner = %(owner)s AND attempts = %(attempts)s
""")
RETRY_EXPIRED: Final = Statement("""
UPDATE later_job SET stage = 'requeued', changed_ms = {greatest}({now}, changed_ms),
    run_at_ms = {now} + %(delay_ms)s, last_error = %(error)s,
    retry_policy = COALESCE(%(retry_policy)s, retry_policy),
    lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'requeued@' || {greatest}({now}, changed_ms) || ';'
WHERE id = %(job_id)s AND cancel_requested_ms IS NULL
  AND lease_expires_ms < {now} - %(expired_for_ms)s AND attempts = %(attempts)s
""")

# A job its handler snoozed: delayed again, due delay_ms from now, the
# claim not counted as an attempt (as an unclaim), under the claim's fence;
# not once a cancel was requested.
SNOOZE: Final = Statement("""
UPDATE later_job SET stage = 'delayed', changed_ms = {greatest}({now}, changed_ms),
    run_at_ms = {now} + %(delay_ms)s, uncounted = COALESCE(uncounted, 0) + 1,
    lease_owner = NULL, lease_expires_ms = NULL,
    history = history || 'delayed@' || {greatest}({now}, changed_ms) || ';'
WHERE id = %(job_id)s AND cancel_requested_ms IS NULL
  AND lease_owner = %(owner)s AND attempts = %(attempts)s
""")

# A failure for good, kept retention_ms. It does not pass once a cancel was
# requested either: the job ends cancelled, as cancel() promises, even if
# its attempt failed. Under the worker's fence, or the rescuer's.
FAIL_OWNED: Final = Statement("""
UPDATE later_job SET stage = 'failed', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    last_error = %(error)s, history = history || 'failed@' || {greatest}({now}, changed_ms) || ';',
    lease_owner = NULL, lease_expires_ms = NULL
WHERE id = %(job_id)s AND cancel_requested_ms IS NULL
  AND lease_owner = %(owner)s AND attempts = %(attempts)s
""")
FAIL_EXPIRED: Final = Statement("""
UPDATE later_job SET stage = 'failed', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    last_error = %(error)s, history = history || 'failed@' || {greatest}({now}, changed_ms) || ';',
    lease_owner = NULL, lease_expires_ms = NULL
WHERE id = %(job_id)s AND cancel_requested_ms IS NULL
  AND lease_expires_ms < {now} - %(expired_for_ms)s AND attempts = %(attempts)s
""")

# The claims owner runs whose cancel was requested: a look at the few
# running jobs (the leased index), once a second while the server runs any.
CANCEL_REQUESTED: Final = Statement("""
SELECT id, attempts FROM later_job
WHERE namespace = %(namespace)s AND stage = 'running' AND lease_owner = %(owner)s
  AND cancel_requested_ms IS NOT NULL
""")

# A running job whose cancel was requested ends cancelled, kept
# retention_ms, under its claim's fence (the worker's own, or the rescuer's
# expired one).
CANCEL_RUNNING_OWNED: Final = Statement("""
UPDATE later_job SET stage = 'cancelled', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    history = history || 'cancelled@' || {greatest}({now}, changed_ms) || ';',
    lease_owner = NULL, lease_expires_ms = NULL
WHERE id = %(job_id)s AND cancel_requested_ms IS NOT NULL
  AND lease_owner = %(owner)s AND attempts = %(attempts)s
""")
CANCEL_RUNNING_EXPIRED: Final = Statement("""
UPDATE later_job SET stage = 'cancelled', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    history = history || 'cancelled@' || {greatest}({now}, changed_ms) || ';',
    lease_owner = NULL, lease_expires_ms = NULL
WHERE id = %(job_id)s AND cancel_requested_ms IS NOT NULL
  AND lease_expires_ms < {now} - %(expired_for_ms)s AND attempts = %(attempts)s
""")

# Whether a queue has a plain job ready to claim, the queue not paused (its
# row of later_queue looked at once): a read, taking no write lock.
# queue_column: the queue's value of later_job.queue; queue: its name.
READY_EXISTS: Final = Statement("""
SELECT 1 FROM later_job
WHERE namespace = %(namespace)s AND queue = %(queue_column)s AND stage = 'enqueued'
  AND topic IS NULL
  AND NOT EXISTS (
    SELECT 1 FROM later_queue q
    WHERE q.namespace = %(namespace)s AND q.name = %(queue)s AND q.paused)
LIMIT 1
""")

# Tracing only: the enqueuing span's context, read by the worker before the
# run.
TRACE_CONTEXT: Final = Statement("SELECT trace_context FROM later_job WHERE id = %(job_id)s")

# The end of a Django Tasks job's attempt, written in the transaction that
# stores its outcome (one row per job, the latest attempt's).
TASK_RESULT_WRITE: Final = Statement("""
INSERT INTO later_task_result (job_id, worker_ids, errors, return_value)
VALUES (%(job_id)s, %(worker_ids)s, %(errors)s, %(return_value)s)
ON CONFLICT (job_id) DO UPDATE SET
    worker_ids = excluded.worker_ids,
    errors = excluded.errors,
    return_value = excluded.return_value
""")
