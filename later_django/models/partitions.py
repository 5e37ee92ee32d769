"""The tables of job topics: a topic's partition count, each partition's next
sequence, and the lease of the poller that runs a partition's heads.
"""

from __future__ import annotations

from django.db import models


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
