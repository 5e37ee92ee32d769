"""SQL only PostgreSQL runs: its clock, the SKIP LOCKED claim, COPY, the batch
completion function, the statement-level counter triggers with NOTIFY, and
the counter folding. Shared statements are in the domain modules."""

from __future__ import annotations

from typing import Final

from later_django.db.sql import compose
from later_django.db.sql.jobs import (
    CLAIM_RETURNING,
    IN_QUEUE,
    QUEUE_RUNS,
)
from later_django.db.sql.limits import KEYED_PICK

# The channel the counter triggers NOTIFY and the worker LISTENs on.
NOTIFY_CHANNEL: Final = "later"
# Partition jobs that became ready: partition pollers listen here, plain
# workers never hear of them.
PARTITION_CHANNEL: Final = "later_partition"


# -- clock and locking fragments (see __init__.py) -----------------------------
# statement_timestamp(): one time for the whole statement, so every column a
# write stamps agrees (clock_timestamp() is read anew per column and row), and
# stable, so the planner can search an index with it. A statement that waited
# for a row lock is still stamped after the write it waited for: a stage
# change is GREATEST(now, changed_ms). date_part() is double precision: far
# cheaper than extract()'s numeric, and exact to the millisecond for any date
# a job can have.
NOW_SQL: Final = "(date_part('epoch', statement_timestamp()) * 1000)::bigint"
SKIP_LOCKED: Final = "FOR UPDATE SKIP LOCKED"
SHARE_LOCK: Final = "FOR SHARE OF p"

# -- jobs -----------------------------------------------------------------------
# The columns a COPY of ready jobs carries; the times and the history entry
# are the columns' defaults (migration 0002), the database's clock at the
# COPY's start.
COPY_COLUMNS: Final = "id, namespace, type_name, payload, stage, priority, attempts, retry_policy"
JOB_COPY_SQL: Final = compose("COPY later_job ({columns}) FROM STDIN", columns=COPY_COLUMNS)
# The same, of a batch in which some job names a queue.
JOB_COPY_QUEUED_SQL: Final = compose(
    "COPY later_job ({columns}, queue) FROM STDIN", columns=COPY_COLUMNS
)

# The claim of one queue's jobs (IN_QUEUE), nothing while it is paused.
# The clock is read once for the whole claim (t): SKIP LOCKED never waits,
# so that is the time of the write, and one read instead of four per row.
# The LIMIT is written into the text (one prepared statement per claim size,
# at most the worker count): as a parameter, the server's generic plan
# assumes a large limit and hash-joins a scan of the whole table, so it plans
# a custom plan for every single claim instead.
# What a claim does to the jobs it picked (the CTE ``picked`` before it):
# running, leased to its owner.
_RUN_PICKED: Final = compose(
    """t AS MATERIALIZED (SELECT {now} AS now)
UPDATE later_job j SET stage = 'running', attempts = j.attempts + 1,
    changed_ms = GREATEST(t.now, j.changed_ms), started_ms = GREATEST(t.now, j.changed_ms),
    lease_owner = %s, lease_expires_ms = t.now + %s,
    history = j.history || 'running@' || GREATEST(t.now, j.changed_ms) || ';'
FROM picked, t WHERE j.id = picked.id
RETURNING {returning}""",
    returning=", ".join("j." + column for column in CLAIM_RETURNING.split(", ")),
)
_JOB_CLAIM: Final = compose(
    """
WITH picked AS MATERIALIZED (
    SELECT id FROM later_job
    WHERE namespace = %s AND {in_queue} AND stage = 'enqueued' AND topic IS NULL
      AND {queue_runs}
    ORDER BY priority DESC, id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
), {run_picked}""",
    run_picked=_RUN_PICKED,
    queue_runs=QUEUE_RUNS,
)
JOB_CLAIM_SQL: Final = compose(_JOB_CLAIM, in_queue=IN_QUEUE)

# The claim of a queue some of whose types have a concurrency key
# (docs/how-to/concurrency-limits.md): limits.KEYED_PICK's jobs, the candidates
# locked as the plain claim locks its jobs. The caller serialises it with
# the namespace's other keyed claims (CLAIM_KEYED_LOCK_SQL), so the count of
# running jobs per key it reads cannot miss a claim made meanwhile.
JOB_CLAIM_KEYED_SQL: Final = compose(
    compose("\nWITH picked AS MATERIALIZED ({pick}), {run_picked}", pick=KEYED_PICK),
    lock_candidates="FOR UPDATE OF j SKIP LOCKED",
    run_picked=_RUN_PICKED,
)
# Taken in a statement of its own before a keyed claim, to the end of its
# transaction: the claim's statement then starts after every keyed claim
# before it committed, and its snapshot sees their jobs running.
CLAIM_KEYED_LOCK_SQL: Final = "SELECT pg_advisory_xact_lock(%s)"

# Successes in bulk, then the release of their waiting continuations, in one
# function: one statement and one round trip for the worker (the batch
# travels as two arrays, so the call's text never changes and is prepared
# once). Each statement inside a plpgsql function takes a snapshot of its
# own, so the look for children, after the parents' update, sees every
# child committed until then, including one whose transaction was still open
# when the completion began; a single SQL statement would miss it. Most
# batches have no waiting child: the look is a read, and the UPDATE (and its
# statement-level counter trigger) runs only when one exists.
# The function's text is frozen in the objects migration (later_django.objects).
JOB_COMPLETE_MANY_SQL: Final = "SELECT done_ids, released FROM later_complete_many(%s, %s, %s, %s)"

# A batch holding the successes of Django Tasks jobs: their results are
# written by the same statement, for the ids whose fence held, so a result
# exists exactly when its success does and costs no round trip of its own.
# The function runs once (a CTE with a volatile call is materialized); the
# results come as four arrays, one element per task job of the batch.
JOB_COMPLETE_MANY_WITH_RESULTS_SQL: Final = """
WITH c AS (SELECT done_ids, released FROM later_complete_many(%s, %s, %s, %s)),
written AS (
    INSERT INTO later_task_result (job_id, worker_ids, errors, return_value)
    SELECT r.job_id, r.worker_ids, r.errors, r.return_value
    FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[])
        AS r(job_id, worker_ids, errors, return_value), c
    WHERE r.job_id = ANY (c.done_ids)
    ON CONFLICT (job_id) DO UPDATE SET
        worker_ids = excluded.worker_ids,
        errors = excluded.errors,
        return_value = excluded.return_value
)
SELECT done_ids, released FROM c
"""
