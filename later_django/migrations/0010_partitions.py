"""Sequential partition mode (docs/partitions.md).

- ``later_job`` gains ``topic``, ``partition`` and ``sequence``, NULL for
  plain jobs (plain ``ADD COLUMN``s: SQLite keeps the table and its
  triggers). The ready index gains ``topic IS NULL``: plain claims never read
  a partition job. A partial index finds a partition's head.
- ``later_topic`` is made again with a namespace: a topic is registered per
  namespace. Its rows are registrations only, written again from
  ``LATER["TOPICS"]`` by ``later_migrate``.
- ``later_partition_seq`` (sequences) and ``later_partition`` (owner, lease,
  epoch) are new; ``later_stage_count`` gains ``lane``, ``later_server``
  ``topics`` and ``later_schedule`` ``sequential``, each with a database
  default: servers of the previous version, still running while this
  migrates, write those rows without the new column.
- The database objects, version 3, in the same transaction as the tables
  (no commit of another process can fall between the counter triggers'
  removal and their new version): as version 2 (0005), but partition jobs
  (``topic IS NOT NULL``) are counted in their own lane of
  ``later_stage_count`` and wake partition pollers on channel
  'later_partition' (payload: the namespace) when they become ready or finish
  (a finished head lets the next one run, also when another process
  cancelled or force-failed it), never the plain workers on 'later'
  (docs/design.md, "Jobs that are enqueued but not for plain workers"). On
  SQLite the one-row-per-stage index gains the lane.

Frozen: the objects' text is what version 3 installs, whatever later code
says; a new version is a new migration holding the whole new text.
"""

import importlib

from django.db import migrations, models
from django.db.models import Q

UNFINISHED = ~Q(stage__in=["success", "failed", "cancelled"])

# SQLite remakes later_stage_count to add its column, and refuses to rename
# a table that triggers of later_job write to: the counter triggers go first,
# and version 3 of the objects (the next migration) makes them again.
SQLITE_COUNTER_TRIGGERS = ("later_job_count_insert", "later_job_count_update", "later_job_count_delete")


