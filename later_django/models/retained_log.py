"""The retained log's tables: topics, partition offset counters, records, and
consumer groups' places and leases. Separate from the job topics of partitions.py.
"""

from __future__ import annotations

from django.db import models


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
