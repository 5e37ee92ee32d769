"""The dashboard (docs/dashboard.md).

- ``later_dashboard_stat``: per server, about once a second while it works,
  the jobs it started and finished and a histogram of their dispatch waits.
- ``later_queue_sample``: the backlog once a minute, kept a week.
- ``later_job_attention``: a partial index over waiting, failed and
  cancelled jobs for the dashboard's lists of them; a plain job that
  succeeds never enters it.
- The ``Dashboard`` proxy: the dashboard's entry in the admin index (no table).
"""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('later_django', '0010_partitions'),
    ]

    operations = [
        migrations.CreateModel(
            name='DashboardStat',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('namespace', models.CharField(max_length=64)),
                ('server_id', models.CharField(max_length=64)),
                ('at_ms', models.BigIntegerField()),
                ('started', models.IntegerField()),
                ('succeeded', models.IntegerField()),
                ('retried', models.IntegerField()),
                ('failed', models.IntegerField()),
                ('regular_waits', models.TextField()),
                ('regular_max_ms', models.BigIntegerField()),
                ('regular_sum_ms', models.BigIntegerField()),
                ('partition_waits', models.TextField()),
                ('partition_max_ms', models.BigIntegerField()),
                ('partition_sum_ms', models.BigIntegerField()),
            ],
            options={
                'db_table': 'later_dashboard_stat',
            },
        ),
        migrations.CreateModel(
            name='QueueSample',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('namespace', models.CharField(max_length=64)),
                ('at_ms', models.BigIntegerField()),
                ('ready', models.BigIntegerField()),
                ('scheduled', models.BigIntegerField()),
                ('running', models.BigIntegerField()),
                ('waiting', models.BigIntegerField()),
                ('partitioned', models.BigIntegerField()),
            ],
            options={
                'db_table': 'later_queue_sample',
            },
        ),
        migrations.CreateModel(
            name='Dashboard',
            fields=[
            ],
            options={
                'verbose_name': 'dashboard',
                'verbose_name_plural': 'dashboard',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('later_django.job',),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('stage__in', ['waiting', 'failed', 'cancelled'])), fields=['namespace', 'stage', 'changed_ms', 'id'], name='later_job_attention'),
        ),
        migrations.AddIndex(
            model_name='dashboardstat',
            index=models.Index(fields=['namespace', 'at_ms'], name='later_dashboard_stat_at'),
        ),
        migrations.AddConstraint(
            model_name='queuesample',
            constraint=models.UniqueConstraint(fields=('namespace', 'at_ms'), name='later_queue_sample_at'),
        ),
    ]
