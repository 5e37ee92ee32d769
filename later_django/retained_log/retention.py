"""Retention: the maintenance step that deletes records older than their
topic's retention, run by one server of the namespace at a time.

It runs in a ``later_worker``'s maintenance loop. Only a prefix of each
partition goes, a small batch per statement: what remains is a contiguous
range of offsets, and no statement holds locks long.
"""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.base import Dialect
from later_django.db.rows import LogPartitionKey, LogPrune, LogTopicRow
from later_django.leases import Leader

LEASE_NAME = "retained_log_retention"
STEP = "retained_log_retention"
# The step runs at most this often in a namespace: retentions are hours or
# days, and each run costs a statement per partition.
INTERVAL_MS = 10_000
BATCH = 500  # records one statement looks at and deletes at most
MAX_ROUNDS = 20  # statements per partition per run, so one run stays bounded


def prune_retained_log(
    dialect: Dialect, cursor: CursorWrapper, *, namespace: str, leader: Leader
) -> int:
    """Delete expired records if this server leads retention and the step is
    due; return how many. Costs one read per tick where no topic has a
    retention."""
    topics = dialect.log.log_topic_retained(cursor, namespace=namespace)
    if not topics or leader.lead(dialect, cursor, LEASE_NAME) is None:
        return 0
    if not dialect.cluster.maintenance_claim(
        cursor, namespace=namespace, step=STEP, interval_ms=INTERVAL_MS
    ):
        return 0
    return prune(dialect, cursor, namespace=namespace, topics=topics)


def prune(
    dialect: Dialect, cursor: CursorWrapper, *, namespace: str, topics: list[LogTopicRow]
) -> int:
    """Delete the records of ``topics`` older than their retention; return
    how many. Each statement commits alone: a process killed in between
    leaves only fewer records deleted, which the next run finishes."""
    total = 0
    for topic in topics:
        if topic.retention_ms is None:
            continue
        for partition in range(topic.partitions):
            key = LogPartitionKey(namespace=namespace, topic=topic.name, partition=partition)
            prune_one = LogPrune(key=key, older_than_ms=topic.retention_ms, limit=BATCH)
            for _ in range(MAX_ROUNDS):
                deleted = dialect.log.log_record_prune(cursor, prune_one)
                total += deleted
                if deleted < BATCH:
                    break
    return total
