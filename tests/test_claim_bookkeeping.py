"""A server's own record of its claims agrees with the database's: a claim
that finished during a renewal is not lost, a spare kept past its deadline
is given back, and a claim or completion abandoned mid-statement is settled
from what the database stored (docs/design.md, "Leases")."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections

import later_django as later
from later_django.store import Store
from later_django.worker.lease_book import LeaseBook
from tests.helpers import LaterDb
from tests.jobapp.jobs import Noop
from tests.test_dialect_conformance import claim

OWNER = "server-a"


def _store_success(alias: str, job_id: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE later_job SET stage = 'success', lease_owner = NULL, "
            "lease_expires_ms = NULL WHERE id = %s",
            [job_id],
        )


def test_lease_book_renewal_keeps_a_claim_that_finished_meanwhile(later_db: LaterDb) -> None:
    """The renewal no longer finds a claim whose outcome was stored while it
    ran; that claim was released, not lost, so nothing is given up."""
    job_id = later.enqueue(Noop())
    [job] = claim(later_db, owner=OWNER)
    given_up: list[Any] = []
    with ThreadPoolExecutor(1) as pool:
        store = Store(later_db.alias)
        book = LeaseBook(store=store, pool=pool, owner=OWNER, lease_ms=30_000)
        book.on_given_up = lambda claim, why: given_up.append((claim, why))
        real_run = store.run

        async def run_then_finish(pool: Any, op: Any, **kwargs: Any) -> Any:
            # The outcome is stored and the claim released while the
            # renewal is in the database.
            await real_run(pool, lambda d, c: _store_success(later_db.alias, job_id))
            result = await real_run(pool, op, **kwargs)
            book.release((job_id, job.attempts))
            return result

        store.run = run_then_finish  # type: ignore[method-assign]

        async def main() -> list[Any]:
            book.hold([(job_id, job.attempts)], asyncio.get_running_loop().time())
            return await book.renew()

        lost = asyncio.run(main())
    store.close(5)
    assert lost == []
    assert given_up == []
