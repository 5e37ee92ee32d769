"""The public calls of sequential partition mode: enqueue into a topic's
partitions, and what operators do to a partition (docs/how-to/partitions.md).
A job takes its partition's next sequence in the caller's transaction, from
a counter row locked until it ends: sequences are gapless and commit in order.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any, Unpack

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from later_django import events, registry, schema, wakeup
from later_django.builder import JobBuilder
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.db.rows import HeadFailure, PartitionSlot
from later_django.exceptions import JobNotFound, TransactionRequired, UnknownTopic
from later_django.ids import JobId, as_job_id
from later_django.job_writes import tell_on_commit
from later_django.options import (
    AFTER_IS_PARENT,
    EnqueueKeywords,
    EnqueueOptions,
    check_one_parent,
    keyword_options,
)
from later_django.partitions.hashing import partition_for_key
from later_django.partitions.reserved import RECURRING_TOPIC, recurring_partitions
from later_django.settle import settle_on_commit
from later_django.states import Stage
from later_django.types import NewJob, PartitionLane, PartitionStats

FORCE_FAILED = "force-failed: the partition head was failed by force_fail_partition_head"


def enqueue_to_partition(payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
    """Enqueue ``payload`` at the end of its partition: it runs once every
    earlier job of the partition has finished, one at a time, in order.

    Takes enqueue()'s keywords: a delayed head (``delay``, ``at``) or one
    waiting for a parent (``after``) blocks the jobs after it until it has
    run. The type's ``@job(topic=...)`` and ``partition_key()`` pick the
    partition. TypeError for a type without a topic, UnknownTopic for one
    missing from LATER["TOPICS"]; nothing is written then."""
    return _enqueue(payload, keyword_options(**options))


def enqueue_to_partition_delayed(
    payload: object, delay: dt.timedelta, *, priority: int | None = None
) -> JobId:
    """``enqueue_to_partition(payload, delay=delay)``."""
    return _enqueue(payload, EnqueueOptions(priority=priority, delay=delay))


def enqueue_continue_to_partition(
    parent: str, payload: object, *, priority: int | None = None
) -> JobId:
    """``enqueue_to_partition(payload, after=parent)``. A parent that fails or
    is cancelled fails it with ``parent failed``."""
    check_one_parent(parent, "enqueue_to_partition(payload, after=[...])")
    return _enqueue(payload, EnqueueOptions(priority=priority, after=parent, names=AFTER_IS_PARENT))


def enqueue_to_partition_in(payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
    """Enqueue like :func:`enqueue_to_partition`, but only inside
    ``transaction.atomic()`` on the LATER database (else TransactionRequired)."""
    alias = conf.database
    if not connections[alias].in_atomic_block:
        raise TransactionRequired(
            f"enqueue_to_partition_in() needs an open transaction.atomic(using={alias!r}) "
            "block; use enqueue_to_partition() to write outside a transaction"
        )
    return _enqueue(payload, keyword_options(**options))


def lane_of(payload: object) -> PartitionLane:
    """The partition ``payload`` goes to, checked before anything is written."""
    handler = registry.handler_for_payload(payload)
    topic = handler.topic
    if topic is None:
        raise TypeError(
            f"{handler.name} has no topic: enqueue it with enqueue(), or give its @job a "
            "topic=... to run its jobs in partition order"
        )
    return PartitionLane(conf.namespace, topic, partition_of(topic, payload.partition_key()))  # type: ignore[attr-defined]


def partition_of(topic: str, key: Any) -> int:
    count = topic_partitions(topic)
    try:
        return partition_for_key(key, count)
    except TypeError as exc:
        raise TypeError(f"partition_key() of a {topic!r} job: {exc}") from exc


def topic_partitions(topic: str) -> int:
    """The partition count of ``topic`` in LATER["TOPICS"] (or of the
    reserved topic of sequential recurring jobs)."""
    if topic == RECURRING_TOPIC:
        reserved = recurring_partitions()
        if reserved is not None:
            return reserved
    topics = conf.TOPICS if isinstance(conf.TOPICS, dict) else {}
    count = topics.get(topic)
    if count is None:
        raise UnknownTopic(
            f"topic {topic!r} is not registered: add it to LATER['TOPICS'] with its "
            f"partition count, e.g. LATER['TOPICS'] = {{{topic!r}: 8}}, and run "
            "manage.py later_migrate"
        )
    return int(count)


def _enqueue(payload: object, options: EnqueueOptions) -> JobId:
    lane = lane_of(payload)
    return insert_into(lane, JobBuilder(partitioned=True).build(payload, options))


def enqueue_recurring_continue(
    parent: str, payload: object, *, priority: int | None = None
) -> JobId:
    """Chain ``payload`` to ``parent``, an occurrence of a sequential
    recurring job (or a job chained to one): it runs once the parent
    succeeded, in the parent's partition of the reserved topic, so the
    schedule's next occurrence waits for it too."""
    # Its partition is its parent's: it has one.
    check_one_parent(parent, "enqueue_to_partition(payload, after=[...]) with a topic")
    options = EnqueueOptions(priority=priority, after=parent, names=AFTER_IS_PARENT)
    job = JobBuilder().build(payload, options)
    alias = conf.database
    assert options.parent_id is not None
    with connections[alias].cursor() as c:
        place = dialect_for(alias).partitions.place_of(
            c, namespace=conf.namespace, job_id=options.parent_id
        )
    if place is None:
        raise JobNotFound(
            f"parent job {parent} does not exist in namespace {conf.namespace!r} "
            "(it may have expired)"
        )
    if place.topic != RECURRING_TOPIC or place.partition is None:
        raise ValueError(
            f"job {parent} is not an occurrence of a sequential recurring job (nor chained "
            "to one): chain to it with enqueue_continue(), or to a partition job with "
            "enqueue_continue_to_partition()"
        )
    return insert_into(PartitionLane(conf.namespace, RECURRING_TOPIC, place.partition), job)


