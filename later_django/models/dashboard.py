"""The dashboard's tables: its admin-index entry (a proxy of Job), the
per-second worker stats and the once-a-minute queue samples it draws.
"""

from __future__ import annotations

from django.db import models

from .jobs import Job


class Dashboard(Job):
    """The dashboard's entry in the admin index; it has no table of its own."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
        default_permissions = ()


class DashboardStat(models.Model):
    """What one server's workers did over about a second: jobs started and
    finished, and a histogram of their waits. Written once a second while
    there was work, never per job; kept ten minutes."""

    namespace = models.CharField(max_length=64)
    server_id = models.CharField(max_length=64)
    at_ms = models.BigIntegerField()
    started = models.IntegerField()
    succeeded = models.IntegerField()
    retried = models.IntegerField()
    failed = models.IntegerField()
    # "bucket:count,..." per lane (later_django/dashboard/waits.py), and the
    # largest and total wait in ms.
    regular_waits = models.TextField()
    regular_max_ms = models.BigIntegerField()
    regular_sum_ms = models.BigIntegerField()
    partition_waits = models.TextField()
    partition_max_ms = models.BigIntegerField()
    partition_sum_ms = models.BigIntegerField()

    class Meta:
        db_table = "later_dashboard_stat"
        indexes = [models.Index(fields=["namespace", "at_ms"], name="later_dashboard_stat_at")]

    def __str__(self) -> str:
        return f"{self.server_id} at {self.at_ms}"


class QueueSample(models.Model):
    """The backlog once a minute, taken by one server: the queue-length
    graph's points, kept a week."""

    namespace = models.CharField(max_length=64)
    at_ms = models.BigIntegerField()
    # Plain jobs ready now; delayed and requeued ones; running ones; waiting
    # continuations; a topic's unfinished jobs (the partitions' backlog).
    ready = models.BigIntegerField()
    scheduled = models.BigIntegerField()
    running = models.BigIntegerField()
    waiting = models.BigIntegerField()
    partitioned = models.BigIntegerField()

    class Meta:
        db_table = "later_queue_sample"
        constraints = [
            models.UniqueConstraint(fields=["namespace", "at_ms"], name="later_queue_sample_at")
        ]

    def __str__(self) -> str:
        return f"{self.namespace} at {self.at_ms}"
