"""The writes of every enqueue (enqueue.py, JobContext, schedules, the Tasks
backend): a built job or a batch, inserted as its kind needs, and what
follows the commit (events, a wake-up, a continuation's settling). Through
the calling thread's connection, so it commits with the caller's transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from django.db import DatabaseError, connections, transaction

from later_django import events, queue_names, registry, schema, tracing, wakeup
from later_django.builder import JobBuilder
from later_django.conf import conf
from later_django.db import dialect_for, dialect_of
from later_django.exceptions import JobNotFound
from later_django.ids import DuplicateJobId, JobId, new_job_ids
from later_django.options import EnqueueOptions
from later_django.settle import settle_on_commit
from later_django.states import Stage
from later_django.types import NewJob


def enqueue_with(payload: object, options: EnqueueOptions) -> JobId:
    """Enqueue one job of ``payload`` as ``options`` say; return its id.
    The payload is checked before anything is written (the options were
    checked when made)."""
    return insert_built(JobBuilder().build(payload, options))


def insert_built(job: NewJob) -> JobId:
    """Write one job a JobBuilder built, through the calling thread's
    connection (the Tasks backend renames a job before writing it)."""
    if tracing.enabled() and (context := tracing.current_context()):
        # The job and its trace context commit together: a worker never
        # runs it without the span it continues.
        alias = conf.database
        with transaction.atomic(using=alias):
            job_id = _insert(job)
            _record_trace(alias, [job.id], context)
        return job_id
    return _insert(job)


def _insert(job: NewJob) -> JobId:
    if job.unique_key is not None:
        return _insert_unique(job)
    if job.parent_id is not None:
        if job.parents is not None:
            return _insert_fan_in(job)
        return _insert_continuation(job)
    return _insert_one(job)


def _record_trace(alias: str, job_ids: Sequence[str], context: str) -> None:
    with connections[alias].cursor() as cursor:
        dialect_for(alias).enqueue.set_trace(cursor, job_ids, context)


def enqueue_many_with(payloads: Iterable[object], options: EnqueueOptions) -> list[JobId]:
    """Enqueue a job of every payload as ``options`` say, all or none.

    The one path of every bulk enqueue (see :func:`enqueue_many`).
    """
    payloads = list(payloads)
    if not payloads:
        return []
    ids = new_job_ids(len(payloads))
    if not options.bulk_ready or (registry.any_keyed() and _any_keyed(payloads)):
        return _enqueue_one_by_one(payloads, options, ids)
    # Built while they are written: PostgreSQL stores the first rows while the
    # next are encoded. A bad payload part-way raises inside the transaction
    # below, which rolls back to where it began: nothing is written, and an
    # enclosing atomic block stays usable (a savepoint guards it).
    jobs = JobBuilder().build_many(payloads, options, ids)
    if registry.any_unique():
        # A type gives its jobs unique keys: those are written one by one.
        listed = list(jobs)
        if any(job.unique_key is not None for job in listed):
            return _insert_one_by_one(listed, unique=True)
        jobs = iter(listed)
    built: list[NewJob] | None = None
    if events.JobEnqueued in events.listening:  # the rows are needed after the commit
        built = list(jobs)
        jobs = iter(built)
    alias = conf.database
    db = connections[alias]
    context = tracing.current_context() if tracing.enabled() else None
    try:
        with transaction.atomic(using=alias, savepoint=db.in_atomic_block):
            queued = options.queue is not None or registry.any_queue()
            dialect_for(alias).enqueue.insert_many(db, jobs, queued=queued)
            if context:
                _record_trace(alias, ids, context)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    _wake_on_commit(alias, len(ids))
    if built is not None:
        tell_on_commit(alias, built, Stage.ENQUEUED)
    return ids


def _any_keyed(payloads: list[object]) -> bool:
    """Does a payload's type have a concurrency limit? Its key is a column
    the bulk inserts do not write."""
    return any(registry.is_keyed(type(payload)) for payload in payloads)


def _enqueue_one_by_one(
    payloads: list[object], options: EnqueueOptions, ids: list[JobId]
) -> list[JobId]:
    """Jobs a bulk insert does not store (delayed, continuations, with a
    timeout, a unique key or a concurrency key): each its own insert (its
    stage follows the clock or its parent), all in one transaction. Every
    row is built before the first is written."""
    jobs = list(JobBuilder().build_many(payloads, options, ids))
    return _insert_one_by_one(jobs, unique=options.unique_key is not None or registry.any_unique())


def _insert_one_by_one(jobs: list[NewJob], *, unique: bool) -> list[JobId]:
    """Insert ``jobs`` in one transaction; return their ids in their order.

    ``unique``: some may have a unique key. Those are inserted in (type,
    key) order, so two batches of the same keys wait for each other rather
    than deadlock on PostgreSQL."""
    alias = conf.database
    with transaction.atomic(using=alias, savepoint=connections[alias].in_atomic_block):
        if not unique:
            return [insert_built(job) for job in jobs]
        written = {i: insert_built(jobs[i]) for i in _key_order(jobs)}
    return [written[i] for i in range(len(jobs))]


def _key_order(jobs: list[NewJob]) -> list[int]:
    """The positions of ``jobs`` in the order to insert them: the unique
    ones sorted by (type, key) into the places of the unique ones (a stable
    sort: of one key, the first in the caller's order takes it), the others
    in their own places."""
    keyed = [i for i, job in enumerate(jobs) if job.unique_key is not None]
    by_key = iter(sorted(keyed, key=lambda i: (jobs[i].type_name, jobs[i].unique_key or "")))
    return [next(by_key) if job.unique_key is not None else i for i, job in enumerate(jobs)]


def _wake_on_commit(alias: str, count: int = 1) -> None:
    if wakeup.has_listeners():
        transaction.on_commit(functools.partial(wakeup.wake, count), using=alias)


def tell_on_commit(alias: str, jobs: Sequence[NewJob], stage: str) -> None:
    """Tell events subscribers of ``jobs`` once their transaction commits."""

    def tell() -> None:
        for job in jobs:
            events.emit(
                events.JobEnqueued(
                    job.id, job.type_name, stage, job.namespace, queue_names.name_of(job.queue)
                )
            )

    transaction.on_commit(tell, using=alias)


def _insert_one(job: NewJob) -> JobId:
    alias = conf.database
    db = connections[alias]
    try:
        stage = dialect_of(db).enqueue.insert_one(db, job, prepare=conf.prepared_statements)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    if stage == Stage.ENQUEUED:
        _wake_on_commit(alias)
    if events.JobEnqueued in events.listening:
        tell_on_commit(alias, [job], stage)
    return JobId(job.id)


def _insert_continuation(job: NewJob) -> JobId:
    alias = conf.database
    dialect = dialect_for(alias)
    retention = conf.millis("DASHBOARD_RETENTION")
    try:
        with connections[alias].cursor() as cursor:
            stage = dialect.enqueue.insert_continuation(cursor, job, retention)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    if stage is None:
        raise JobNotFound(_missing_parents([job.parent_id or ""], job.namespace))
    return _written(alias, job, stage)


def _insert_unique(job: NewJob) -> JobId:
    """Write ``job`` unless another job holds its unique key; return its
    id, or the holder's (a DuplicateJobId) when it was not written."""
    alias = conf.database
    retention = conf.millis("DASHBOARD_RETENTION")
    try:
        with connections[alias].cursor() as cursor:
            inserted = dialect_for(alias).enqueue.insert_unique(cursor, job, retention)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    if inserted is None:
        raise JobNotFound(_missing_parents([job.parent_id or ""], job.namespace))
    stage = inserted.stage
    if stage is None:
        if events.JobDuplicate in events.listening:
            queue = queue_names.name_of(job.queue)
            events.emit(events.JobDuplicate(inserted.job_id, job.type_name, job.namespace, queue))
        return DuplicateJobId(inserted.job_id)
    return _written(alias, job, stage)


def _insert_fan_in(job: NewJob) -> JobId:
    alias = conf.database
    dialect = dialect_for(alias)
    retention = conf.millis("DASHBOARD_RETENTION")
    try:
        # The parent list and the row commit together, or neither: a child
        # without its list would wait on one parent only.
        with (
            transaction.atomic(using=alias, savepoint=False),
            connections[alias].cursor() as cursor,
        ):
            inserted = dialect.enqueue.insert_fan_in(cursor, job, retention)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    stage = inserted.stage
    if stage is None:
        raise JobNotFound(_missing_parents(inserted.missing, job.namespace))
    return _written(alias, job, stage, fan_in=True)


def _written(alias: str, job: NewJob, stage: str, *, fan_in: bool = False) -> JobId:
    """What follows the insert of a continuation or a unique job once it
    was written in ``stage``: events, a wake-up, or its settling after the
    commit."""
    if events.JobEnqueued in events.listening:
        tell_on_commit(alias, [job], stage)
    if stage == Stage.ENQUEUED:
        _wake_on_commit(alias)
    elif stage == Stage.WAITING:
        wake = functools.partial(wakeup.wake, 1)
        settle_on_commit(alias, job.id, wake=wake, fan_in=fan_in)
    return JobId(job.id)


def _missing_parents(missing: Sequence[str], namespace: str) -> str:
    """The message of JobNotFound for the parents ``missing`` of a fan-in job."""
    if len(missing) == 1:
        return (
            f"parent job {missing[0]} does not exist in namespace {namespace!r} "
            "(it may have expired); nothing was written"
        )
    return (
        f"parent jobs {', '.join(missing)} do not exist in namespace {namespace!r} "
        "(they may have expired); nothing was written"
    )
