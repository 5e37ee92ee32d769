"""Limits across every server (docs/rate-limits.md, docs/concurrency-limits.md).

- ``later_job`` gains ``concurrency_key`` and ``concurrency_limit``,
  nullable: a job whose type has no concurrency limit never names them, and
  both databases add them without rewriting the table.
- Two partial indexes over keyed jobs, by (namespace, key): the running
  ones (what a limited claim counts) and the ready ones (what the metrics'
  held-back figure reads). Plain jobs never enter them. On PostgreSQL they
  are built CONCURRENTLY, so enqueues and claims never wait on the build
  (the migration is not atomic for that reason; every step can run again).
- ``later_queue`` gains ``rate_window_ms`` and ``rate_started``, nullable:
  the window a rate-limited queue's starts are counted in, and the count.

The database objects (triggers, later_complete_many) are unchanged:
version 4 (0014).
"""

from django.db import migrations, models
from django.db.models import Q

INDEXES = {
    "later_job_keyed_running": "stage = 'running'",
    "later_job_keyed_ready": "stage = 'enqueued'",
}


def create_indexes(apps, schema_editor):
    connection = schema_editor.connection
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        for name, stage in INDEXES.items():
            if connection.vendor == "postgresql":
                # A build that failed half-way left an invalid index: dropped first.
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            cursor.execute(
                f"CREATE INDEX {concurrently}IF NOT EXISTS {name} ON later_job "
                f"(namespace, concurrency_key) WHERE {stage} AND concurrency_key IS NOT NULL"
            )


def drop_indexes(apps, schema_editor):
    connection = schema_editor.connection
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        for name in INDEXES:
            cursor.execute(f"DROP INDEX {concurrently}IF EXISTS {name}")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run in a transaction.
    atomic = False

    dependencies = [("later_django", "0015_unique_jobs")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job", name="concurrency_limit", field=models.IntegerField(null=True)
        ),
        migrations.AddField(
            model_name="queuestate",
            name="rate_window_ms",
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="queuestate", name="rate_started", field=models.IntegerField(null=True)
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(
                        fields=["namespace", "concurrency_key"],
                        name="later_job_keyed_running",
                        condition=Q(stage="running", concurrency_key__isnull=False),
                    ),
                ),
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(
                        fields=["namespace", "concurrency_key"],
                        name="later_job_keyed_ready",
                        condition=Q(stage="enqueued", concurrency_key__isnull=False),
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(create_indexes, drop_indexes)],
        ),
    ]
