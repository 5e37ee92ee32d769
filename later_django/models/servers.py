"""The tables of running servers and of what they share: heartbeats, the
last run of each maintenance step, and named epoch-fenced leases.
"""

from __future__ import annotations

from django.db import models


class Server(models.Model):
    """A running later_worker process; its heartbeat says it is alive."""

    id = models.CharField(primary_key=True, max_length=64)
    namespace = models.CharField(max_length=64)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    workers = models.IntegerField()
    started_ms = models.BigIntegerField()
    heartbeat_ms = models.BigIntegerField()
    # Runs partition pollers: only such servers win partitions.
    topics = models.BooleanField(db_default=False)
    # The queues it serves, comma-separated; NULL: a server of a release
    # before queues, which claims from every queue and knows no pause.
    queues = models.TextField(null=True)
    # The release it runs (later_django.__version__); NULL: a server of a
    # release before versions were recorded (docs/how-to/upgrading.md).
    version = models.CharField(max_length=64, null=True)

    class Meta:
        db_table = "later_server"
        indexes = [models.Index(fields=["namespace", "heartbeat_ms"], name="later_server_live")]

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"


class MaintenanceRun(models.Model):
    """When each maintenance step last ran in a namespace, across all servers."""

    namespace = models.CharField(max_length=64)
    step = models.CharField(max_length=32)
    last_run_ms = models.BigIntegerField()

    class Meta:
        db_table = "later_maintenance"
        constraints = [
            models.UniqueConstraint(fields=["namespace", "step"], name="later_maintenance_step")
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.step}"


class Lease(models.Model):
    """A named lease held by one server at a time, fenced by its epoch.

    Work that must run once per cluster (VACUUM, the dashboard's samples,
    retained-log retention) is led by whoever holds the lease of its name.
    Expiry is judged on the database's clock.
    """

    namespace = models.CharField(max_length=64)
    name = models.CharField(max_length=100)
    owner = models.CharField(max_length=64)
    epoch = models.BigIntegerField()
    expires_ms = models.BigIntegerField()

    class Meta:
        db_table = "later_lease"
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="later_lease_name")
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (epoch {self.epoch}, {self.owner})"


class QueueState(models.Model):
    """A named queue's state shared by every server: paused or not, and its
    rate limit's window. A queue without a row runs. Every claim reads it."""

    namespace = models.CharField(max_length=64)
    name = models.CharField(max_length=64)
    paused = models.BooleanField()
    changed_ms = models.BigIntegerField()
    # A rate-limited queue's current window (database clock) and the jobs its
    # claims started in it; NULL until such a claim first ran (the end: until
    # one of this release ran, migration 0021).
    rate_window_ms = models.BigIntegerField(null=True)
    rate_window_end_ms = models.BigIntegerField(null=True)
    rate_started = models.IntegerField(null=True)

    class Meta:
        db_table = "later_queue"
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="later_queue_name")
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}{' (paused)' if self.paused else ''}"
