"""The public write API: enqueue jobs in every form, and cancel them.

Every call writes through the calling thread's LATER connection, so it
commits or rolls back with the caller's transaction, and makes one
EnqueueOptions (all input checked first) for job_writes.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Unpack

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from later_django import schema
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.exceptions import TransactionRequired
from later_django.ids import JobId, as_job_id
from later_django.job_writes import enqueue_many_with, enqueue_with
from later_django.options import (
    AFTER_IS_PARENT,
    AFTER_IS_PARENTS,
    AT_IS_WHEN,
    EnqueueKeywords,
    EnqueueOptions,
    check_one_parent,
    keyword_options,
)


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
    (-100..100, higher first), ``delay`` or ``at`` (due later), ``after`` (a
    continuation or fan-in), ``timeout`` (per attempt), ``queue``,
    ``unique_key`` and ``unique_for`` (a duplicate returns the holder's id);
    the type's ``@job(...)`` gives the defaults. Bad or conflicting keywords
    raise before anything is written. Every keyword: docs/reference/enqueue.md.
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

    Returns the ids in the order of ``payloads`` (a held unique key: the
    holder's id, its ``duplicate`` True). A bad payload raises the error
    ``enqueue`` would, its message prefixed with ``payloads[<index>]:``,
    and nothing is written. Ready jobs take one round trip per batch;
    delayed jobs, continuations and unique jobs one each, in one transaction.
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

    If one fails or is cancelled the job fails with ``parent failed``.
    JobNotFound (nothing written) when one does not exist; TypeError for
    anything but a list of job ids, ValueError for an empty one. A parent
    named twice counts once.
    """
    if isinstance(parents, str):
        raise TypeError(
            "parents must be a list of job ids, got a str; for one parent use "
            "enqueue_continue(parent, payload)"
        )
    return enqueue_with(
        payload, EnqueueOptions(priority=priority, after=parents, names=AFTER_IS_PARENTS)
    )


def cancel(job_id: str) -> bool:
    """Cancel a job; return whether it was cancelled or asked to stop.

    A job that has not started is cancelled at once. A running job is asked
    to stop: within a second its server cancels an async handler or sets a
    sync one's ``ctx.cancel_requested``, and it ends ``cancelled``, never
    retried. Its waiting continuations fail. A finished job: False.
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
