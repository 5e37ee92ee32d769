"""The reserved topic of sequential recurring jobs
(``enqueue_recurring_sequential``): every occurrence of a schedule, and every
job chained to one with ``enqueue_recurring_continue``, goes into the
partition of this topic that the schedule's identifier hashes to, so they run
one at a time, in order. Its name has a ':', which no topic of
LATER["TOPICS"] may have."""

from __future__ import annotations

from typing import Final

from later_django.conf import conf
from later_django.partitions.hashing import partition_for_key
from later_django.types import PartitionLane

RECURRING_TOPIC: Final = "later:recurring"
NEEDS_PARTITIONS: Final = (
    "sequential recurring jobs need LATER['RECURRING_SEQUENTIAL_PARTITIONS'], the "
    "partition count of their reserved topic, e.g. 8"
)


def recurring_partitions() -> int | None:
    """LATER["RECURRING_SEQUENTIAL_PARTITIONS"]: None when sequential
    recurring jobs are off."""
    count = conf.RECURRING_SEQUENTIAL_PARTITIONS
    return None if count is None else int(count)


def recurring_lane(namespace: str, identifier: str) -> PartitionLane:
    """The partition of the reserved topic that ``identifier`` runs in."""
    count = recurring_partitions()
    if count is None:
        raise ValueError(NEEDS_PARTITIONS)
    return PartitionLane(namespace, RECURRING_TOPIC, partition_for_key(identifier, count))


def registered_topics() -> dict[str, int]:
    """Every topic this configuration runs, with its partition count:
    LATER["TOPICS"], and the reserved topic when sequential recurring jobs
    are on. Registered by later_migrate and by every worker at start-up, so
    a changed count of either is caught (check later.E015)."""
    topics = dict(conf.TOPICS) if isinstance(conf.TOPICS, dict) else {}
    count = conf.RECURRING_SEQUENTIAL_PARTITIONS
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        topics[RECURRING_TOPIC] = count
    return topics
