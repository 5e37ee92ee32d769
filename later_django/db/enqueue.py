"""The enqueue store (``dialect.enqueue``): every insert of a ``later_job``
row — one, many, a continuation, a unique job, a fan-in child and its
parent list — the settling of a child after its commit, and the trace
context recorded on new jobs.

The single and bulk inserts differ per vendor and are abstract; the others
run here, once, for both. What a finished parent does to its waiting
children is db/descendants.py's, which settling runs as the orphan sweep
does.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.db.descendants import resolve_fan_in, resolve_orphan
from later_django.db.rows import ExtraColumns, FanInInsert, Orphan
from later_django.db.sql import Statement
from later_django.db.sql import enqueue as enqueue_sql
from later_django.db.statements import Operations
from later_django.exceptions import LaterBusy
from later_django.states import TERMINAL, Stage
from later_django.types import NewJob

Settled = Literal["released", "failed", "waiting"]
# How often a unique enqueue tries again when the key it found taken was
# freed before it could read the holder: each time another enqueue took it
# meanwhile, so more than a few means a key churned by many at once.
UNIQUE_TRIES = 5
# Ids per statement when tracing marks a bulk enqueue's jobs.
TRACE_BATCH = 500
# (child, parent) rows per statement of a fan-in child's parent list.
FAN_IN_BATCH = 500


class Inserted(NamedTuple):
    """What a unique enqueue found: the id of the job holding the key, and
    its stage if this enqueue wrote it (None: a duplicate, nothing written)."""

    job_id: str
    stage: str | None


class EnqueueStore(Operations, abc.ABC):
    """Inserts of jobs, and what follows them."""

    @abc.abstractmethod
    def insert_one(self, db: BaseDatabaseWrapper, job: NewJob, *, prepare: bool) -> str:
        """Insert a ready or delayed ``job`` through the Django connection
        ``db`` (in its transaction); return its stage. ``prepare``: whether
        a vendor that can prepares the statement on the server
        (LATER["PREPARED_STATEMENTS"], read by the caller)."""

    @abc.abstractmethod
    def insert_many(
        self, db: BaseDatabaseWrapper, jobs: Iterable[NewJob], *, queued: bool = False
    ) -> None:
        """Insert ready ``jobs`` through ``db``, in as few statements as the
        database allows; ``queued`` when any of them may name a queue (the
        plain form never names the column).

        ``jobs`` may be built while it is consumed: an exception from it
        propagates, and the caller's transaction rolls the rows back."""

    def insert_continuation(
        self, cursor: CursorWrapper, job: NewJob, retention_ms: int
    ) -> str | None:
        """Insert ``job`` as a child of ``job.parent_id``; return its stage,
        or None when the parent does not exist in the namespace."""
        cursor.execute(*self._continuation_insert(job, retention_ms))
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def _continuation_insert(self, job: NewJob, retention_ms: int) -> tuple[str, list[Any]]:
        columns, values = option_columns(job)
        statement = enqueue_sql.continuation_with_options(columns)
        return self._sql.bind(statement, **continuation_params(job, retention_ms), **values)

    def insert_unique(
        self, cursor: CursorWrapper, job: NewJob, retention_ms: int
    ) -> Inserted | None:
        """Insert ``job``, which has a unique key, unless another job holds
        the key; return what was found, or None when ``job`` is a
        continuation whose parent does not exist.

        The unique index decides, inside the insert: an enqueue in another
        transaction that holds the key makes this one wait for its end (on
        PostgreSQL; SQLite has one writer at a time), so a key is never
        taken twice and never refused for a rollback. The holder found
        afterwards may finish, or its window end, before it is read: then
        the key is free and the insert is tried again."""
        for _ in range(UNIQUE_TRIES):
            if job.parent_id is None:
                statement, params = insert_with_options(job)
                cursor.execute(*self._sql.bind(statement, **params))
            else:
                cursor.execute(*self._continuation_insert(job, retention_ms))
            row = cursor.fetchone()
            if row is not None:
                return Inserted(job.id, str(row[0]))
            holder = self._unique_holder(cursor, job)
            if holder is not None:
                return Inserted(holder, None)
            if job.parent_id is not None:
                self._run(
                    cursor,
                    enqueue_sql.PARENT_EXISTS,
                    parent_id=job.parent_id,
                    namespace=job.namespace,
                )
                if cursor.fetchone() is None:
                    return None
        raise LaterBusy(
            f"the unique key {job.unique_key!r} of {job.type_name} was taken and freed "
            f"{UNIQUE_TRIES} times while this enqueue ran; try again"
        )

    def _unique_holder(self, cursor: CursorWrapper, job: NewJob) -> str | None:
        """The id of the job holding ``job``'s unique key, if one does."""
        if job.unique_for_ms is None:
            self._run(
                cursor,
                enqueue_sql.UNIQUE_HOLDER,
                namespace=job.namespace,
                type_name=job.type_name,
                unique_key=job.unique_key,
            )
        else:
            self._run(
                cursor,
                enqueue_sql.UNIQUE_HOLDER_IN_WINDOW,
                namespace=job.namespace,
                type_name=job.type_name,
                unique_key=job.unique_key,
                unique_for_ms=job.unique_for_ms,
            )
        row = cursor.fetchone()
        return None if row is None else str(row[0])

    def insert_fan_in(
        self,
        cursor: CursorWrapper,
        job: NewJob,
        retention_ms: int,
        extra: ExtraColumns | None = None,
    ) -> FanInInsert:
        """Insert ``job`` as a child of every job of ``job.parents``: its
        parent list, then its row, whose stage follows theirs (failed if one
        failed or was cancelled, ready if all succeeded, else waiting on an
        unfinished one). Run in one transaction: when a parent does not exist
        in the namespace nothing is left written, and the answer names the
        missing ones. ``extra`` replaces the columns of the options the job
        sets (a partition job's place and options)."""
        self._add_parents(cursor, job.id, job.parents or ())
        if extra is None:
            columns, values = option_columns(job)  # a fan-in job has no unique key
            extra = ExtraColumns(columns=columns, values=values)
        return self._insert_fan_in_row(cursor, job, retention_ms, extra)

    def _add_parents(self, cursor: CursorWrapper, child_id: str, parents: Sequence[str]) -> None:
        """Write the parent list of the fan-in child ``child_id``, before its
        row (whose insert reads it)."""
        for start in range(0, len(parents), FAN_IN_BATCH):
            batch = parents[start : start + FAN_IN_BATCH]
            pairs = [(child_id, parent_id) for parent_id in batch]
            self._run(cursor, enqueue_sql.FAN_IN_ADD, pairs=pairs)

    def _insert_fan_in_row(
        self, cursor: CursorWrapper, job: NewJob, retention_ms: int, extra: ExtraColumns
    ) -> FanInInsert:
        """The row of a fan-in child whose parent list is written."""
        statement = enqueue_sql.continuation_with_options(extra.columns, fan_in=True)
        own = continuation_params(job, retention_ms)
        del own["parent_id"]  # the parents are later_fan_in's rows
        cursor.execute(*self._sql.bind(statement, **own, **extra.values))
        row = cursor.fetchone()
        if row is not None:
            return FanInInsert(stage=str(row[0]))
        self._run(cursor, enqueue_sql.FAN_IN_MISSING, job_id=job.id, namespace=job.namespace)
        missing = tuple(str(r[0]) for r in cursor.fetchall())
        self._run(cursor, enqueue_sql.FAN_IN_FORGET, job_id=job.id)
        return FanInInsert(stage=None, missing=missing)

    # -- settling a child after its commit ---------------------------------------------------
    def settle_child(self, cursor: CursorWrapper, *, job_id: str, retention_ms: int) -> Settled:
        """Release or fail the waiting continuation ``job_id`` if its parent
        has finished; return what happened.

        Run after the continuation's transaction committed, in a transaction
        of its own: a parent that finished while that transaction was open
        could not see the child."""
        self._run(cursor, enqueue_sql.PARENT_STAGE, job_id=job_id)
        row = cursor.fetchone()
        if row is None or row[0] not in TERMINAL:
            return "waiting"
        orphan = Orphan(job_id=job_id, parent_stage=str(row[0]))
        resolve_orphan(self._sql, cursor, orphan, retention_ms=retention_ms)
        return "released" if row[0] == Stage.SUCCESS else "failed"

    def settle_fan_in(self, cursor: CursorWrapper, *, job_id: str, retention_ms: int) -> Settled:
        """Resolve the waiting fan-in child ``job_id`` if a parent finished
        (descendants.resolve_fan_in); return what happened.

        Run after the child's transaction committed, in a transaction of its
        own, as settle_child: its read of the parents waits for a finish
        of any of them under way and holds off the others until it ends."""
        self._run(cursor, enqueue_sql.FAN_IN_PARENTS_OF_WAITING, job_id=job_id)
        if not any(row[0] in TERMINAL for row in cursor.fetchall()):
            return "waiting"
        resolved = resolve_fan_in(self._sql, cursor, [job_id], retention_ms=retention_ms)
        return "released" if resolved.released else "failed" if resolved.failed else "waiting"

    # -- tracing (LATER["TRACING"] only) -----------------------------------------------------
    def set_trace(self, cursor: CursorWrapper, job_ids: Sequence[str], context: str) -> None:
        """Record the enqueuing span's ``context`` on jobs just inserted."""
        for start in range(0, len(job_ids), TRACE_BATCH):
            batch = job_ids[start : start + TRACE_BATCH]
            self._run(cursor, enqueue_sql.SET_TRACE, context=context, job_ids=batch)