def drop_sqlite_counter_triggers(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            for name in SQLITE_COUNTER_TRIGGERS:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")


def install_version_2(connection):
    """Back to 0009: the objects of version 2 (0005), as that state had them."""
    version_2 = importlib.import_module("later_django.migrations.0005_database_objects_v2")
    with connection.cursor() as cursor:
        version_2.install(cursor, connection.vendor)


def restore_sqlite_version_2(apps, schema_editor):
    # Reversed last, once later_stage_count is remade without its lane.
    if schema_editor.connection.vendor == "sqlite":
        install_version_2(schema_editor.connection)


def uninstall_version_3(apps, schema_editor):
    # Reversed first: SQLite's counter triggers, and its index on the lane,
    # must be gone before its tables are changed back; PostgreSQL's functions
    # go back to version 2, which reads no column this migration added.
    connection = schema_editor.connection
    if connection.vendor == "sqlite":
        drop_sqlite_counter_triggers(apps, schema_editor)
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS later_count_one_row")
    elif connection.vendor == "postgresql":
        install_version_2(connection)


# PostgreSQL: statement-level triggers see every changed row at once through
# transition tables, so a batch of 500 inserts adds one counter row per stage,
# not 500; counter rows are only ever inserted (never updated), so concurrent
# writers never wait on each other, and maintenance folds them. Jobs that
# become ready NOTIFY their namespace and count on channel 'later', at commit.
# later_complete_many stores a batch of successes and then releases their
# waiting continuations: each statement inside a plpgsql function takes its
# own snapshot, so the look for children after the parents' update sees a
# child committed while the completion ran (docs/design.md); its generic
# plans are kept, or the server would plan both statements on every call.
POSTGRESQL = (
    """
CREATE OR REPLACE FUNCTION later_job_after_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE ns text; plain boolean; ready bigint;
BEGIN
    INSERT INTO later_stage_count (namespace, stage, lane, n)
        SELECT namespace, stage, CASE WHEN topic IS NULL THEN '' ELSE 'partition' END, count(*) FROM new_rows
        GROUP BY namespace, stage, CASE WHEN topic IS NULL THEN '' ELSE 'partition' END;
    FOR ns, plain, ready IN SELECT namespace, topic IS NULL, count(*) FROM new_rows
            WHERE stage = 'enqueued' GROUP BY namespace, topic IS NULL LOOP
        IF plain THEN
            PERFORM pg_notify('later', CASE WHEN ready = 1 THEN ns ELSE ns || chr(31) || ready END);
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
DECLARE ns text; plain boolean; ready bigint;
BEGIN
    INSERT INTO later_stage_count (namespace, stage, lane, n)
        SELECT namespace, stage, lane, sum(d) FROM (
            SELECT o.namespace, o.stage, CASE WHEN o.topic IS NULL THEN '' ELSE 'partition' END
                    AS lane, -1 AS d
                FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.stage <> n.stage
            UNION ALL
            SELECT n.namespace, n.stage, CASE WHEN n.topic IS NULL THEN '' ELSE 'partition' END, 1
                FROM old_rows o JOIN new_rows n ON n.id = o.id WHERE o.stage <> n.stage
        ) changes GROUP BY namespace, stage, lane;
    FOR ns, plain, ready IN SELECT r.namespace, r.topic IS NULL, count(*)
            FROM old_rows o JOIN new_rows r ON r.id = o.id
            WHERE o.stage <> r.stage AND (r.stage = 'enqueued' OR (r.topic IS NOT NULL
                AND r.stage IN ('success', 'failed', 'cancelled')))
            GROUP BY r.namespace, r.topic IS NULL LOOP
        IF plain THEN
            PERFORM pg_notify('later', CASE WHEN ready = 1 THEN ns ELSE ns || chr(31) || ready END);
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
        SELECT namespace, stage, CASE WHEN topic IS NULL THEN '' ELSE 'partition' END, -count(*) FROM old_rows
        GROUP BY namespace, stage, CASE WHEN topic IS NULL THEN '' ELSE 'partition' END;
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
    VALUES (NEW.namespace, NEW.stage, CASE WHEN NEW.topic IS NULL THEN '' ELSE 'partition' END, 1)
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
    VALUES (OLD.namespace, OLD.stage, CASE WHEN OLD.topic IS NULL THEN '' ELSE 'partition' END, -1)
    ON CONFLICT (namespace, stage, lane) DO UPDATE SET n = n - 1;
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    VALUES (NEW.namespace, NEW.stage, CASE WHEN NEW.topic IS NULL THEN '' ELSE 'partition' END, 1)
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
    VALUES (OLD.namespace, OLD.stage, CASE WHEN OLD.topic IS NULL THEN '' ELSE 'partition' END, -1)
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
    dependencies = [("later_django", "0009_retained_log")]

    operations = [
        migrations.RunPython(
            drop_sqlite_counter_triggers, restore_sqlite_version_2, elidable=False
        ),
        migrations.AddField(
            model_name="job", name="topic", field=models.CharField(max_length=100, null=True)
        ),
        migrations.AddField(
            model_name="job", name="partition", field=models.IntegerField(null=True)
        ),
        migrations.AddField(
            model_name="job", name="sequence", field=models.BigIntegerField(null=True)
        ),
        migrations.RemoveIndex(model_name="job", name="later_job_ready"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                fields=["namespace", "-priority", "id"],
                name="later_job_ready",
                condition=Q(stage="enqueued", topic__isnull=True),
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                fields=["namespace", "topic", "partition", "sequence"],
                name="later_job_partition_head",
                condition=Q(topic__isnull=False) & UNFINISHED,
            ),
        ),
        migrations.DeleteModel(name="Topic"),
        migrations.CreateModel(
            name="Topic",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("namespace", models.CharField(max_length=64)),
                ("name", models.CharField(max_length=100)),
                ("partitions", models.IntegerField()),
            ],
            options={
                "db_table": "later_topic",
                "constraints": [
                    models.UniqueConstraint(fields=("namespace", "name"), name="later_topic_name")
                ],
            },
        ),
        migrations.CreateModel(
            name="PartitionSequence",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("namespace", models.CharField(max_length=64)),
                ("topic", models.CharField(max_length=100)),
                ("partition", models.IntegerField()),
                ("next_seq", models.BigIntegerField()),
            ],
            options={
                "db_table": "later_partition_seq",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("namespace", "topic", "partition"), name="later_partition_seq_key"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Partition",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("namespace", models.CharField(max_length=64)),
                ("topic", models.CharField(max_length=100)),
                ("partition", models.IntegerField()),
                ("owner", models.CharField(max_length=64, null=True)),
                ("epoch", models.BigIntegerField(default=0)),
                ("lease_expires_ms", models.BigIntegerField(default=0)),
            ],
            options={
                "db_table": "later_partition",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("namespace", "topic", "partition"), name="later_partition_key"
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="stagecount", name="lane", field=models.CharField(db_default="", max_length=10)
        ),
        migrations.AddField(
            model_name="server", name="topics", field=models.BooleanField(db_default=False)
        ),
        migrations.AddField(
            model_name="schedule", name="sequential", field=models.BooleanField(db_default=False)
        ),
        migrations.RunPython(install_objects, uninstall_version_3, elidable=False),
    ]
