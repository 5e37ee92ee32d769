"""Unique jobs (docs/unique-jobs.md).

- ``later_job`` gains ``unique_key`` and ``unique_slot_ms``, both NULL for
  every job that does not ask to be unique: added in place on both
  databases (nullable, no default), and a plain insert never names them.
- Two partial unique indexes hold the guarantee: ``later_job_unique``, one
  unfinished job per (namespace, type, key), and
  ``later_job_unique_window``, one job per (namespace, type, key, window
  start) whatever its stage. Jobs without a key have no entry in either.
  On PostgreSQL they are built CONCURRENTLY (the migration is not atomic
  for that reason; every step can be run again, and an invalid index a
  failed build left is dropped first), so enqueues and claims never wait
  on the build.
"""

from django.db import migrations, models
from django.db.models import Q

UNFINISHED = ("enqueued", "delayed", "waiting", "running", "requeued")
INDEXES = {
    "later_job_unique": (
        "(namespace, type_name, unique_key) WHERE unique_key IS NOT NULL AND stage IN "
        "('enqueued', 'delayed', 'waiting', 'running', 'requeued')"
    ),
    "later_job_unique_window": (
        "(namespace, type_name, unique_key, unique_slot_ms) WHERE unique_slot_ms IS NOT NULL"
    ),
}


def create_indexes(apps, schema_editor):
    connection = schema_editor.connection
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        for name, definition in INDEXES.items():
            cursor.execute(f"DROP INDEX {concurrently}IF EXISTS {name}")
            cursor.execute(f"CREATE UNIQUE INDEX {concurrently}{name} ON later_job {definition}")


def drop_indexes(apps, schema_editor):
    connection = schema_editor.connection
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        for name in INDEXES:
            cursor.execute(f"DROP INDEX {concurrently}IF EXISTS {name}")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run in a transaction.
    atomic = False

    dependencies = [("later_django", "0014_queues")]

    operations = [
        migrations.AddField(
            model_name="job", name="unique_key", field=models.CharField(max_length=255, null=True)
        ),
        migrations.AddField(
            model_name="job", name="unique_slot_ms", field=models.BigIntegerField(null=True)
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.UniqueConstraint(
                        fields=("namespace", "type_name", "unique_key"),
                        name="later_job_unique",
                        condition=Q(unique_key__isnull=False, stage__in=UNFINISHED),
                    ),
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.UniqueConstraint(
                        fields=("namespace", "type_name", "unique_key", "unique_slot_ms"),
                        name="later_job_unique_window",
                        condition=Q(unique_slot_ms__isnull=False),
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(create_indexes, drop_indexes)],
        ),
    ]
