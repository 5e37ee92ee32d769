"""Atomic jobs (``@job(atomic=True)``): a sync handler and its job's success
in one transaction of the LATER database.

Runs in the handler's thread, on its connection, so the handler's writes and
the success, fenced by the claim, commit together or not at all (for the
executor and drain() alike). A failure rolls back and is stored afterwards
as any job's is.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from later_django.context import JobContext
from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.db.rows import PartitionCompletion, SuccessBatch
from later_django.exceptions import LaterError
from later_django.types import ClaimedJob

logger = logging.getLogger(__name__)

# How a transaction of a single-writer database begins with its write lock
# taken (Django >= 5.1 begins SQLite's transactions with it).
WRITE_LOCK_FIRST: Final = "IMMEDIATE"


class AttemptAbandoned(LaterError):
    """The worker stopped waiting for this attempt (its timeout passed, cancel()
    asked it to stop, its lease was lost or could not be renewed, or the
    server stopped); its writes were rolled back."""


class _ClaimLost(Exception):
    """Rolls the transaction back: the claim's fence no longer holds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Committed:
    """What an atomic run stored: ``stored`` False when the claim's fence no
    longer held and everything rolled back; ``released``, the continuations
    the success released."""

    stored: bool
    released: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AtomicRunner:
    """Runs atomic handlers of the claims ``owner`` holds on ``alias``."""

    alias: str
    owner: str
    retention_ms: int

    def run(
        self, job: ClaimedJob, func: Callable[..., Any], ctx: JobContext, payload: object
    ) -> Committed:
        """Call ``func(ctx, payload)`` and store the success of ``job`` in one
        transaction of the calling thread's connection; return what committed.

        A handler's exception rolls back and propagates; an attempt the
        worker stopped waiting for rolls back and raises AttemptAbandoned."""
        dialect = dialect_for(self.alias)
        db = connections[self.alias]
        committed = Committed(stored=False)
        landed: list[bool] = []
        try:
            with _transaction(db, self.alias, write_lock_first=dialect.single_writer):
                # First of the commit hooks: they run in order, so a hook of
                # the handler's that raises after the commit is told apart
                # from a failure before it.
                transaction.on_commit(lambda: landed.append(True), using=self.alias)
                # A single writer may have waited here for the write lock.
                _raise_if_abandoned(ctx)
                func(ctx, payload)
                # A sync handler cannot be stopped: one the worker gave up
                # on must not commit once it returns.
                _raise_if_abandoned(ctx)
                with db.cursor() as cursor:
                    committed = self._store_success(dialect, cursor, job)
                if not committed.stored:
                    raise _ClaimLost
        except _ClaimLost:
            return Committed(stored=False)
        except Exception:
            if not landed:
                raise
            # The job's success and the handler's writes are in: what raised
            # is a commit hook of the handler's, which ran after them.
            logger.exception(
                "a commit hook (transaction.on_commit) of atomic job %s raised after its "
                "success committed",
                job.id,
                extra={"action": "atomic_commit_hook_error", "job_id": job.id},
            )
        return committed

    def _store_success(self, dialect: Dialect, cursor: CursorWrapper, job: ClaimedJob) -> Committed:
        """The statements of the job's success, fenced by its claim (and a
        partition head's by its partition's lease too), as the completer
        runs them; its waiting continuations are released with it."""
        if job.lane is not None:
            done = PartitionCompletion(job=job, owner=self.owner, retention_ms=self.retention_ms)
            return Committed(stored=dialect.partitions.partition_complete(cursor, done))
        completion = dialect.hot.complete_many(
            cursor,
            SuccessBatch(
                owner=self.owner, jobs=[(job.id, job.attempts)], retention_ms=self.retention_ms
            ),
        )
        return Committed(stored=bool(completion.done_ids), released=completion.released)


def _raise_if_abandoned(ctx: JobContext) -> None:
    if ctx.cancel_requested.is_set():
        raise AttemptAbandoned(
            f"job {ctx.job_id} attempt {ctx.attempt}: the worker stopped waiting for this "
            "attempt (ctx.cancel_requested is set); its writes were rolled back"
        )


@contextlib.contextmanager
def _transaction(db: BaseDatabaseWrapper, alias: str, *, write_lock_first: bool) -> Iterator[None]:
    """``transaction.atomic(using=alias)``; with ``write_lock_first`` (a
    single-writer database), a transaction it begins takes the write lock at
    once, whatever OPTIONS["transaction_mode"] says.

    A SQLite transaction that read before its first write fails at once
    ("database is locked") if another connection committed since its read;
    the worker commits every few moments and the success is written last,
    so an atomic job would often fail so."""
    if not write_lock_first or db.in_atomic_block:
        with transaction.atomic(using=alias):
            yield
        return
    with contextlib.ExitStack() as stack:
        # Connect first: connecting reads the mode from the settings again.
        db.ensure_connection()
        mode = getattr(db, "transaction_mode", None)
        if mode != "EXCLUSIVE":
            db.transaction_mode = WRITE_LOCK_FIRST  # type: ignore[attr-defined]  # SQLite's wrapper has it (Django >= 5.1)
        try:
            stack.enter_context(transaction.atomic(using=alias))
        finally:
            db.transaction_mode = mode  # type: ignore[attr-defined]  # as above
        yield