def continuation_params(job: NewJob, retention_ms: int) -> dict[str, Any]:
    """The parameters of a continuation insert (sql/enqueue.py
    continuation_with_options) for ``job``, but its option columns'."""
    return {
        "job_id": job.id,
        "namespace": job.namespace,
        "type_name": job.type_name,
        "payload": job.payload,
        "priority": job.priority,
        "retry_policy": job.retry_policy,
        "retention_ms": retention_ms,
        "parent_id": job.parent_id,
    }


def option_columns(job: NewJob) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The option columns ``job`` sets, and their parameters.

    An insert names only the option columns its job sets, so a job that sets
    none is written as before the options existed: a web server of this
    release still enqueues plain jobs before later_migrate added them."""
    columns: list[str] = []
    values: dict[str, Any] = {}
    if job.timeout_ms is not None:
        columns.append("timeout_ms")
        values["timeout_ms"] = job.timeout_ms
    if job.queue is not None:
        columns.append("queue")
        values["queue"] = job.queue
    if job.concurrency_key is not None:
        columns += ["concurrency_key", "concurrency_limit"]
        values.update(concurrency_key=job.concurrency_key, concurrency_limit=job.concurrency_limit)
    if job.unique_key is not None:
        columns.append("unique_key")
        values["unique_key"] = job.unique_key
        if job.unique_for_ms is not None:
            columns.append("unique_slot_ms")
            values["unique_for_ms"] = job.unique_for_ms
    return tuple(columns), values


def ready_now(job: NewJob) -> bool:
    """Is ``job`` due at once and without any option, so stored
    ``enqueued`` from NewJob's first six fields alone (as the bulk inserts
    store theirs)? A unique job is never: it takes insert_unique."""
    return (
        job.parent_id is None
        and job.run_at_ms is None
        and job.delay_ms <= 0
        and job.timeout_ms is None
        and job.queue is None
        and job.concurrency_key is None
        and job.unique_key is None
    )


def insert_statement(job: NewJob) -> tuple[Statement, dict[str, Any]]:
    """The insert of one ready or delayed ``job`` and its parameters."""
    # The common case: no option set.
    if job.timeout_ms is None and job.queue is None and job.concurrency_key is None:
        return enqueue_sql.INSERT, insert_params(job)
    return insert_with_options(job)


def insert_with_options(job: NewJob) -> tuple[Statement, dict[str, Any]]:
    """insert_statement's form for a job that sets options (a unique job's
    always: insert_statement's test for none does not look at its key)."""
    columns, values = option_columns(job)
    return enqueue_sql.insert_with_options(columns), {**insert_params(job), **values}


def insert_params(job: NewJob) -> dict[str, Any]:
    """The parameters of INSERT for ``job``."""
    return {
        "job_id": job.id,
        "namespace": job.namespace,
        "type_name": job.type_name,
        "payload": job.payload,
        "priority": job.priority,
        "retry_policy": job.retry_policy,
        "run_at_ms": job.run_at_ms,
        "delay_ms": job.delay_ms,
    }
