"""The database objects, version 6: partition notifications name their partition.

A partition job that becomes ready (inserted, promoted, retried) and a
partition head that finishes are announced on ``later_partition`` with a
payload naming the partition: the namespace, chr(31), the topic, chr(30)
and the partition number. A server that wins that partition queues it for
its next claim; the others ignore it, so a finished head no longer makes
every server look over every partition.

Version 6 also sends version 5's payload (the bare namespace) for servers
of the previous release, which look over every partition on it. A later
release stops sending it, once no server of a release before this one can
run (docs/how-to/upgrading.md). Everything else is version 5's (0017).

Frozen: the objects' text is what version 6 installs, whatever later code
says; a new version is a new migration holding the whole new text.
"""

import importlib

from django.db import migrations


def install_version_5(apps, schema_editor):
    """Back to 0017: the objects of version 5, whose notices name no partition."""
    connection = schema_editor.connection
    version_5 = importlib.import_module("later_django.migrations.0017_fan_in")
    with connection.cursor() as cursor:
        version_5.install(cursor, connection.vendor)


# PostgreSQL: version 5's objects, the insert and update triggers also
# naming each partition they announce.
POSTGRESQL = (
    """
CREATE OR REPLACE FUNCTION later_job_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text; plain boolean; q text; ready bigint; said text; t text; p int;
BEGIN
    INSERT INTO later_stage_count (namespace, stage, lane, n)
        SELECT namespace, stage, CASE WHEN topic IS NOT NULL THEN 'partition' WHEN queue = '' THEN '' ELSE 'q:' || queue END, count(*) FROM new_rows
        GROUP BY namespace, stage, CASE WHEN topic IS NOT NULL THEN 'partition' WHEN queue = '' THEN '' ELSE 'q:' || queue END;
    FOR ns, plain, q, ready IN SELECT namespace, topic IS NULL, queue, count(*) FROM new_rows
            WHERE stage = 'enqueued' GROUP BY namespace, topic IS NULL, queue LOOP
        IF plain THEN
            said := CASE WHEN q = '' THEN ns ELSE ns || chr(30) || q END;
            PERFORM pg_notify('later', CASE WHEN ready = 1 THEN said ELSE said || chr(31) || ready END);
        ELSE
            PERFORM pg_notify('later_partition', ns);
        END IF;
    END LOOP;
    FOR ns, t, p IN SELECT DISTINCT namespace, topic, partition FROM new_rows
            WHERE stage = 'enqueued' AND topic IS NOT NULL LOOP
        PERFORM pg_notify('later_partition', ns || chr(31) || t || chr(30) || p);
    END LOOP;
    RETURN NULL;
END $$;
""",
    """
CREATE OR REPLACE FUNCTION later_job_after_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text; plain boolean; q text; ready bigint; said text; t text; p int;
BEGIN
    INSERT INTO later_stage_count (namespace, stage, lane, n)
        SELECT namespace, stage, lane, sum(d) FROM (
            SELECT o.namespace, o.stage, CASE WHEN o.topic IS NOT NULL THEN 'partition' WHEN o.queue = '' THEN '' ELSE 'q:' || o.queue END
                    AS lane, -1 AS d
                FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.stage <> n.stage
            UNION ALL
            SELECT n.namespace, n.stage, CASE WHEN n.topic IS NOT NULL THEN 'partition' WHEN n.queue = '' THEN '' ELSE 'q:' || n.queue END, 1
                FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.stage <> n.stage
        ) changes GROUP BY namespace, stage, lane;
    FOR ns, plain, q, ready IN SELECT r.namespace, r.topic IS NULL, r.queue, count(*)
            FROM old_rows o JOIN new_rows r ON r.id = o.id
            WHERE o.stage <> r.stage AND (r.stage = 'enqueued' OR (r.topic IS NOT NULL
                AND r.stage IN ('success', 'failed', 'cancelled')))
            GROUP BY r.namespace, r.topic IS NULL, r.queue LOOP
        IF plain THEN
            said := CASE WHEN q = '' THEN ns ELSE ns || chr(30) || q END;
            PERFORM pg_notify('later', CASE WHEN ready = 1 THEN said ELSE said || chr(31) || ready END);
        ELSE
            PERFORM pg_notify('later_partition', ns);
        END IF;
    END LOOP;
    FOR ns, t, p IN SELECT DISTINCT r.namespace, r.topic, r.partition
            FROM old_rows o JOIN new_rows r ON r.id = o.id
            WHERE o.stage <> r.stage AND r.topic IS NOT NULL
                AND r.stage IN ('enqueued', 'success', 'failed', 'cancelled') LOOP
        PERFORM pg_notify('later_partition', ns || chr(31) || t || chr(30) || p);
    END LOOP;
    RETURN NULL;
END $$;
""",
    """
CREATE OR REPLACE FUNCTION later_job_after_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO later_stage_count (namespace, stage, lane, n)
        SELECT namespace, stage, CASE WHEN topic IS NOT NULL THEN 'partition' WHEN queue = '' THEN '' ELSE 'q:' || queue END, -count(*) FROM old_rows
        GROUP BY namespace, stage, CASE WHEN topic IS NOT NULL THEN 'partition' WHEN queue = '' THEN '' ELSE 'q:' || queue END;
    RETURN NULL;
END $$;
""",
    """
CREATE OR REPLACE FUNCTION later_job_after_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM later_stage_count;
    RETURN NULL;
END $$;
""",
    """
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
    now_ms bigint := (date_part('epoch', clock_timestamp()) * 1000)::bigint;
    fan_in text[];
    lost text[];
    freed bigint;
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
        now_ms := (date_part('epoch', clock_timestamp()) * 1000)::bigint;
        -- Continuations of one parent. A fan-in child (it has rows in
        -- later_fan_in) waits for all its parents: it is resolved below.
        UPDATE later_job j SET stage = 'enqueued',
            changed_ms = GREATEST(now_ms, j.changed_ms), run_at_ms = now_ms,
            history = j.history || 'enqueued@' || GREATEST(now_ms, j.changed_ms) || ';'
        WHERE j.parent_id = ANY(done_ids) AND j.stage = 'waiting'
          AND NOT EXISTS (SELECT 1 FROM later_fan_in f WHERE f.child_id = j.id);
        GET DIAGNOSTICS released = ROW_COUNT;
        -- Fan-in children waiting on a parent just done. One another
        -- transaction holds is left to it, or to the orphan sweep: the
        -- completion never waits.
        SELECT array_agg(c.id) INTO fan_in FROM (
            SELECT j.id FROM later_job j
            WHERE j.parent_id = ANY(done_ids) AND j.stage = 'waiting'
              AND EXISTS (SELECT 1 FROM later_fan_in f WHERE f.child_id = j.id)
            ORDER BY j.id FOR UPDATE OF j SKIP LOCKED
        ) c;
        IF fan_in IS NOT NULL THEN
            -- A parent failed or was cancelled: the child fails, and its
            -- waiting descendants by either link.
            WITH failed AS (
                UPDATE later_job j SET stage = 'failed',
                    changed_ms = GREATEST(now_ms, j.changed_ms),
                    finished_ms = GREATEST(now_ms, j.changed_ms),
                    expires_ms = now_ms + p_retention_ms, last_error = 'parent failed',
                    history = j.history || 'failed@' || GREATEST(now_ms, j.changed_ms) || ';'
                WHERE j.id = ANY(fan_in) AND j.stage = 'waiting' AND EXISTS (
                    SELECT 1 FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
                    WHERE f.child_id = j.id AND p.stage IN ('failed', 'cancelled'))
                RETURNING j.id
            )
            SELECT array_agg(id) INTO lost FROM failed;
            IF lost IS NOT NULL THEN
                WITH RECURSIVE d(id) AS (
                    SELECT unnest(lost)
                    UNION
                    SELECT n.id FROM d CROSS JOIN LATERAL (
                        SELECT c.id::text AS id FROM later_job c
                        WHERE c.parent_id = d.id AND c.stage = 'waiting'
                        UNION ALL
                        SELECT c.id::text FROM later_fan_in f JOIN later_job c ON c.id = f.child_id
                        WHERE f.parent_id = d.id AND c.stage = 'waiting'
                    ) n
                )
                UPDATE later_job j SET stage = 'failed',
                    changed_ms = GREATEST(now_ms, j.changed_ms),
                    finished_ms = GREATEST(now_ms, j.changed_ms),
                    expires_ms = now_ms + p_retention_ms, last_error = 'parent failed',
                    history = j.history || 'failed@' || GREATEST(now_ms, j.changed_ms) || ';'
                WHERE j.id IN (SELECT id FROM d) AND j.stage = 'waiting';
            END IF;
            -- Every parent succeeded (a parent gone was pruned after it
            -- did): due now.
            UPDATE later_job j SET stage = 'enqueued',
                changed_ms = GREATEST(now_ms, j.changed_ms), run_at_ms = now_ms,
                history = j.history || 'enqueued@' || GREATEST(now_ms, j.changed_ms) || ';'
            WHERE j.id = ANY(fan_in) AND j.stage = 'waiting' AND NOT EXISTS (
                SELECT 1 FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
                WHERE f.child_id = j.id AND p.stage <> 'success');
            GET DIAGNOSTICS freed = ROW_COUNT;
            released := released + freed;
            -- A parent has not finished: the child waits on one, not
            -- running if it can (one running may be finishing now, unseen),
            -- due last, newest. Its finish resolves the child; one that
            -- committed unseen meanwhile leaves it to the orphan sweep.
            UPDATE later_job j SET parent_id = w.parent_id
            FROM (
                SELECT DISTINCT ON (f.child_id) f.child_id, p.id AS parent_id
                FROM later_fan_in f JOIN later_job p ON p.id = f.parent_id
                WHERE f.child_id = ANY(fan_in)
                  AND p.stage NOT IN ('success', 'failed', 'cancelled')
                ORDER BY f.child_id, p.stage = 'running', p.run_at_ms DESC, p.id DESC
            ) w
            WHERE j.id = w.child_id AND j.stage = 'waiting';
        END IF;
    END IF;
END $$;
""",
    """
CREATE OR REPLACE TRIGGER later_job_after_insert AFTER INSERT ON later_job REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_insert()
""",
    """
CREATE OR REPLACE TRIGGER later_job_after_update AFTER UPDATE ON later_job REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_update()
""",
    """
CREATE OR REPLACE TRIGGER later_job_after_delete AFTER DELETE ON later_job REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_delete()
""",
    """
CREATE OR REPLACE TRIGGER later_job_after_truncate AFTER TRUNCATE ON later_job FOR EACH STATEMENT EXECUTE FUNCTION later_job_after_truncate()
""",
)

