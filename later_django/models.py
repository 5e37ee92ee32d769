"""later's tables. Times are integer epoch milliseconds, identical on every database.

The job row is the delivery queue: a partial index over ``stage='enqueued'``
is what workers claim from, so the hot path touches one narrow row per job.
Later features (queues, topics, unique keys) add nullable columns and their
own partial indexes without changing the claim.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from later_django.states import Stage


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
    # Claims of those that do not count as attempts (given back before or
    # while stopping their handler); NULL for none. The attempt a handler and
    # its retry policy see is attempts - uncounted.
    uncounted = models.IntegerField(null=True)
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
    # The identifier of the schedule whose occurrence this is; written only
    # by the scheduler's insert.
    recurring = models.CharField(max_length=255, null=True)
    # With LATER["TRACING"]: the enqueuing span's context (W3C headers as
    # JSON) that the handler's span continues; written only then.
    trace_context = models.TextField(null=True)
    # Sequential partition mode (docs/partitions.md): a topic's job runs in
    # its turn, by sequence within (topic, partition). NULL for plain jobs:
    # ``topic`` is the lane column of docs/design.md's rule, so every place
    # that looks for plain ready work says ``topic IS NULL``.
    topic = models.CharField(max_length=100, null=True)
    partition = models.IntegerField(null=True)
    sequence = models.BigIntegerField(null=True)

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
        ]
        indexes = [
            models.Index(
                fields=["namespace", "-priority", "id"],
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
            # The dashboard's lists of jobs that need a look: waiting
            # continuations, failures and cancellations, latest first. Plain
            # jobs that succeed never enter it, so they pay nothing for it.
            models.Index(
                fields=["namespace", "stage", "changed_ms", "id"],
                name="later_job_attention",
                condition=Q(stage__in=["waiting", "failed", "cancelled"]),
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
    # '' for plain jobs, 'partition' for a topic's: autoscale reads the
    # plain backlog, stage_counts() sums both.
    lane = models.CharField(max_length=10, db_default="")
    n = models.BigIntegerField()

    class Meta:
        db_table = "later_stage_count"
        indexes = [models.Index(fields=["namespace", "stage"], name="later_count_stage")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.stage}: {self.n}"


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

    Maintenance work that must run once per cluster (VACUUM today; cron
    scheduling, samplers and partition balancing next) is led by whoever
    holds the lease of its name. Every new holder gets a higher epoch, and
    expiry is judged on the database's clock.
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


class Topic(models.Model):
    """A registered topic and its partition count, fixed once stored."""

    namespace = models.CharField(max_length=64)
    name = models.CharField(max_length=100)
    partitions = models.IntegerField()

    class Meta:
        db_table = "later_topic"
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="later_topic_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.partitions} partitions)"


class PartitionSequence(models.Model):
    """The next sequence of a partition. An enqueue increments it in the
    job's own transaction and holds the row until it commits: commit order is
    sequence order, and a rolled-back enqueue leaves no gap. Pollers never
    read it under a lock, so an open transaction holds none of them up."""

    namespace = models.CharField(max_length=64)
    topic = models.CharField(max_length=100)
    partition = models.IntegerField()
    next_seq = models.BigIntegerField()

    class Meta:
        db_table = "later_partition_seq"
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "topic", "partition"], name="later_partition_seq_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}: next {self.next_seq}"


class Partition(models.Model):
    """Who runs a partition's heads: the owner's lease and its fencing
    epoch, one higher for every new holder. Written by pollers only."""

    namespace = models.CharField(max_length=64)
    topic = models.CharField(max_length=100)
    partition = models.IntegerField()
    owner = models.CharField(max_length=64, null=True)
    epoch = models.BigIntegerField(default=0)
    lease_expires_ms = models.BigIntegerField(default=0)

    class Meta:
        db_table = "later_partition"
        constraints = [
            models.UniqueConstraint(
                fields=["namespace", "topic", "partition"], name="later_partition_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition} (epoch {self.epoch}, {self.owner})"


class Schedule(models.Model):
    """A recurring job: its cron, zone and payload, and when it fires next.

    Every server's scheduler takes due rows (SKIP LOCKED on PostgreSQL),
    enqueues their occurrences and moves ``next_run_ms`` in one transaction,
    compare-and-swapped on ``version``, so an occurrence is enqueued once
    however many servers run. Every write of the row adds one to ``version``.
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


class LogTopic(models.Model):
    """A retained-log topic: its fixed partition count and its retention.

    Separate from ``later_topic``: job topics drive partition pollers, log
    topics only hold records."""

    pk = models.CompositePrimaryKey("namespace", "name")
    namespace = models.CharField(max_length=64)
    name = models.CharField(max_length=100)
    partitions = models.IntegerField()
    # Records older than this are deleted by maintenance; NULL keeps them.
    retention_ms = models.BigIntegerField(null=True)
    created_ms = models.BigIntegerField()

    class Meta:
        db_table = "later_log_topic"

    def __str__(self) -> str:
        return f"{self.name} ({self.partitions} partitions)"


class LogPartition(models.Model):
    """A partition's offset counter: the next offset an append takes.

    An append raises it in the appender's transaction and holds the row
    until commit, which makes offsets gapless and commit in order."""

    pk = models.CompositePrimaryKey("namespace", "topic", "part")
    namespace = models.CharField(max_length=64)
    topic = models.CharField(max_length=100)
    part = models.IntegerField()
    next_offset = models.BigIntegerField()

    class Meta:
        db_table = "later_log_partition"

    def __str__(self) -> str:
        return f"{self.topic}/{self.part} (next offset {self.next_offset})"


class LogRecord(models.Model):
    """One retained-log record; never changed, deleted only by retention."""

    pk = models.CompositePrimaryKey("namespace", "topic", "part", "log_offset")
    namespace = models.CharField(max_length=64)
    topic = models.CharField(max_length=100)
    part = models.IntegerField()
    log_offset = models.BigIntegerField()
    record_key = models.BinaryField()
    record_value = models.BinaryField()
    appended_ms = models.BigIntegerField()

    class Meta:
        db_table = "later_log_record"

    def __str__(self) -> str:
        return f"{self.topic}/{self.part}@{self.log_offset}"


class LogConsumer(models.Model):
    """A consumer group's place in a partition: the next offset it reads
    (committed) and the lease of the member reading it, fenced by epoch."""

    pk = models.CompositePrimaryKey("namespace", "topic", "consumer_group", "part")
    namespace = models.CharField(max_length=64)
    topic = models.CharField(max_length=100)
    consumer_group = models.CharField(max_length=100)
    part = models.IntegerField()
    member = models.CharField(max_length=100)
    # Grows with every new holder; writes under a lease name the epoch.
    epoch = models.BigIntegerField()
    expires_ms = models.BigIntegerField()
    committed_offset = models.BigIntegerField()

    class Meta:
        db_table = "later_log_consumer"

    def __str__(self) -> str:
        return f"{self.consumer_group} on {self.topic}/{self.part}"


class Dashboard(Job):
    """The dashboard's entry in the admin index; it has no table of its own."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
        default_permissions = ()


class DashboardStat(models.Model):
    """What one server's workers did over about a second: how many jobs
    they started and finished, and a histogram of how long those jobs waited
    between being due and starting. Written once a second while there was
    work, never per job; kept ten minutes."""

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
