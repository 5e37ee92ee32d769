"""Per-key concurrency across every server (docs/concurrency-limits.md)."""

from __future__ import annotations

from django.db import connections, transaction

from later_django.db import dialect_for
from later_django.db.rows import ClaimRequest, LimitedClaimRequest
from later_django.limits import QueueLimits
from tests.conformance.helpers import insert

KEYED = QueueLimits(keyed=True)


def claim_keyed(later_db, limit: int = 10, owner: str = "server-a") -> list[str]:
    """Claim up to ``limit`` jobs of the default queue as a keyed claim does."""
    request = LimitedClaimRequest(
        claim=ClaimRequest(namespace="default", owner=owner, limit=limit, lease_ms=30_000),
        limits=KEYED,
    )
    dialect = dialect_for(later_db.alias)
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
        return [job.id for job in dialect.limits.claim_limited(c, request).jobs]


def test_a_keyed_claim_takes_no_more_of_a_key_than_its_free_slots(later_db):
    a = [insert(later_db, concurrency_key="a", concurrency_limit=2) for _ in range(4)]
    b = [insert(later_db, concurrency_key="b", concurrency_limit=1) for _ in range(3)]
    plain = [insert(later_db) for _ in range(2)]
    first = claim_keyed(later_db, limit=10)
    assert set(first) == {*a[:2], b[0], *plain}
    assert claim_keyed(later_db, limit=10) == [], "every key is at its limit"
