"""The database objects, version 7: SQLite's stage counts are updated in place.

Version 6's SQLite triggers (0018) counted each change with an upsert into
``later_stage_count`` (INSERT ... ON CONFLICT DO UPDATE). The table's id is
AUTOINCREMENT, and SQLite rewrites the table's ``sqlite_sequence`` row at
the end of every INSERT statement on it that has a row to insert, an upsert
that only updated included: one more page in every commit that changes a stage
(five pages for a single enqueue, not four). Version 7 updates the count's
row and inserts it only when the update found none: ``changes()``, inside a
trigger, is the number of rows of the trigger's statement just before.

PostgreSQL's objects are version 6's, unchanged: statement-level triggers
that insert delta rows, with no sequence write to spare.

Frozen: the objects' text is what version 7 installs, whatever later code
says; a new version is a new migration holding the whole new text.
"""

import importlib

from django.db import migrations

# Frozen too: 0018 never changes.
_VERSION_6 = importlib.import_module("later_django.migrations.0018_partition_news")


def install_version_6(apps, schema_editor):
    """Back to 0019: SQLite's objects of version 6, whose counts are upserts."""
    connection = schema_editor.connection
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            _VERSION_6.install(cursor, connection.vendor)


POSTGRESQL = _VERSION_6.POSTGRESQL

# SQLite: row-level triggers; each change adds to its stage's row (a single
# writer, so the row is never contended), made by the first change of its
# (namespace, stage, lane). It has no CREATE OR REPLACE TRIGGER: each is
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
    UPDATE later_stage_count SET n = n + 1
    WHERE namespace = NEW.namespace AND stage = NEW.stage
      AND lane = CASE WHEN NEW.topic IS NOT NULL THEN 'partition' WHEN NEW.queue = '' THEN '' ELSE 'q:' || NEW.queue END;
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    SELECT NEW.namespace, NEW.stage, CASE WHEN NEW.topic IS NOT NULL THEN 'partition' WHEN NEW.queue = '' THEN '' ELSE 'q:' || NEW.queue END, 1
    WHERE changes() = 0;
END
""",
    """
DROP TRIGGER IF EXISTS later_job_count_update
""",
    """
CREATE TRIGGER later_job_count_update
AFTER UPDATE OF stage ON later_job WHEN OLD.stage <> NEW.stage
BEGIN
    UPDATE later_stage_count SET n = n - 1
    WHERE namespace = OLD.namespace AND stage = OLD.stage
      AND lane = CASE WHEN OLD.topic IS NOT NULL THEN 'partition' WHEN OLD.queue = '' THEN '' ELSE 'q:' || OLD.queue END;
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    SELECT OLD.namespace, OLD.stage, CASE WHEN OLD.topic IS NOT NULL THEN 'partition' WHEN OLD.queue = '' THEN '' ELSE 'q:' || OLD.queue END, -1
    WHERE changes() = 0;
    UPDATE later_stage_count SET n = n + 1
    WHERE namespace = NEW.namespace AND stage = NEW.stage
      AND lane = CASE WHEN NEW.topic IS NOT NULL THEN 'partition' WHEN NEW.queue = '' THEN '' ELSE 'q:' || NEW.queue END;
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    SELECT NEW.namespace, NEW.stage, CASE WHEN NEW.topic IS NOT NULL THEN 'partition' WHEN NEW.queue = '' THEN '' ELSE 'q:' || NEW.queue END, 1
    WHERE changes() = 0;
END
""",
    """
DROP TRIGGER IF EXISTS later_job_count_delete
""",
    """
CREATE TRIGGER later_job_count_delete AFTER DELETE ON later_job
BEGIN
    UPDATE later_stage_count SET n = n - 1
    WHERE namespace = OLD.namespace AND stage = OLD.stage
      AND lane = CASE WHEN OLD.topic IS NOT NULL THEN 'partition' WHEN OLD.queue = '' THEN '' ELSE 'q:' || OLD.queue END;
    INSERT INTO later_stage_count (namespace, stage, lane, n)
    SELECT OLD.namespace, OLD.stage, CASE WHEN OLD.topic IS NOT NULL THEN 'partition' WHEN OLD.queue = '' THEN '' ELSE 'q:' || OLD.queue END, -1
    WHERE changes() = 0;
END
""",
)

OBJECTS = {"postgresql": POSTGRESQL, "sqlite": SQLITE}
NAMES = _VERSION_6.NAMES


def install(cursor, vendor):
    """Create or replace every object of this version; idempotent."""
    for statement in OBJECTS[vendor]:
        cursor.execute(statement)


def install_objects(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "sqlite":  # PostgreSQL's are version 6's already
        with connection.cursor() as cursor:
            install(cursor, connection.vendor)


class Migration(migrations.Migration):
    dependencies = [("later_django", "0019_server_version")]

    operations = [
        migrations.RunPython(install_objects, install_version_6, elidable=False),
    ]
