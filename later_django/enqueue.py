"""The public write API: enqueue jobs in every form, and cancel them.

Every call writes through the LATER database connection of the calling
thread, so inside ``transaction.atomic()`` it commits or rolls back with the
caller's own writes. All input is validated before anything is written:
each call makes one EnqueueOptions and takes one path, ``enqueue_with`` or
``enqueue_many_with``, whose rows JobBuilder builds.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Sequence
from typing import Unpack

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from later_django import events, queues, registry, schema, tracing, wakeup
from later_django.builder import JobBuilder
from later_django.conf import conf
from later_django.db import dialect_for, dialect_of
from later_django.exceptions import JobNotFound, TransactionRequired
from later_django.ids import DuplicateJobId, JobId, as_job_id, new_job_ids
from later_django.options import (
    AFTER_IS_PARENT,
    AFTER_IS_PARENTS,
    AT_IS_WHEN,
    EnqueueKeywords,
    EnqueueOptions,
    check_one_parent,
    keyword_options,
)
from later_django.settle import settle_on_commit
from later_django.states import Stage
from later_django.types import NewJob


def enqueue(
    payload: object,
    *,
    priority: int | None = None,
    delay: dt.timedelta | None = None,
    at: dt.datetime | None = None,
    after: str | Iterable[str] | None = None,
    timeout: dt.timedelta | None = None,
    queue: str | None = None,
    unique_key: str | None = None,
    unique_for: dt.timedelta | None = None,
) -> JobId:
    """Enqueue ``payload``; return its id.

    With no keyword the job runs as soon as a worker is free. ``priority``
    (-100..100, higher first; default: the type's ``@job(priority=...)``,
    else 0); ``delay`` (a timedelta, counted from the database's now) or
    ``at`` (an aware datetime): due then; ``after`` (a job id, or a list of
    them): a continuation, due once every one of them succeeded, failed with
    ``parent failed`` if one fails or is cancelled (JobNotFound, nothing
    written, when one does not exist; docs/how-to/fan-in.md); ``timeout`` (a
    timedelta): how long one attempt may run
    (default: the type's ``@job(timeout=...)``, else no limit); ``queue``:
    the named queue it runs on (default: the type's ``@job(queue=...)``, else
    "default"; ValueError naming LATER["QUEUES"] when it is not declared there).
    ``unique_key`` (a str; default: the type's ``@job(unique_key=...)``):
    while an unfinished job of the type holds the key, nothing is written
    and that job's id is returned, its ``duplicate`` True; ``unique_for`` (a
    timedelta) widens that to any job of the key enqueued in the same window
    of that length, finished ones included (docs/how-to/unique-jobs.md).
    Keywords that conflict (``delay`` and ``at``; either with ``after``) raise TypeError
    naming both, and nothing is written.
    """
    options = keyword_options(
        priority=priority,
        delay=delay,
        at=at,
        after=after,
        timeout=timeout,
        queue=queue,
        unique_key=unique_key,
        unique_for=unique_for,
    )
    return enqueue_with(payload, options)


def enqueue_in(payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
    """Enqueue like :func:`enqueue`, but only inside ``transaction.atomic()``.

    Raises TransactionRequired when no atomic block is open on the LATER
    database, so the job can only exist if the caller's transaction commits.
    """
    alias = conf.database
    if not connections[alias].in_atomic_block:
        raise TransactionRequired(
            f"enqueue_in() needs an open transaction.atomic(using={alias!r}) block; "
            "use enqueue() to write outside a transaction"
        )
    return enqueue_with(payload, keyword_options(**options))


async def aenqueue_in(payload: object, **options: Unpack[EnqueueKeywords]) -> JobId:
    """Enqueue like :func:`enqueue_in`, from async code.

    Async code cannot open ``transaction.atomic()``, so this raises
    TransactionRequired unless the sync thread its database work runs in
    holds an atomic block: only when the coroutine runs under
    ``async_to_sync`` called inside one. Otherwise call ``enqueue_in`` in a
    sync function run with ``sync_to_async``, or use ``aenqueue``.
    """
    return await _aenqueue_in(payload, keyword_options(**options))


@sync_to_async
def _aenqueue_in(payload: object, options: EnqueueOptions) -> JobId:
    alias = conf.database
    if not connections[alias].in_atomic_block:
        raise TransactionRequired(
            f"aenqueue_in() found no open transaction.atomic(using={alias!r}) block, and "
            "async code cannot hold one: Django's atomic blocks are sync only. Put your "
            "writes and enqueue_in() in one sync function and await it with "
            "sync_to_async(), or use aenqueue() when the job need not commit with "
            "other writes"
        )
    return enqueue_with(payload, options)


def enqueue_many(payloads: Iterable[object], **options: Unpack[EnqueueKeywords]) -> list[JobId]:
    """Enqueue every payload, all or none, with :func:`enqueue`'s keywords.

    Returns the ids in the order of ``payloads``. A bad payload raises the
    error ``enqueue`` would, its message prefixed with ``payloads[<index>]: ``,
    and nothing is written. Ready jobs take one round trip per batch of
    rows; delayed jobs, continuations and unique jobs one per job, in one
    transaction. A unique job whose key was held is not written: its place
    holds the holder's id, whose ``duplicate`` is True. Unique jobs are
    inserted in the order of their type and key, so two batches of the same
    keys never deadlock (docs/how-to/unique-jobs.md).
    """
    return enqueue_many_with(payloads, keyword_options(**options))


# The reference's calls, kept as wrappers of enqueue's keywords. Their
# arguments are required: enqueue_delayed(p, None) is a bad delay.
def enqueue_delayed(payload: object, delay: dt.timedelta, *, priority: int | None = None) -> JobId:
    """``enqueue(payload, delay=delay)``: due ``delay`` from the database's now."""
    return enqueue_with(payload, EnqueueOptions(priority=priority, delay=delay))


def enqueue_delayed_at(payload: object, when: dt.datetime, *, priority: int | None = None) -> JobId:
    """``enqueue(payload, at=when)``: due at ``when`` (an aware datetime)."""
    return enqueue_with(payload, EnqueueOptions(priority=priority, at=when, names=AT_IS_WHEN))


def enqueue_continue(parent: str, payload: object, *, priority: int | None = None) -> JobId:
    """``enqueue(payload, after=parent)``: due once job ``parent`` succeeds.

    If the parent already succeeded the job is ready at once; if it failed or
    was cancelled the job is stored as failed with reason ``parent failed``.
    Raises JobNotFound, writing nothing, when ``parent`` does not exist.
    """
    check_one_parent(parent, "enqueue_continue_all(parents, payload)")
    return enqueue_with(
        payload, EnqueueOptions(priority=priority, after=parent, names=AFTER_IS_PARENT)
    )


def enqueue_continue_all(
    parents: Iterable[str], payload: object, *, priority: int | None = None
) -> JobId:
    """``enqueue(payload, after=parents)``: due once every job of ``parents``
    succeeded (a fan-in, docs/how-to/fan-in.md).

    It runs once, after the last of them. If one fails or is cancelled the
    job is failed with reason ``parent failed`` and never runs. Parents that
    all succeeded already: ready at once. Raises JobNotFound, writing
    nothing, when one of them does not exist; TypeError for a string or
    another value that is not a list of job ids, ValueError for an empty
    list. A parent named twice counts once; one parent is a plain
    continuation, as ``enqueue_continue``.
    """
    if isinstance(parents, str):
        raise TypeError(
            "parents must be a list of job ids, got a str; for one parent use "
            "enqueue_continue(parent, payload)"
        )
    return enqueue_with(
        payload, EnqueueOptions(priority=priority, after=parents, names=AFTER_IS_PARENTS)
    )


def enqueue_with(payload: object, options: EnqueueOptions) -> JobId:
    """Enqueue one job of ``payload`` as ``options`` say; return its id.

    The one path of every single enqueue: the public calls above (and so
    JobContext's) make their options and call this, and so do internal
    callers such as schedules and the Tasks backend. The payload is checked
    before anything is written; the options were checked when made.
    """
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

    ``unique``: some may have a unique key. Those are inserted in the order
    of their (type, key): two batches of the same keys take them in one
    order, and one waits for the other rather than each for a key the other
    holds (a deadlock on PostgreSQL). Ids and their order are the jobs'."""
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
                    job.id, job.type_name, stage, job.namespace, queues.name_of(job.queue)
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
            queue = queues.name_of(job.queue)
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


def cancel(job_id: str) -> bool:
    """Cancel a job; return whether it was cancelled or asked to stop.

    A job that has not started is cancelled at once, and the jobs waiting on
    it as continuations fail with ``parent failed``. A running job is asked
    to stop: the server running it finds the request within a second,
    cancels its async handler or sets a sync one's ``ctx.cancel_requested``,
    and the job ends ``cancelled`` (never retried), its waiting
    continuations failed with ``parent cancelled``. A finished job is left
    as it is and False is returned.
    """
    job_id = as_job_id(job_id)
    alias = conf.database
    retention = conf.millis("DASHBOARD_RETENTION")
    dialect = dialect_for(alias)
    try:
        with (
            transaction.atomic(using=alias, savepoint=False),
            connections[alias].cursor() as cursor,
        ):
            return dialect.control.cancel(
                cursor, namespace=conf.namespace, job_id=job_id, retention_ms=retention
            )
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise


aenqueue = sync_to_async(enqueue)
aenqueue_many = sync_to_async(enqueue_many)
aenqueue_delayed = sync_to_async(enqueue_delayed)
aenqueue_delayed_at = sync_to_async(enqueue_delayed_at)
aenqueue_continue = sync_to_async(enqueue_continue)
aenqueue_continue_all = sync_to_async(enqueue_continue_all)
acancel = sync_to_async(cancel)
