"""The limits store on both databases (db/limits.py): claims that keep a
rate limit and concurrency keys, SQLite's wake-up look at a keyed queue,
and what limits hold back."""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import transaction

from later_django.db.rows import ClaimRequest, LimitedClaim, LimitedClaimRequest
from later_django.limits import QueueLimits, RateLimit
from tests.conformance.helpers import (
    HOUR_MS,
    LEASE_MS,
    NS,
    OWNER,
    assert_counts,
    cursor_of,
    insert,
    job_row,
    on_async_connection,
)

KEYED = QueueLimits(keyed=True)
TWO_AN_HOUR = QueueLimits(rate=RateLimit(count=2, window_ms=HOUR_MS))


def limited(later_db, dialect, limits: QueueLimits, *, limit: int = 10) -> LimitedClaim:
    """A limited claim, through the pair the dialect's capability names."""
    request = LimitedClaimRequest(
        claim=ClaimRequest(namespace=NS, owner=OWNER, limit=limit, lease_ms=LEASE_MS),
        limits=limits,
    )
    if dialect.supports_async_connection:

        async def op(conn: psycopg.AsyncConnection[Any]) -> LimitedClaim:
            return await dialect.limits.aclaim_limited(conn, request, prepare=True)

        return on_async_connection(later_db, op)  # type: ignore[no-any-return]
    with transaction.atomic(using=later_db.alias), cursor_of(later_db) as c:
        return dialect.limits.claim_limited(c, request)


def test_claim_limited_keeps_each_keys_limit_in_claim_order(later_db, dialect):
    a = [insert(later_db, concurrency_key="a", concurrency_limit=2) for _ in range(3)]
    b = [insert(later_db, concurrency_key="b", concurrency_limit=1, priority=5) for _ in range(2)]
    plain = insert(later_db)
    first = limited(later_db, dialect, KEYED, limit=2)
    assert {job.id for job in first.jobs} == {b[0], a[0]}, "the best two in claim order"
    taken = limited(later_db, dialect, KEYED)
    assert {job.id for job in taken.jobs} == {a[1], plain}
    assert taken.retry_in_ms is None
    for job in first.jobs + taken.jobs:
        row = job_row(later_db, job.id)
        assert (row["stage"], row["lease_owner"], row["attempts"]) == ("running", OWNER, 1)
    assert limited(later_db, dialect, KEYED).jobs == []
    assert_counts(later_db)


def test_claim_limited_passes_over_a_key_at_its_limit_to_later_jobs(later_db, dialect):
    """The jobs of a key at its limit, ahead in claim order, do not hide the
    jobs behind them, however many they are."""
    first = insert(later_db, concurrency_key="busy", concurrency_limit=1)
    assert [job.id for job in limited(later_db, dialect, KEYED, limit=1).jobs] == [first]
    for _ in range(30):
        insert(later_db, concurrency_key="busy", concurrency_limit=1, priority=9)
    other = insert(later_db, concurrency_key="free", concurrency_limit=1)
    assert [job.id for job in limited(later_db, dialect, KEYED, limit=1).jobs] == [other]


def test_claim_limited_counts_a_rate_limited_queues_starts_in_its_window(later_db, dialect):
    jobs = [insert(later_db) for _ in range(3)]
    first = limited(later_db, dialect, TWO_AN_HOUR)
    assert [job.id for job in first.jobs] == jobs[:2]
    now = int(later_db.now_ms())
    assert first.retry_in_ms is not None
    assert abs(now + first.retry_in_ms - (now // HOUR_MS + 1) * HOUR_MS) < 1_000
    spent = limited(later_db, dialect, TWO_AN_HOUR)
    assert spent.jobs == [] and spent.retry_in_ms is not None
    assert later_db.rows("SELECT rate_started FROM later_queue") == [(2,)]
    assert job_row(later_db, jobs[2])["stage"] == "enqueued"


def test_keyed_ready_exists_sees_only_a_job_below_its_keys_limit(later_db, dialect):
    def exists() -> bool:
        with cursor_of(later_db) as c:
            return dialect.limits.keyed_ready_exists(c, namespace=NS, queue="default")

    assert not exists()
    insert(later_db, concurrency_key="k", concurrency_limit=1)
    insert(later_db, concurrency_key="k", concurrency_limit=1)
    assert exists()
    limited(later_db, dialect, KEYED, limit=1)
    assert not exists(), "the one left is over its key's limit"
    insert(later_db)
    assert exists(), "a job without a key"


def test_held_counts_the_ready_jobs_a_limit_holds_back(later_db, dialect):
    limits = {"default": QueueLimits(keyed=True)}

    def held() -> dict[str, int]:
        with cursor_of(later_db) as c:
            return dialect.limits.held(c, namespace=NS, limits=limits)

    for _ in range(3):
        insert(later_db, concurrency_key="k", concurrency_limit=1)
    plain = insert(later_db, priority=-1)
    assert held() == {"default": 0}
    limited(later_db, dialect, KEYED, limit=1)
    assert held() == {"default": 2}
    limits = {"default": QueueLimits(rate=RateLimit(count=1, window_ms=HOUR_MS), keyed=True)}
    assert [job.id for job in limited(later_db, dialect, limits["default"]).jobs] == [plain]
    insert(later_db)
    assert held() == {"default": 3}, "the window is spent: every ready job waits"
