"""Named queues (docs/queues.md).

- ``later_job`` gains ``queue``, NOT NULL with the database default ''
  (the empty string: the default queue, in the narrowest key the ready
  index and each row can hold): a plain job's insert never names it, and a
  server of the previous release still enqueues plain jobs while this
  migrates. Both databases add it without rewriting the table (PostgreSQL
  stores the default in the catalog; SQLite adds the column in place, which
  Django would not do for a NOT NULL column, hence the statement of its
  own). Not NULL for the default queue: a claim says ``queue = %s``, an
  equality, and reads the queue's run of the ready index in order; under
  ``queue IS NULL`` PostgreSQL would sort every ready job of the queue.
- ``later_queue`` holds a queue's pause, shared by every server; every
  claim of a queue reads it.
- ``later_server`` gains ``queues`` (the queues a server serves; NULL for a
  server of the previous release).
- The ready index gains ``queue`` after the namespace: each queue's ready
  jobs are a run of their own in claim order. On PostgreSQL it is built
  CONCURRENTLY beside the old one, which is then dropped and the new one
  renamed, so enqueues and claims never wait on the build (the migration is
  not atomic for that reason; every step can be run again). A server of the
  previous release, whose claim does not name the queue, still reads only
  ready jobs through it, sorting them.
- ``later_stage_count.lane`` is widened: a named queue's jobs are counted in
  lane 'q:<name>' (the default queue's stay in '').
- The database objects, version 4: as version 3 (0010), but counted in
  their queue's lane, and a NOTIFY on 'later' names a named queue's jobs'
  queue: namespace, chr(30), queue (then chr(31) and the count when more
  than one). A server of the previous release takes such a payload for
  another namespace's and stays asleep; its poll finds the jobs.

Frozen: the objects' text is what version 4 installs, whatever later code
says; a new version is a new migration holding the whole new text.
"""

import importlib

from django.db import migrations, models
from django.db.models import Q

READY = "later_job_ready"
READY_BUILDING = "later_job_ready_building"
READY_WHERE = "WHERE stage = 'enqueued' AND topic IS NULL"
READY_COLUMNS = {
    "forwards": "(namespace, queue, priority DESC, id)",
    "backwards": "(namespace, priority DESC, id)",
}


def rebuild_ready_index(direction):
    def rebuild(apps, schema_editor):
        connection = schema_editor.connection
        columns = READY_COLUMNS[direction]
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                # Not in a transaction (the migration is not atomic): writes
                # go on while each index is built or dropped. A build that
                # failed half-way left an invalid index: dropped first.
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {READY_BUILDING}")
                cursor.execute(
                    f"CREATE INDEX CONCURRENTLY {READY_BUILDING} ON later_job {columns} "
                    f"{READY_WHERE}"
                )
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {READY}")
                cursor.execute(f"ALTER INDEX {READY_BUILDING} RENAME TO {READY}")
            else:
                cursor.execute(f"DROP INDEX IF EXISTS {READY}")
                cursor.execute(f"CREATE INDEX {READY} ON later_job {columns} {READY_WHERE}")

    return rebuild


def widen_lane(apps, schema_editor):
    # A longer varchar is a change of the catalog alone on PostgreSQL; SQLite
    # does not enforce a length.
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("ALTER TABLE later_stage_count ALTER COLUMN lane TYPE varchar(80)")


def narrow_lane(apps, schema_editor):
    """Back to 0013: every job is the default queue's, so are its counts."""
    connection = schema_editor.connection
    merge = "INSERT INTO later_stage_count (namespace, stage, lane, n) " + (
        "SELECT namespace, stage, '', SUM(n) FROM later_stage_count WHERE lane LIKE 'q:%' "
        "GROUP BY namespace, stage"
    )
    if connection.vendor == "sqlite":
        merge += " ON CONFLICT (namespace, stage, lane) DO UPDATE SET n = n + excluded.n"
    with connection.cursor() as cursor:
        cursor.execute(merge)
        cursor.execute("DELETE FROM later_stage_count WHERE lane LIKE 'q:%'")
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE later_stage_count ALTER COLUMN lane TYPE varchar(10)")


def install_version_3(apps, schema_editor):
    """Back to 0013: the objects of version 3 (0010), which read no queue."""
    connection = schema_editor.connection
    version_3 = importlib.import_module("later_django.migrations.0010_partitions")
    with connection.cursor() as cursor:
        version_3.install(cursor, connection.vendor)


# PostgreSQL and SQLite: version 3's objects (0010) with each job counted in
# its queue's lane and a NOTIFY naming a named queue.
POSTGRESQL = (
    """
CREATE OR REPLACE FUNCTION later_job_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text; plain boolean; q text; ready bigint; said text;
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
    RETURN NULL;
END $$;
""",
    """
CREATE OR REPLACE FUNCTION later_job_after_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text; plain boolean; q text; ready bigint; said text;
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
        UPDATE later_job SET stage = 'enqueued',
            changed_ms = GREATEST(now_ms, changed_ms), run_at_ms = now_ms,
            history = history || 'enqueued@' || GREATEST(now_ms, changed_ms) || ';'
        WHERE parent_id = ANY(done_ids) AND stage = 'waiting';
        GET DIAGNOSTICS released = ROW_COUNT;
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
    # CREATE INDEX CONCURRENTLY cannot run in a transaction; the objects'
    # replacement still runs in one (RunPython atomic=True): on SQLite no
    # commit of another process falls between a trigger's drop and its
    # new version.
    atomic = False

    dependencies = [("later_django", "0013_job_control")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="job",
                    name="queue",
                    field=models.CharField(db_default="", max_length=64),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE later_job ADD COLUMN queue varchar(64) DEFAULT '' NOT NULL",
                    "ALTER TABLE later_job DROP COLUMN queue",
                ),
            ],
        ),
        migrations.AddField(model_name="server", name="queues", field=models.TextField(null=True)),
        migrations.CreateModel(
            name="QueueState",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("namespace", models.CharField(max_length=64)),
                ("name", models.CharField(max_length=64)),
                ("paused", models.BooleanField()),
                ("changed_ms", models.BigIntegerField()),
            ],
            options={
                "db_table": "later_queue",
                "constraints": [
                    models.UniqueConstraint(fields=("namespace", "name"), name="later_queue_name")
                ],
            },
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="stagecount",
                    name="lane",
                    field=models.CharField(db_default="", max_length=80),
                ),
            ],
            database_operations=[migrations.RunPython(widen_lane, narrow_lane, atomic=True)],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="job", name=READY),
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(
                        fields=["namespace", "queue", "-priority", "id"],
                        name=READY,
                        condition=Q(stage="enqueued", topic__isnull=True),
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(
                    rebuild_ready_index("forwards"), rebuild_ready_index("backwards")
                )
            ],
        ),
        migrations.RunPython(install_objects, install_version_3, atomic=True, elidable=False),
    ]
