"""SQL only PostgreSQL runs: its clock, the SKIP LOCKED claim, COPY, the batch
completion function, the statement-level counter triggers with NOTIFY, and
the counter folding. Shared statements are in the domain modules."""

from __future__ import annotations

from typing import Final

# The channel the counter triggers NOTIFY and the worker LISTENs on.
NOTIFY_CHANNEL: Final = "later"

# -- clock and locking fragments (see __init__.py) -----------------------------
# clock_timestamp(), not now(): the time of the write itself, not of the
# start of the transaction or of a statement that waited for a lock.
# date_part() is double precision: far cheaper than extract()'s numeric,
# and exact to the millisecond for any date a job can have.
NOW_SQL: Final = "(date_part('epoch', clock_timestamp()) * 1000)::bigint"
# statement_timestamp() is stable: the planner can search an index with it.
CUTOFF_SQL: Final = "(date_part('epoch', statement_timestamp()) * 1000)::bigint"
SKIP_LOCKED: Final = "FOR UPDATE SKIP LOCKED"
SHARE_LOCK: Final = "FOR SHARE OF p"

# -- jobs -----------------------------------------------------------------------
# The columns a COPY of ready jobs carries; the times and the history entry
# are the columns' defaults (migration 0002), the database's clock at the
# COPY's start.
COPY_COLUMNS: Final = "id, namespace, type_name, payload, stage, priority, attempts, retry_policy"
JOB_COPY_SQL: Final = f"COPY later_job ({COPY_COLUMNS}) FROM STDIN"

# The clock is read once for the whole claim (t): SKIP LOCKED never waits,
# so that is the time of the write, and one read instead of four per row.
# The LIMIT is written into the text (one prepared statement per claim size,
# at most the worker count): as a parameter, the server's generic plan
# assumes a large limit and hash-joins a scan of the whole table, so it plans
# a custom plan for every single claim instead.
JOB_CLAIM_SQL: Final = """
WITH picked AS (
    SELECT id FROM later_job
    WHERE namespace = %s AND stage = 'enqueued'
    ORDER BY priority DESC, id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
), t AS MATERIALIZED (SELECT {now} AS now)
UPDATE later_job j SET stage = 'running', attempts = j.attempts + 1,
    changed_ms = GREATEST(t.now, j.changed_ms), started_ms = GREATEST(t.now, j.changed_ms),
    lease_owner = %s, lease_expires_ms = t.now + %s,
    history = j.history || 'running@' || GREATEST(t.now, j.changed_ms) || ';'
FROM picked, t WHERE j.id = picked.id
RETURNING j.id, j.type_name, j.payload, j.attempts, j.retry_policy, j.created_ms,
    j.run_at_ms
"""

# Successes in bulk, then the release of their waiting continuations, in one
# function: one statement and one round trip for the worker (the batch
# travels as two arrays, so the call's text never changes and is prepared
# once). Each statement inside a plpgsql function takes a snapshot of its
# own, so the look for children, after the parents' update, sees every
# child committed until then, including one whose transaction was still open
# when the completion began; a single SQL statement would miss it. Most
# batches have no waiting child: the look is a read, and the UPDATE (and its
# statement-level counter trigger) runs only when one exists.
COMPLETE_MANY_FUNCTION_SQL: Final = """
CREATE OR REPLACE FUNCTION later_complete_many(
    p_ids text[], p_attempts int[], p_owner text, p_retention_ms bigint,
    OUT done_ids text[], OUT released bigint)
LANGUAGE plpgsql VOLATILE
-- The generic plans of these statements are the right ones (one index probe
-- per id), but their estimate of an array of unknown length is higher than a
-- custom plan's, so the server would plan them anew on every call.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    now_ms bigint := {now};
BEGIN
    WITH done AS (
        UPDATE later_job j SET stage = 'success',
            changed_ms = GREATEST(now_ms, j.changed_ms),
            finished_ms = GREATEST(now_ms, j.changed_ms),
            expires_ms = now_ms + p_retention_ms, lease_owner = NULL,
            lease_expires_ms = NULL,
            history = j.history || 'success@' || GREATEST(now_ms, j.changed_ms) || ';'
        FROM unnest(p_ids, p_attempts) AS v (id, attempts)
        WHERE j.id = v.id AND j.attempts = v.attempts AND j.lease_owner = p_owner
        RETURNING j.id
    )
    SELECT coalesce(array_agg(id), '{}') INTO done_ids FROM done;
    released := 0;
    IF cardinality(done_ids) > 0 AND EXISTS (
        SELECT 1 FROM later_job WHERE parent_id = ANY(done_ids) AND stage = 'waiting'
    ) THEN
        now_ms := {now};
        UPDATE later_job SET stage = 'enqueued',
            changed_ms = GREATEST(now_ms, changed_ms), run_at_ms = now_ms,
            history = history || 'enqueued@' || GREATEST(now_ms, changed_ms) || ';'
        WHERE parent_id = ANY(done_ids) AND stage = 'waiting';
        GET DIAGNOSTICS released = ROW_COUNT;
    END IF;
END $$;
"""