# SQLite: row-level triggers upserting one row per stage (a single writer, so
# the row is never contended). It has no CREATE OR REPLACE TRIGGER: each is
# dropped and made again.
SQLITE = (
    """
DROP INDEX IF EXISTS later_count_one_row
""",
    """
CREATE UNIQUE INDEX later_count_one_row ON later_stage_count (namespace, stage, lane)
""",
    """
DROP TRIGGER IF EXISTS later_job_count_insert
""",
    """
CREATE TRIGGER later_job_count_insert AFTER INSERT ON later_job
BEGIN
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    VALUES (NEW.namespace, NEW.stage, CASE WHEN NEW.topic IS NOT NULL THEN 'partition' WHEN NEW.queue = '' THEN '' ELSE 'q:' || NEW.queue END, 1)
    ON CONFLICT (namespace, stage, lane) DO UPDATE SET n = n + 1;
END
""",
    """
DROP TRIGGER IF EXISTS later_job_count_update
""",
    """
CREATE TRIGGER later_job_count_update
AFTER UPDATE OF stage ON later_job WHEN OLD.stage <> NEW.stage
BEGIN
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    VALUES (OLD.namespace, OLD.stage, CASE WHEN OLD.topic IS NOT NULL THEN 'partition' WHEN OLD.queue = '' THEN '' ELSE 'q:' || OLD.queue END, -1)
    ON CONFLICT (namespace, stage, lane) DO UPDATE SET n = n - 1;
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    VALUES (NEW.namespace, NEW.stage, CASE WHEN NEW.topic IS NOT NULL THEN 'partition' WHEN NEW.queue = '' THEN '' ELSE 'q:' || NEW.queue END, 1)
    ON CONFLICT (namespace, stage, lane) DO UPDATE SET n = n + 1;
END
""",
    """
DROP TRIGGER IF EXISTS later_job_count_delete
""",
    """
CREATE TRIGGER later_job_count_delete AFTER DELETE ON later_job
BEGIN
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    VALUES (OLD.namespace, OLD.stage, CASE WHEN OLD.topic IS NOT NULL THEN 'partition' WHEN OLD.queue = '' THEN '' ELSE 'q:' || OLD.queue END, -1)
    ON CONFLICT (namespace, stage, lane) DO UPDATE SET n = n - 1;
END
""",
)

OBJECTS = {"postgresql": POSTGRESQL, "sqlite": SQLITE}
NAMES = {
    "postgresql": frozenset(
        {
            "later_job_after_insert",
            "later_job_after_update",
            "later_job_after_delete",
            "later_job_after_truncate",
            "later_complete_many",
        }
    ),
    "sqlite": frozenset(
        {"later_job_count_insert", "later_job_count_update", "later_job_count_delete"}
    ),
}


def install(cursor, vendor):
    """Create or replace every object of this version; idempotent."""
    for statement in OBJECTS[vendor]:
        cursor.execute(statement)


def install_objects(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor in OBJECTS:
        with connection.cursor() as cursor:
            install(cursor, connection.vendor)


class Migration(migrations.Migration):
    dependencies = [("later_django", "0017_fan_in")]

    operations = [
        migrations.RunPython(install_objects, install_version_5, elidable=False),
    ]