def insert_into(lane: PartitionLane, job: NewJob) -> JobId:
    """Write ``job`` at the next sequence of ``lane``'s partition, in the
    calling thread's transaction (its own outside an atomic block)."""
    alias = conf.database
    db = connections[alias]
    dialect = dialect_for(alias)
    retention = conf.millis("DASHBOARD_RETENTION")
    # Only a continuation can be refused once its sequence is taken (its
    # parent is unknown): inside the caller's block it gets a savepoint, so
    # the refusal rolls its sequence back and the caller's block stays
    # usable. Other jobs take none: a savepoint costs two round trips.
    savepoint = job.parent_id is not None and db.in_atomic_block
    try:
        with transaction.atomic(using=alias, savepoint=savepoint), db.cursor() as c:
            slot = PartitionSlot(lane, dialect.partitions.partition_next_sequence(c, lane))
            stage = dialect.partitions.insert_partitioned(c, job, slot, retention)
            if stage is None and job.parents is not None:
                raise JobNotFound(
                    f"one of the parent jobs {', '.join(job.parents)} does not exist in "
                    f"namespace {job.namespace!r} (it may have expired); nothing was written"
                )
            if stage is None:
                raise JobNotFound(
                    f"parent job {job.parent_id} does not exist in namespace "
                    f"{job.namespace!r} (it may have expired)"
                )
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    if stage == Stage.ENQUEUED:
        transaction.on_commit(wakeup.wake_partitions, using=alias)
    elif stage == Stage.WAITING:
        fan_in = job.parents is not None
        settle_on_commit(alias, job.id, wake=wakeup.wake_partitions, fan_in=fan_in)
    if events.JobEnqueued in events.listening:
        tell_on_commit(alias, [job], stage)
    return JobId(job.id)


def force_fail_partition_head(
    topic: str, partition: int, *, job_id: str | None = None
) -> JobId | None:
    """Fail the head of a partition now, whatever its stage and retries left,
    so the jobs after it run; return its id, or None when the partition has
    no unfinished job. A handler running it loses its lease (its outcome is
    discarded); its waiting continuations fail with ``parent failed``.

    With ``job_id``, the head is failed only if it is that job (None
    otherwise): the poison job an operator saw, not the next one should it
    have finished meanwhile."""
    lane = _lane(topic, partition)
    failure = HeadFailure(
        lane=lane,
        error=FORCE_FAILED,
        retention_ms=conf.millis("DASHBOARD_RETENTION"),
        job_id=None if job_id is None else as_job_id(job_id),
    )
    alias = conf.database
    with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as c:
        job_id = dialect_for(alias).partitions.partition_force_fail_head(c, failure)
    if job_id is not None:
        transaction.on_commit(wakeup.wake_partitions, using=alias)
    return None if job_id is None else JobId(job_id)


def truncate_partition_history(topic: str, partition: int, keep: int) -> int:
    """Delete the finished jobs of a partition but the newest ``keep``;
    return how many were deleted. Unfinished jobs are never touched."""
    if type(keep) is not int or keep < 0:
        raise ValueError(f"keep must be an int >= 0 (how many finished jobs to keep), got {keep!r}")
    lane = _lane(topic, partition)
    alias = conf.database
    with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as c:
        return dialect_for(alias).partitions.partition_truncate_history(c, lane, keep)


def partition_stats() -> list[PartitionStats]:
    """Depth, head and owner of every partition of the namespace's
    registered topics, those that never had a job included (depth 0, no
    head), and of any other partition that had one: an index probe per
    partition, cheap at any backlog."""
    alias = conf.database
    with connections[alias].cursor() as c:
        return dialect_for(alias).partitions.partition_stats(c, namespace=conf.namespace)


def _lane(topic: str, partition: int) -> PartitionLane:
    count = topic_partitions(topic)
    if type(partition) is not int or not 0 <= partition < count:
        raise ValueError(
            f"partition must be an int in 0..{count - 1} (topic {topic!r} has {count} "
            f"partitions), got {partition!r}"
        )
    return PartitionLane(conf.namespace, topic, partition)


aenqueue_to_partition = sync_to_async(enqueue_to_partition)
aenqueue_to_partition_delayed = sync_to_async(enqueue_to_partition_delayed)
aenqueue_continue_to_partition = sync_to_async(enqueue_continue_to_partition)
aenqueue_recurring_continue = sync_to_async(enqueue_recurring_continue)
aforce_fail_partition_head = sync_to_async(force_fail_partition_head)
atruncate_partition_history = sync_to_async(truncate_partition_history)
apartition_stats = sync_to_async(partition_stats)


async def aenqueue_to_partition_in(payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
    """Enqueue like :func:`enqueue_to_partition_in`, from async code: only
    when the sync thread its database work runs in holds an atomic block."""
    return await sync_to_async(functools.partial(enqueue_to_partition_in, **options))(payload)