JOB_COMPLETE_MANY_SQL: Final = "SELECT done_ids, released FROM later_complete_many(%s, %s, %s, %s)"

# -- counters -------------------------------------------------------------------
# Statement-level triggers see every changed row at once through transition
# tables, so a batch of 500 inserts adds one counter row per stage, not 500.
# Counter rows are only ever inserted here (never updated), so concurrent
# writers never wait on each other; maintenance folds them together.
TRIGGER_FUNCTIONS_SQL: Final = f"""
CREATE OR REPLACE FUNCTION later_job_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text;
BEGIN
    INSERT INTO later_stage_count (namespace, stage, n)
        SELECT namespace, stage, count(*) FROM new_rows GROUP BY namespace, stage;
    FOR ns IN SELECT DISTINCT namespace FROM new_rows WHERE stage = 'enqueued' LOOP
        PERFORM pg_notify('{NOTIFY_CHANNEL}', ns);
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION later_job_after_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text;
BEGIN
    INSERT INTO later_stage_count (namespace, stage, n)
        SELECT namespace, stage, sum(d) FROM (
            SELECT o.namespace, o.stage, -1 AS d
                FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.stage <> n.stage
            UNION ALL
            SELECT n.namespace, n.stage, 1
                FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.stage <> n.stage
        ) changes GROUP BY namespace, stage;
    FOR ns IN SELECT DISTINCT n.namespace FROM old_rows o JOIN new_rows n ON n.id = o.id
            WHERE n.stage = 'enqueued' AND o.stage <> 'enqueued' LOOP
        PERFORM pg_notify('{NOTIFY_CHANNEL}', ns);
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION later_job_after_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO later_stage_count (namespace, stage, n)
        SELECT namespace, stage, -count(*) FROM old_rows GROUP BY namespace, stage;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION later_job_after_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM later_stage_count;
    RETURN NULL;
END $$;
"""

TRIGGERS: Final = {
    "later_job_after_insert": "AFTER INSERT ON later_job REFERENCING NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_insert()",
    "later_job_after_update": "AFTER UPDATE ON later_job REFERENCING OLD TABLE AS old_rows "
    "NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_update()",
    "later_job_after_delete": "AFTER DELETE ON later_job REFERENCING OLD TABLE AS old_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_delete()",
    "later_job_after_truncate": "AFTER TRUNCATE ON later_job "
    "FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_truncate()",
}

# One folder at a time per namespace; the others skip this round.
COUNTER_COMPACT_LOCK_SQL: Final = "SELECT pg_try_advisory_xact_lock(%s)"
COUNTER_ROWS_SQL: Final = "SELECT count(*) FROM later_stage_count WHERE namespace = %s"
COUNTER_COMPACT_SQL: Final = """
WITH folded AS (
    DELETE FROM later_stage_count WHERE namespace = %s RETURNING stage, n
)
INSERT INTO later_stage_count (namespace, stage, n)
SELECT %s, stage, SUM(n) FROM folded GROUP BY stage
"""

# -- schema ---------------------------------------------------------------------
CREATE_TRIGGER_SQL: Final = "CREATE OR REPLACE TRIGGER {name} {body}"

INSTALLED_OBJECTS_SQL: Final = (
    "SELECT tgname FROM pg_trigger WHERE tgrelid = 'later_job'::regclass "
    "AND NOT tgisinternal "
    "UNION ALL SELECT proname FROM pg_proc WHERE proname = 'later_complete_many'"
)

# to_regclass follows the search_path, as the unqualified names of every
# other statement do; NULL is a table it cannot find.
MISSING_TABLES_SQL: Final = """
SELECT t.name FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, n)
WHERE to_regclass(t.name) IS NULL ORDER BY t.n
"""
