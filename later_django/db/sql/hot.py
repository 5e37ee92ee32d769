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

# -- claims ---------------------------------------------------------------------------
# Each returns the claimed jobs' columns in ClaimedJob's order
# (db/rows/jobs.py claimed_jobs). A claim takes the queue's ready plain jobs
# in claim order (priority, then id) and makes them running, leased to its
# owner for lease_ms; nothing while the queue is paused (its row of
# later_queue looked at once). queue_column: the queue's value of
# later_job.queue; queue: its name.

# PostgreSQL: the picked rows are locked, skipping those another claim
# holds; the clock is read once for the whole claim (t): SKIP LOCKED never
# waits, so that is the time of the write, and one read instead of four per
# row. The LIMIT is written into the text (one prepared statement per claim
# size, at most the worker count): as a parameter, the server's generic plan
# assumes a large limit and hash-joins a scan of the whole table, so it
# plans a custom plan for every single claim instead.
CLAIM_PG: Final = Statement(
    """
WITH picked AS MATERIALIZED (
    SELECT id FROM later_job
    WHERE namespace = %(namespace)s AND queue = %(queue_column)s AND stage = 'enqueued'
      AND topic IS NULL
      AND NOT EXISTS (
        SELECT 1 FROM later_queue q
        WHERE q.namespace = %(namespace)s AND q.name = %(queue)s AND q.paused)
    ORDER BY priority DESC, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), t AS MATERIALIZED (SELECT {now} AS now)
UPDATE later_job j SET stage = 'running', attempts = j.attempts + 1,
    changed_ms = GREATEST(t.now, j.changed_ms), started_ms = GREATEST(t.now, j.changed_ms),
    lease_owner = %(owner)s, lease_expires_ms = t.now + %(lease_ms)s,
    history = j.history || 'running@' || GREATEST(t.now, j.changed_ms) || ';'
FROM picked, t WHERE j.id = picked.id
RETURNING j.id, j.type_name, j.payload, j.attempts, j.retry_policy, j.created_ms, j.run_at_ms,
    j.uncounted, j.timeout_ms
""",
    inline=("limit",),
)
# SQLite: one writer at a time, so the pick needs no lock.
CLAIM_SQLITE: Final = Statement("""
UPDATE later_job SET stage = 'running', attempts = attempts + 1,
    changed_ms = {greatest}({now}, changed_ms), started_ms = {greatest}({now}, changed_ms),
    lease_owner = %(owner)s, lease_expires_ms = {now} + %(lease_ms)s,
    history = history || 'running@' || {greatest}({now}, changed_ms) || ';'
WHERE id IN (
    SELECT id FROM later_job
    WHERE namespace = %(namespace)s AND queue = %(queue_column)s AND stage = 'enqueued'
      AND topic IS NULL
      AND NOT EXISTS (
        SELECT 1 FROM later_queue q
        WHERE q.namespace = %(namespace)s AND q.name = %(queue)s AND q.paused)
    ORDER BY priority DESC, id
    LIMIT %(limit)s)
RETURNING id, type_name, payload, attempts, retry_policy, created_ms, run_at_ms, uncounted,
    timeout_ms
""")

