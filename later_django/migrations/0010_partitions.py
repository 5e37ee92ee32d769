"""Sequential partition mode (docs/partitions.md).

- ``later_job`` gains ``topic``, ``partition`` and ``sequence``, NULL for
  plain jobs (plain ``ADD COLUMN``s: SQLite keeps the table and its
  triggers). The ready index gains ``topic IS NULL``: plain claims never read
  a partition job. A partial index finds a partition's head.
- ``later_topic`` is made again with a namespace: a topic is registered per
  namespace. Its rows are registrations only, written again from
  ``LATER["TOPICS"]`` by ``later_migrate``.
- ``later_partition_seq`` (sequences) and ``later_partition`` (owner, lease,
  epoch) are new; ``later_stage_count`` gains ``lane`` and ``later_server``
  ``topics``.
"""

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


class Migration(migrations.Migration):
    dependencies = [("later_django", "0009_retained_log")]

    operations = [
        migrations.RunPython(
            drop_sqlite_counter_triggers, migrations.RunPython.noop, elidable=False
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
            model_name="stagecount", name="lane", field=models.CharField(default="", max_length=10)
        ),
        migrations.AddField(
            model_name="server", name="topics", field=models.BooleanField(default=False)
        ),
        migrations.AddField(
            model_name="schedule", name="sequential", field=models.BooleanField(default=False)
        ),
    ]
