"""The table of recurring jobs; the scheduler enqueues their occurrences and
recurring/ is their public API.
"""

from __future__ import annotations

from django.db import models


class Schedule(models.Model):
    """A recurring job: its cron, zone and payload, and when it fires next.

    Every write adds one to ``version``; the scheduler's transaction is
    compare-and-swapped on it, so an occurrence is enqueued once however
    many servers fire (later_django/recurring/firing.py).
    """

    namespace = models.CharField(max_length=64)
    identifier = models.CharField(max_length=255)
    cron = models.CharField(max_length=255)
    zone = models.CharField(max_length=64)
    type_name = models.CharField(max_length=255)
    payload = models.BinaryField()
    priority = models.SmallIntegerField(default=0)
    retry_policy = models.TextField(null=True)
    # The next occurrence not enqueued yet.
    next_run_ms = models.BigIntegerField()
    # The last occurrence enqueued: its job and its fire time.
    last_job_id = models.CharField(max_length=26, null=True)
    last_run_ms = models.BigIntegerField(null=True)
    version = models.BigIntegerField(default=1)
    created_ms = models.BigIntegerField()
    changed_ms = models.BigIntegerField()
    # enqueue_recurring_sequential: occurrences go into the reserved topic's
    # partition of the identifier, so they never overlap.
    sequential = models.BooleanField(db_default=False)

    class Meta:
        db_table = "later_schedule"
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "identifier"], name="later_schedule_identifier"
            )
        ]
        indexes = [models.Index(fields=["namespace", "next_run_ms"], name="later_schedule_due")]

    def __str__(self) -> str:
        return f"{self.identifier} ({self.cron} {self.zone})"
