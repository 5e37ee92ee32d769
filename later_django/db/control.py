"""An operator's or a caller's actions on a job (``dialect.control``):
cancel it, retry a failed one, run a delayed one now (cancel() of the API,
the dashboard's buttons).

One class for both vendors: what differs, the walks of a job's
descendants, is the vendor's SQL (statements.Walks), run here or through
db/descendants.py.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.backends.utils import CursorWrapper

from later_django.db.descendants import fail_descendants
from later_django.db.sql import control as control_sql
from later_django.db.statements import Operations
from later_django.exceptions import LaterBusy

# How often cancel() looks at a job that moved between running and waiting
# to run while it looked: each look needs the job to move again in between.
CANCEL_LOOKS = 5


class ControlStore(Operations):
    """What an operator or a caller does to one job."""

    def cancel(
        self, cursor: CursorWrapper, *, namespace: str, job_id: str, retention_ms: int
    ) -> bool:
        """Cancel ``job_id`` if it has not started, failing its waiting
        descendants, or ask it to stop if it runs; return whether either was
        done, so False means it finished or does not exist. Run in one
        transaction.

        A worker's retry, snooze or give-back may commit between the two
        statements (PostgreSQL runs each on the newest data): the job is
        then looked at again. Each new look needs the job to have moved
        between two of these statements, so a few are enough."""
        for _ in range(CANCEL_LOOKS):
            self._run(
                cursor,
                control_sql.CANCEL,
                retention_ms=retention_ms,
                job_id=job_id,
                namespace=namespace,
            )
            if cursor.rowcount == 1:
                fail_descendants(self._sql, cursor, job_id=job_id, retention_ms=retention_ms)
                return True
            self._run(cursor, control_sql.REQUEST_CANCEL, job_id=job_id, namespace=namespace)
            if cursor.rowcount == 1:
                return True
            self._run(cursor, control_sql.UNFINISHED, job_id=job_id, namespace=namespace)
            if cursor.fetchone() is None:
                return False
        raise LaterBusy(
            f"job {job_id} changed stage under each of {CANCEL_LOOKS} tries to cancel it; "
            "call cancel() again"
        )

    def retry_failed(self, cursor: CursorWrapper, *, namespace: str, job_id: str) -> int | None:
        """Make the failed plain job ``job_id`` ready again, and its
        continuations that failed because it did wait for it again (fan-in
        children on it, whichever parent they waited on); return how many
        continuations, or None if the job was not a failed plain job. Run in
        one transaction."""
        self._run(cursor, control_sql.RETRY_FAILED, job_id=job_id, namespace=namespace)
        if cursor.rowcount != 1:
            return None
        # A continuation whose unique key another unfinished job holds stays
        # failed. Two of them sharing a key, or an enqueue taking one while
        # this runs, break later_job_unique: then only those without a key
        # wait again, and the job itself is retried all the same.
        walks = self._sql.walks
        try:
            with transaction.atomic(using=cursor.db.alias):
                self._run(cursor, walks.revive, job_id=job_id)
        except IntegrityError:
            self._run(cursor, walks.revive_keyless, job_id=job_id)
        return int(cursor.rowcount)

    def run_now(self, cursor: CursorWrapper, *, namespace: str, job_id: str) -> bool:
        """Make a delayed or requeued job due now; return whether it was one."""
        self._run(cursor, control_sql.RUN_NOW, job_id=job_id, namespace=namespace)
        return bool(cursor.rowcount == 1)
