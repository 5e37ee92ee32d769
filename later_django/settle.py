"""Waiting continuations settled after their commit: a continuation is
inserted without locking its parent, so a parent that finished before the
insert's transaction committed could not see the child; once it commits,
the child is released or failed here. Nothing here inserts a job."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from django.db import DatabaseError, connections, transaction

from later_django.conf import conf
from later_django.db import dialect_for

logger = logging.getLogger(__name__)


def settle_on_commit(
    alias: str, job_id: str, *, wake: Callable[[], None], fan_in: bool = False
) -> None:
    """Once the caller's transaction commits, release or fail the waiting
    continuation ``job_id`` if its parent (a ``fan_in`` child: any of its
    parents) finished meanwhile; ``wake`` the workers of its lane when it
    was released.

    The continuation was inserted without locking its parent (an open
    transaction must not hold up the parent's completion), so a parent that
    finished before the commit could not see the child. (With one writer at
    a time, as on SQLite, none can.)"""
    if not dialect_for(alias).single_writer:
        settle = functools.partial(_settle_child, alias, job_id, wake, fan_in)
        transaction.on_commit(settle, using=alias)


def _settle_child(alias: str, job_id: str, wake: Callable[[], None], fan_in: bool) -> None:
    dialect = dialect_for(alias)
    retention = conf.millis("DASHBOARD_RETENTION")
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            if fan_in:
                settled = dialect.enqueue.settle_fan_in(
                    cursor, job_id=job_id, retention_ms=retention
                )
            else:
                settled = dialect.enqueue.settle_child(
                    cursor, job_id=job_id, retention_ms=retention
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
        wake()