# The claim of a queue some of whose types have a concurrency key
# (docs/how-to/concurrency-limits.md): the queue's ready jobs in claim order
# whose key is below its limit (scan of them at most, read past the jobs of
# keys at their limit), then of each key no more than its free slots, and
# limit in all. The busy keys (the namespace's running keyed jobs by key,
# through the partial index later_job_keyed_running: a key is shared by
# every job of the namespace that has it) are read once (MATERIALIZED), and
# so are the candidates, before their keys are ranked. PostgreSQL locks the
# candidates as the plain claim locks its jobs; the caller serialises it
# with the namespace's other keyed claims (CLAIM_KEYED_LOCK_PG), so the
# count of running jobs per key it reads cannot miss a claim made meanwhile.
CLAIM_KEYED_PG: Final = Statement(
    """
WITH picked AS MATERIALIZED (
    WITH busy AS MATERIALIZED (
        SELECT concurrency_key AS k, COUNT(*) AS n FROM later_job
        WHERE namespace = %(namespace)s AND stage = 'running' AND concurrency_key IS NOT NULL
        GROUP BY concurrency_key),
    candidates AS MATERIALIZED (
        SELECT j.id, j.priority, j.concurrency_key, j.concurrency_limit FROM later_job j
        WHERE namespace = %(namespace)s AND queue = %(queue_column)s AND stage = 'enqueued'
          AND topic IS NULL
          AND NOT EXISTS (
            SELECT 1 FROM later_queue q
            WHERE q.namespace = %(namespace)s AND q.name = %(queue)s AND q.paused)
          AND NOT EXISTS (
            SELECT 1 FROM busy b WHERE b.k = j.concurrency_key AND b.n >= j.concurrency_limit)
        ORDER BY j.priority DESC, j.id
        LIMIT %(scan)s
        FOR UPDATE OF j SKIP LOCKED
    ),
    ranked AS (
        SELECT c.id, c.priority, c.concurrency_key, c.concurrency_limit,
            ROW_NUMBER() OVER (PARTITION BY c.concurrency_key ORDER BY c.priority DESC, c.id)
                AS nth
        FROM candidates c
    )
    SELECT r.id FROM ranked r LEFT JOIN busy b ON b.k = r.concurrency_key
    WHERE r.concurrency_key IS NULL OR COALESCE(b.n, 0) + r.nth <= r.concurrency_limit
    ORDER BY r.priority DESC, r.id
    LIMIT %(limit)s
), t AS MATERIALIZED (SELECT {now} AS now)
UPDATE later_job j SET stage = 'running', attempts = j.attempts + 1,
    changed_ms = GREATEST(t.now, j.changed_ms), started_ms = GREATEST(t.now, j.changed_ms),
    lease_owner = %(owner)s, lease_expires_ms = t.now + %(lease_ms)s,
    history = j.history || 'running@' || GREATEST(t.now, j.changed_ms) || ';'
FROM picked, t WHERE j.id = picked.id
RETURNING j.id, j.type_name, j.payload, j.attempts, j.retry_policy, j.created_ms, j.run_at_ms,
    j.uncounted, j.timeout_ms
""",
    inline=("limit", "scan"),
)
CLAIM_KEYED_SQLITE: Final = Statement(
    """
UPDATE later_job SET stage = 'running', attempts = attempts + 1,
    changed_ms = {greatest}({now}, changed_ms), started_ms = {greatest}({now}, changed_ms),
    lease_owner = %(owner)s, lease_expires_ms = {now} + %(lease_ms)s,
    history = history || 'running@' || {greatest}({now}, changed_ms) || ';'
WHERE id IN (
    WITH busy AS MATERIALIZED (
        SELECT concurrency_key AS k, COUNT(*) AS n FROM later_job
        WHERE namespace = %(namespace)s AND stage = 'running' AND concurrency_key IS NOT NULL
        GROUP BY concurrency_key),
    candidates AS MATERIALIZED (
        SELECT j.id, j.priority, j.concurrency_key, j.concurrency_limit FROM later_job j
        WHERE namespace = %(namespace)s AND queue = %(queue_column)s AND stage = 'enqueued'
          AND topic IS NULL
          AND NOT EXISTS (
            SELECT 1 FROM later_queue q
            WHERE q.namespace = %(namespace)s AND q.name = %(queue)s AND q.paused)
          AND NOT EXISTS (
            SELECT 1 FROM busy b WHERE b.k = j.concurrency_key AND b.n >= j.concurrency_limit)
        ORDER BY j.priority DESC, j.id
        LIMIT %(scan)s
    ),
    ranked AS (
        SELECT c.id, c.priority, c.concurrency_key, c.concurrency_limit,
            ROW_NUMBER() OVER (PARTITION BY c.concurrency_key ORDER BY c.priority DESC, c.id)
                AS nth
        FROM candidates c
    )
    SELECT r.id FROM ranked r LEFT JOIN busy b ON b.k = r.concurrency_key
    WHERE r.concurrency_key IS NULL OR COALESCE(b.n, 0) + r.nth <= r.concurrency_limit
    ORDER BY r.priority DESC, r.id
    LIMIT %(limit)s)
RETURNING id, type_name, payload, attempts, retry_policy, created_ms, run_at_ms, uncounted,
    timeout_ms
""",
    inline=("limit", "scan"),
)

