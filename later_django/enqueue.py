"""The public write API: enqueue jobs in every form, and cancel them.

Every call writes through the LATER database connection of the calling
thread, so inside ``transaction.atomic()`` it commits or rolls back with the
caller's own writes. All input is validated before anything is written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from later_django import codec, registry, schema, wakeup
from later_django.clock import from_datetime, now_ms
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.exceptions import JobNotFound, PayloadTooLarge, TransactionRequired
from later_django.ids import JobId, as_job_id, new_job_id, new_job_ids
from later_django.states import Stage
from later_django.types import NewJob

logger = logging.getLogger(__name__)

MIN_PRIORITY, MAX_PRIORITY = -100, 100
# The last time a job may become due: later dates do not fit in a datetime.
LATEST_RUN_AT_MS = int(dt.datetime(9999, 12, 30, tzinfo=dt.UTC).timestamp() * 1000)


def _check_priority(priority: object) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"priority={priority} is out of range; use {MIN_PRIORITY}..{MAX_PRIORITY} "
            "(higher runs first)"
        )
    return priority


def _check_delay(delay: object) -> int:
    if not isinstance(delay, dt.timedelta):
        raise TypeError(f"delay must be a datetime.timedelta, got {type(delay).__name__}")
    if delay < dt.timedelta(0):
        raise ValueError(f"delay={delay!r} is negative; use a timedelta >= 0")
    return int(delay.total_seconds() * 1000)


class _Builder:
    """Turns payloads into job rows; settings and per-type facts are read once
    per call, so a batch of thousands pays for them once."""

    def __init__(self) -> None:
        self.namespace = conf.namespace
        self.limit = int(conf.MAX_PAYLOAD_BYTES)
        # type -> (handler, its stored retry policy as JSON)
        self._types: dict[type[Any], tuple[registry.Handler, str | None]] = {}

    def build(
        self,
        payload: object,
        *,
        job_id: str,
        priority: int,
        parent_id: str | None = None,
        run_at_ms: int | None = None,
        delay_ms: int = 0,
    ) -> NewJob:
        handler, policy = self._type_facts(payload)
        try:
            # Refuse now what the worker could not decode later (e.g. a str in
            # an int field), instead of storing a job that can only fail.
            data = codec.encode_checked(payload, handler.payload_type)
        except codec.PayloadDecodeError as exc:
            raise TypeError(
                f"{exc.args[0]} — the value does not match the annotation of "
                f"{handler.payload_type.__qualname__}"
            ) from exc
        if len(data) > self.limit:
            raise PayloadTooLarge(
                f"payload of {handler.name} encodes to {len(data)} bytes, above "
                f"LATER['MAX_PAYLOAD_BYTES']={self.limit}; store large data elsewhere and "
                "pass a reference"
            )
        return NewJob(
            id=job_id,
            namespace=self.namespace,
            type_name=handler.name,
            payload=data,
            priority=priority,
            retry_policy=policy,
            parent_id=parent_id,
            run_at_ms=run_at_ms,
            delay_ms=delay_ms,
        )

    def _type_facts(self, payload: object) -> tuple[registry.Handler, str | None]:
        facts = self._types.get(type(payload))
        if facts is None:
            if not dataclasses.is_dataclass(payload) or isinstance(payload, type):
                raise TypeError(
                    f"payload must be a dataclass instance, got {type(payload).__name__}; "
                    "declare the payload type with @dataclass and register a @job handler "
                    "for it"
                )
            handler = registry.handler_for_payload(payload)
            policy = handler.static_policy()
            facts = self._types[type(payload)] = (handler, policy.to_json() if policy else None)
        return facts


def _build(
    payload: object,
    *,
    priority: int,
    parent_id: str | None = None,
    run_at_ms: int | None = None,
    delay_ms: int = 0,
) -> NewJob:
    # The id's time part is this host's clock: ids stay unique and roughly
    # ordered whatever the clock; every stored time is the database's.
    return _Builder().build(
        payload,
        job_id=new_job_id(),
        priority=priority,
        parent_id=parent_id,
        run_at_ms=run_at_ms,
        delay_ms=delay_ms,
    )


def _wake_on_commit(alias: str) -> None:
    if wakeup.has_listeners():
        transaction.on_commit(wakeup.wake, using=alias)


def _insert_one(job: NewJob) -> JobId:
    alias = conf.database
    try:
        stage = dialect_for(alias).job_insert_one(connections[alias], job)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    if stage == Stage.ENQUEUED:
        _wake_on_commit(alias)
    return JobId(job.id)


def enqueue(payload: object, *, priority: int = 0) -> JobId:
    """Enqueue ``payload`` to run as soon as a worker is free."""
    return _insert_one(_build(payload, priority=_check_priority(priority)))


def enqueue_in(payload: object, *, priority: int = 0) -> JobId:
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
    return enqueue(payload, priority=priority)


async def aenqueue_in(payload: object, *, priority: int = 0) -> JobId:
    """Enqueue like :func:`enqueue_in`, from async code.

    Async code cannot open ``transaction.atomic()``, so this raises
    TransactionRequired unless the sync thread its database work runs in
    holds an atomic block: only when the coroutine runs under
    ``async_to_sync`` called inside one. Otherwise call ``enqueue_in`` in a
    sync function run with ``sync_to_async``, or use ``aenqueue``.
    """
    return await _aenqueue_in(payload, priority)


@sync_to_async
def _aenqueue_in(payload: object, priority: int) -> JobId:
    alias = conf.database
    if not connections[alias].in_atomic_block:
        raise TransactionRequired(
            f"aenqueue_in() found no open transaction.atomic(using={alias!r}) block, and "
            "async code cannot hold one: Django's atomic blocks are sync only. Put your "
            "writes and enqueue_in() in one sync function and await it with "
            "sync_to_async(), or use aenqueue() when the job need not commit with "
            "other writes"
        )
    return enqueue(payload, priority=priority)


def enqueue_many(payloads: Iterable[object], *, priority: int = 0) -> list[JobId]:
    """Enqueue every payload, all or none; one round trip per batch of rows.

    Returns the ids in the order of ``payloads``. A bad payload raises the
    error ``enqueue`` would, its message prefixed with ``payloads[<index>]: ``,
    and nothing is written.
    """
    _check_priority(priority)
    payloads = list(payloads)
    if not payloads:
        return []
    ids = new_job_ids(len(payloads))
    # Built while they are written: PostgreSQL stores the first rows while the
    # next are encoded. A bad payload part-way raises inside the transaction
    # below, which rolls back to where it began: nothing is written, and an
    # enclosing atomic block stays usable (a savepoint guards it).
    jobs = _build_many(payloads, ids, priority)
    alias = conf.database
    db = connections[alias]
    try:
        with transaction.atomic(using=alias, savepoint=db.in_atomic_block):
            dialect_for(alias).job_insert_many(db, jobs)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    _wake_on_commit(alias)
    return ids


def _build_many(payloads: list[object], ids: list[JobId], priority: int) -> Iterator[NewJob]:
    builder = _Builder()
    for index, (payload, job_id) in enumerate(zip(payloads, ids, strict=True)):
        try:
            job = builder.build(payload, job_id=job_id, priority=priority)
        except (TypeError, ValueError) as exc:
            # The same error, of the same class, saying which item it is about.
            exc.args = (f"payloads[{index}]: {exc}",)
            raise
        yield job


def enqueue_delayed(payload: object, delay: dt.timedelta, *, priority: int = 0) -> JobId:
    """Enqueue ``payload`` to run at or after ``delay`` from now (the
    database's now, whatever this host's clock says)."""
    delay_ms = _check_delay(delay)
    _check_latest(now_ms() + delay_ms)
    job = _build(payload, priority=_check_priority(priority), delay_ms=delay_ms)
    return _insert_one(job)


def enqueue_delayed_at(payload: object, when: dt.datetime, *, priority: int = 0) -> JobId:
    """Enqueue ``payload`` to run at or after ``when`` (an aware datetime)."""
    run_at = _check_latest(from_datetime(when, argument="when"))
    job = _build(payload, priority=_check_priority(priority), run_at_ms=run_at)
    return _insert_one(job)


def _check_latest(run_at_ms: int) -> int:
    if run_at_ms > LATEST_RUN_AT_MS:
        raise ValueError(
            "the job would become due after 9999-12-30, which no datetime can "
            "represent; use a shorter delay or an earlier time"
        )
    return run_at_ms


def enqueue_continue(parent: str, payload: object, *, priority: int = 0) -> JobId:
    """Enqueue ``payload`` to run once job ``parent`` succeeds.

    If the parent already succeeded the job is ready at once; if it failed or
    was cancelled the job is stored as failed with reason ``parent failed``.
    Raises JobNotFound, writing nothing, when ``parent`` does not exist.
    """
    parent_id = as_job_id(parent, argument="parent")
    job = _build(payload, priority=_check_priority(priority), parent_id=parent_id)
    alias = conf.database
    dialect = dialect_for(alias)
    retention = conf.millis("DASHBOARD_RETENTION")
    try:
        with connections[alias].cursor() as cursor:
            stage = dialect.job_insert_continuation(cursor, job, retention)
    except DatabaseError as exc:
        schema.raise_if_not_migrated(alias, exc)
        raise
    if stage is None:
        raise JobNotFound(
            f"parent job {parent_id} does not exist in namespace "
            f"{conf.namespace!r} (it may have expired)"
        )
    if stage == Stage.ENQUEUED:
        _wake_on_commit(alias)
    elif stage == Stage.WAITING and not dialect.single_writer:
        transaction.on_commit(
            functools.partial(_settle_child, alias, job.id, retention), using=alias
        )
    return JobId(job.id)


def _settle_child(alias: str, job_id: str, retention_ms: int) -> None:
    """After a continuation commits, release or fail it if its parent
    finished meanwhile.

    The continuation was inserted without locking its parent (a caller's
    open transaction must not hold up the parent's renewal or completion),
    so a parent that finished before the commit could not see the child."""
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            settled = dialect_for(alias).job_settle_child(
                cursor, job_id=job_id, retention_ms=retention_ms
            )
    except DatabaseError as exc:
        # The maintenance's orphan sweep resolves it within a tick.
        logger.warning(
            "could not check the parent of continuation %s: %s",
            job_id,
            exc,
            extra={"action": "settle_child_error", "job_id": job_id},
        )
        return
    if settled == "released":
        wakeup.wake()


def cancel(job_id: str) -> bool:
    """Cancel a job that has not started; return whether it was cancelled.

    Jobs waiting on it as continuations are failed with ``parent failed``.
    A running or finished job is left as it is and False is returned.
    """
    job_id = as_job_id(job_id)
    alias = conf.database
    retention = conf.millis("DASHBOARD_RETENTION")
    try:
        with (
            transaction.atomic(using=alias, savepoint=False),
            connections[alias].cursor() as cursor,
        ):
            return dialect_for(alias).job_cancel(
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
acancel = sync_to_async(cancel)
