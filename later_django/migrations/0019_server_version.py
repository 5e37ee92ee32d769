"""The release each server runs (docs/how-to/upgrading.md).

- ``later_server`` gains ``version``, nullable and without a default: a
  server of this release writes ``later_django.__version__`` with every
  heartbeat; a server of the previous release, which does not name the
  column, leaves it NULL ("before versions were recorded") and keeps
  working on this schema.
- An expansion only: both databases add the column without rewriting the
  table (PostgreSQL records it in the catalog; SQLite appends it with
  ALTER TABLE ADD COLUMN). PostgreSQL still takes the table's ACCESS
  EXCLUSIVE lock for that moment: the migration waits for it at most
  ``LOCK_TIMEOUT`` and then fails, and can be run again, rather than queue
  every heartbeat behind a transaction that holds the table.
"""

from django.db import migrations, models

LOCK_TIMEOUT = "5s"


def bound_lock_wait(apps, schema_editor):
    # SET LOCAL: for this migration's transaction only.
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


class Migration(migrations.Migration):
    dependencies = [("later_django", "0018_partition_news")]

    operations = [
        migrations.RunPython(bound_lock_wait, migrations.RunPython.noop, elidable=True),
        migrations.AddField(
            model_name="server",
            name="version",
            field=models.CharField(max_length=64, null=True),
        ),
    ]
