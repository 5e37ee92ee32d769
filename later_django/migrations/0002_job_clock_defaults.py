"""PostgreSQL: a COPY of ready jobs takes its times from the database's clock.

Bulk enqueues stream rows with COPY, which carries values, not expressions;
the columns it leaves out take these defaults: the start of the COPY on the
database's clock, and the matching history entry of a ready job. SQLite
inserts compute the same values in the statement and needs no default.
"""

from django.db import migrations

NOW_MS = "(date_part('epoch', statement_timestamp()) * 1000)::bigint"

SET_DEFAULTS = f"""
ALTER TABLE later_job
    ALTER COLUMN created_ms SET DEFAULT {NOW_MS},
    ALTER COLUMN run_at_ms SET DEFAULT {NOW_MS},
    ALTER COLUMN changed_ms SET DEFAULT {NOW_MS},
    ALTER COLUMN history SET DEFAULT 'enqueued@' || {NOW_MS} || ';'
"""

DROP_DEFAULTS = """
ALTER TABLE later_job
    ALTER COLUMN created_ms DROP DEFAULT,
    ALTER COLUMN run_at_ms DROP DEFAULT,
    ALTER COLUMN changed_ms DROP DEFAULT,
    ALTER COLUMN history DROP DEFAULT
"""


def set_defaults(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SET_DEFAULTS)


def drop_defaults(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_DEFAULTS)


class Migration(migrations.Migration):
    dependencies = [("later_django", "0001_initial")]

    operations = [migrations.RunPython(set_defaults, drop_defaults, elidable=False)]
