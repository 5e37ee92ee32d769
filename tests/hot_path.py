"""The worker's claim and batch completion, run on a Django cursor.

The worker runs them on connections of its own (later_django/db/sessions.py);
tests that need them inside their own transaction (rolled back, or mixed
with other writes) run the same statements here. SQLite's are the dialect's
own inline operations; PostgreSQL's are the statements its asyncio
operations prepare.
"""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from later_django.db.base import Dialect, claimed_jobs
from later_django.db.postgresql import PostgresDialect
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
    if not dialect.supports_async_connection:
        return dialect.job_claim(
            cursor, namespace=namespace, owner=owner, limit=limit, lease_ms=lease_ms
        )
    assert isinstance(dialect, PostgresDialect)
    cursor.execute(dialect.claim_sql(limit), [namespace, owner, lease_ms])
    return claimed_jobs(cursor.fetchall())
