"""The end of a rate-limited queue's window (docs/how-to/rate-limits.md).

- ``later_queue`` gains ``rate_window_end_ms``, nullable and without a
  default: where the window the starts are counted in ends. A claim resets
  the count only once that end is reached, so a claim stamped before a newer
  window began never moves the window back, and servers whose rate settings
  have different units (a second, a minute, an hour) count in one window
  instead of resetting each other's counts. A row written before it (NULL)
  is a window that ended.
- An expansion only, as 0019: both databases add the column without
  rewriting the table; PostgreSQL's ACCESS EXCLUSIVE lock on later_queue is
  waited for at most ``LOCK_TIMEOUT``, and the migration can be run again.
  Servers of the previous release do not name the column and keep working.
"""

from django.db import migrations, models

LOCK_TIMEOUT = "5s"


def bound_lock_wait(apps, schema_editor):
    # SET LOCAL: for this migration's transaction only.
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


class Migration(migrations.Migration):
    dependencies = [("later_django", "0020_sqlite_counts_in_place")]

    operations = [
        migrations.RunPython(bound_lock_wait, migrations.RunPython.noop, elidable=True),
        migrations.AddField(
            model_name="queuestate",
            name="rate_window_end_ms",
            field=models.BigIntegerField(null=True),
        ),
    ]
