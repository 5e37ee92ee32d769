"""The worker's claim and batch completion, run on a Django cursor.

The worker runs them on connections of its own (db/sessions.py). Callers
that need them inside the calling thread's own transaction (rolled back
by a test, or mixed with other writes), such as later_django.testing's
drain(), run the same statements here: SQLite's are the dialect's own
inline operations; PostgreSQL's are the statements its asyncio operations
prepare. No other SQL text: the statements stay those of the worker.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.backends.utils import CursorWrapper

from later_django.db.base import Dialect
from later_django.db.postgresql import PostgresDialect
from later_django.db.rows import ClaimRequest, Completion, claimed_jobs
from later_django.db.sql import postgresql as pg_sql
from later_django.types import ClaimedJob


def job_claim(
    dialect: Dialect,
    cursor: CursorWrapper,
    *,
    namespace: str,
    owner: str,
    limit: int,
    lease_ms: int,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` ready jobs for ``owner``, as the worker does,
    on ``cursor`` (in its transaction)."""
    request = ClaimRequest(namespace=namespace, owner=owner, limit=limit, lease_ms=lease_ms)
    if not dialect.supports_async_connection:
        return dialect.job_claim(cursor, request)
    assert isinstance(dialect, PostgresDialect)
    cursor.execute(dialect._claim_sql(limit), [namespace, owner, lease_ms])
    return claimed_jobs(cursor.fetchall())


def job_complete_many(
    dialect: Dialect,
    cursor: CursorWrapper,
    *,
    owner: str,
    jobs: Sequence[tuple[str, int]],
    retention_ms: int,
) -> Completion:
    """Store the success of each claim of ``jobs`` ``owner`` still holds and
    release their waiting continuations, as the worker does, on ``cursor``.
    Run in one transaction (SQLite takes two statements)."""
    if not dialect.supports_async_connection:
        return dialect.job_complete_many(cursor, owner=owner, jobs=jobs, retention_ms=retention_ms)
    if not jobs:
        return Completion(done_ids=[], released=0)
    ids = [job_id for job_id, _ in jobs]
    attempts = [attempt for _, attempt in jobs]
    cursor.execute(pg_sql.JOB_COMPLETE_MANY_SQL, [ids, attempts, owner, retention_ms])
    done_ids, released = cursor.fetchone()
    return Completion(done_ids=[str(job_id) for job_id in done_ids], released=int(released))