# Taken in a statement of its own before a keyed claim, to the end of its
# transaction: the claim's statement then starts after every keyed claim
# before it committed, and its snapshot sees their jobs running.
CLAIM_KEYED_LOCK_PG: Final = Statement("SELECT pg_advisory_xact_lock(%(key)s)")

# -- completions ----------------------------------------------------------------------
# PostgreSQL: successes in bulk, then the release of their waiting
# continuations, in one function: one statement and one round trip for the
# worker (the batch travels as two arrays, so the call's text never changes
# and is prepared once). Each statement inside a plpgsql function takes a
# snapshot of its own, so the look for children, after the parents' update,
# sees every child committed until then, including one whose transaction
# was still open when the completion began; a single SQL statement would
# miss it. Most batches have no waiting child: the look is a read, and the
# UPDATE (and its statement-level counter trigger) runs only when one
# exists. The function's text is frozen in the objects migration
# (later_django.objects).
COMPLETE_MANY_PG: Final = Statement(
    "SELECT done_ids, released FROM later_complete_many("
    "%(job_ids)s, %(attempts)s, %(owner)s, %(retention_ms)s)"
)

# A batch holding the successes of Django Tasks jobs: their results are
# written by the same statement, for the ids whose fence held, so a result
# exists exactly when its success does and costs no round trip of its own.
# The function runs once (a CTE with a volatile call is materialized); the
# results come as four arrays, one element per task job of the batch.
COMPLETE_MANY_WITH_RESULTS_PG: Final = Statement("""
WITH c AS (
    SELECT done_ids, released
    FROM later_complete_many(%(job_ids)s, %(attempts)s, %(owner)s, %(retention_ms)s)),
written AS (
    INSERT INTO later_task_result (job_id, worker_ids, errors, return_value)
    SELECT r.job_id, r.worker_ids, r.errors, r.return_value
    FROM unnest(%(result_job_ids)s::text[], %(worker_ids)s::text[], %(errors)s::text[],
        %(return_values)s::text[])
        AS r(job_id, worker_ids, errors, return_value), c
    WHERE r.job_id = ANY (c.done_ids)
    ON CONFLICT (job_id) DO UPDATE SET
        worker_ids = excluded.worker_ids,
        errors = excluded.errors,
        return_value = excluded.return_value
)
SELECT done_ids, released FROM c
""")

# SQLite: the claims listed that owner still holds, succeeded and kept
# retention_ms; their ids.
COMPLETE_MANY_SQLITE: Final = Statement(
    """
UPDATE later_job SET stage = 'success', changed_ms = {greatest}({now}, changed_ms),
    finished_ms = {greatest}({now}, changed_ms), expires_ms = {now} + %(retention_ms)s,
    history = history || 'success@' || {greatest}({now}, changed_ms) || ';',
    lease_owner = NULL, lease_expires_ms = NULL
WHERE id IN (%(job_ids)s) AND (id, attempts) IN (VALUES %(claims)s) AND lease_owner = %(owner)s
RETURNING id
""",
    lists=("job_ids", "claims"),
)

# Waiting continuations of parents that succeeded, and whether each is a
# fan-in child (sql/enqueue.py), which waits for all its parents. A
# statement of its own, after the parents' completion: it sees every child
# committed before it runs. Most batches have no waiting child: this read
# is all they pay.
WAITING_CHILDREN_OF_SQLITE: Final = Statement(
    """
SELECT id, EXISTS (SELECT 1 FROM later_fan_in f WHERE f.child_id = later_job.id)
FROM later_job WHERE parent_id IN (%(parent_ids)s) AND stage = 'waiting'
""",
    lists=("parent_ids",),
)

# Continuations of one parent that succeeded: due now.
RELEASE_SQLITE: Final = Statement(
    """
UPDATE later_job SET stage = 'enqueued', changed_ms = {greatest}({now}, changed_ms),
    history = history || 'enqueued@' || {greatest}({now}, changed_ms) || ';', run_at_ms = {now}
WHERE id IN (%(job_ids)s) AND stage = 'waiting'
""",
    lists=("job_ids",),
)
