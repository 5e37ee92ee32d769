"""The job table and what hangs off a job: its id column, the per-stage
counts its triggers keep, and the Django Tasks backend's results beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.models import Q

from later_django.states import UNFINISHED, Stage


class JobIdField(models.CharField):  # type: ignore[type-arg]  # django-stubs generics
    """A 26-character job id column with no extra LIKE index on PostgreSQL.

    Django adds a ``varchar_pattern_ops`` index beside every indexed varchar
    on PostgreSQL; ids are never searched with LIKE, and a second index on
    the primary key would cost every insert. Spelling the type out avoids it.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs["max_length"] = 26
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def db_type(self, connection: object) -> str | None:
        if getattr(connection, "vendor", None) == "postgresql":
            return "character varying(26)"
        return super().db_type(connection)  # type: ignore[arg-type]

    def deconstruct(self) -> tuple[str, str, Sequence[Any], dict[str, Any]]:
        name, _, args, kwargs = super().deconstruct()
        # Migrations name the field by its public path, not the module of the
        # models package that defines it: released ones import it from there.
        return name, "later_django.models.JobIdField", args, kwargs


class Job(models.Model):
    id = JobIdField(primary_key=True)
    namespace = models.CharField(max_length=64)
    type_name = models.CharField(max_length=255)
    payload = models.BinaryField()
    stage = models.CharField(max_length=10, choices=Stage.choices)
    priority = models.SmallIntegerField(default=0)
    # Times the job has been claimed; also the fencing epoch of its lease, so
    # it only ever grows.
    attempts = models.IntegerField(default=0)
    # Claims given back before or while stopping their handler; NULL for none.
    # The attempt a handler and its retry policy see is attempts - uncounted.
    uncounted = models.IntegerField(null=True)
    # enqueue(..., timeout=) in ms; NULL: the handler's @job(timeout=), if any.
    timeout_ms = models.BigIntegerField(null=True)
    # When cancel() asked the running job to stop (db clock); NULL: never.
    cancel_requested_ms = models.BigIntegerField(null=True)
    # '' for the default queue: a plain insert never names the column
    # (later_django/queue_names.py column_value).
    queue = models.CharField(max_length=64, db_default="")
    # JSON RetryPolicy; NULL means LATER's default policy when it fails.
    retry_policy = models.TextField(null=True)
    # No foreign key: parents expire and are pruned independently.
    parent_id = models.CharField(max_length=26, null=True)
    created_ms = models.BigIntegerField()
    run_at_ms = models.BigIntegerField()
    changed_ms = models.BigIntegerField()
    started_ms = models.BigIntegerField(null=True)
    finished_ms = models.BigIntegerField(null=True)
    expires_ms = models.BigIntegerField(null=True)
    lease_owner = models.CharField(max_length=64, null=True)
    lease_expires_ms = models.BigIntegerField(null=True)
    last_error = models.TextField(null=True)
    # Every stage change as "stage@epoch_ms;", appended in the same statement.
    history = models.TextField(default="")
    # The schedule whose occurrence this is; written only by the scheduler.
    recurring = models.CharField(max_length=255, null=True)
    # With LATER["TRACING"]: the enqueuing span's W3C headers, as JSON.
    trace_context = models.TextField(null=True)
    # Sequential partition mode: runs by sequence within (topic, partition).
    # NULL for plain jobs, so every look for plain ready work says
    # ``topic IS NULL`` (docs/explanation/design.md).
    topic = models.CharField(max_length=100, null=True)
    partition = models.IntegerField(null=True)
    sequence = models.BigIntegerField(null=True)
    # Unique jobs (docs/how-to/unique-jobs.md); the slot is the start of the
    # unique_for window. NULL for other jobs: the unique indexes skip them.
    unique_key = models.CharField(max_length=255, null=True)
    unique_slot_ms = models.BigIntegerField(null=True)
    # Per-key concurrency (docs/how-to/concurrency-limits.md); NULL for other
    # jobs: only the insert of a limited type names these columns.
    concurrency_key = models.CharField(max_length=255, null=True)
    concurrency_limit = models.IntegerField(null=True)

    class Meta:
        db_table = "later_job"
        permissions = [("view_dashboard", "Can view the later dashboard")]
        constraints = [
            # A lease exists only while the job runs; finishing statements are
            # fenced by the lease alone and find their row by primary key.
            models.CheckConstraint(
                condition=Q(stage="running")
                | Q(lease_owner__isnull=True, lease_expires_ms__isnull=True),
                name="later_job_lease_only_running",
            ),
            # What an enqueue with a unique key checks, in the same insert
            # (ON CONFLICT DO NOTHING): held by the database, so enqueuers in
            # separate transactions and processes never both get in.
            models.UniqueConstraint(
                fields=["namespace", "type_name", "unique_key"],
                name="later_job_unique",
                condition=Q(unique_key__isnull=False, stage__in=UNFINISHED),
            ),
            models.UniqueConstraint(
                fields=["namespace", "type_name", "unique_key", "unique_slot_ms"],
                name="later_job_unique_window",
                condition=Q(unique_slot_ms__isnull=False),
            ),
        ]
        indexes = [
            # Each queue a run of its own in claim order: a claim of one queue
            # never reads past another's jobs, nor sorts its own.
            models.Index(
                fields=["namespace", "queue", "-priority", "id"],
                name="later_job_ready",
                condition=Q(stage="enqueued", topic__isnull=True),
            ),
            # A partition's head: its unfinished job of the lowest sequence.
            models.Index(
                fields=["namespace", "topic", "partition", "sequence"],
                name="later_job_partition_head",
                condition=Q(topic__isnull=False) & ~Q(stage__in=["success", "failed", "cancelled"]),
            ),
            models.Index(
                fields=["namespace", "run_at_ms"],
                name="later_job_due",
                condition=Q(stage__in=["delayed", "requeued"]),
            ),
            models.Index(
                fields=["namespace", "lease_expires_ms"],
                name="later_job_leased",
                condition=Q(stage="running"),
            ),
            # The dashboard's lists that need a look, latest first; jobs that
            # succeed never enter it, so they pay nothing for it.
            models.Index(
                fields=["namespace", "stage", "changed_ms", "id"],
                name="later_job_attention",
                condition=Q(stage__in=["waiting", "failed", "cancelled"]),
            ),
            # What a limited claim counts and the held-back metric reads;
            # plain jobs never enter either (their key is NULL).
            models.Index(
                fields=["namespace", "concurrency_key"],
                name="later_job_keyed_running",
                condition=Q(stage="running", concurrency_key__isnull=False),
            ),
            models.Index(
                fields=["namespace", "concurrency_key"],
                name="later_job_keyed_ready",
                condition=Q(stage="enqueued", concurrency_key__isnull=False),
            ),
            models.Index(
                fields=["parent_id"],
                name="later_job_parent",
                condition=Q(parent_id__isnull=False),
            ),
            models.Index(
                fields=["namespace", "expires_ms"],
                name="later_job_expiry",
                condition=Q(expires_ms__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type_name} {self.id} ({self.stage})"


class StageCount(models.Model):
    """Per-stage job counts, maintained by triggers on ``later_job``.

    PostgreSQL triggers append delta rows (no row is ever contended) and
    maintenance folds them together; SQLite triggers upsert one row per stage.
    The count of a stage is always ``SUM(n)``.
    """

    namespace = models.CharField(max_length=64)
    stage = models.CharField(max_length=10, choices=Stage.choices)
    # '', 'q:<name>' or 'partition' (later_django/queue_names.py lane_of):
    # autoscale and the Queues panel read a queue's counts.
    lane = models.CharField(max_length=80, db_default="")
    n = models.BigIntegerField()

    class Meta:
        db_table = "later_stage_count"
        indexes = [models.Index(fields=["namespace", "stage"], name="later_count_stage")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.stage}: {self.n}"


class TaskResult(models.Model):
    """What the Django Tasks backend keeps beside a task's job: the return
    value, the errors and the workers of its attempts. Only tasks write it;
    its stage and times are the job's own. Deleted with the job (pruning)."""

    job_id = JobIdField(primary_key=True)
    # JSON lists: one worker id per attempt started; one error per attempt
    # failed ({"exception_class_path", "traceback"}).
    worker_ids = models.TextField(default="[]")
    errors = models.TextField(default="[]")
    # JSON of the task's return value once an attempt succeeded.
    return_value = models.TextField(null=True)

    class Meta:
        db_table = "later_task_result"
