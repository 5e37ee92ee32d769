"""A server's own record of its claims agrees with the database's: a claim
that finished during a renewal is not lost, a spare kept past its deadline
is given back, and a claim or completion abandoned mid-statement is settled
from what the database stored (docs/explanation/design.md, "Leases")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connections

import later_django as later
from later_django.db.rows import ClaimRequest
from later_django.threaded_store import ThreadedStore
from later_django.worker.claimer import Claimer, ClaimSetup
from later_django.worker.lease_book import LeaseBook
from later_django.worker.notifier import Wakeup
from tests.conformance.helpers import claim
from tests.helpers import (
    LaterDb,
    await_stage,
    await_until,
    in_thread,
    read_records,
    serve,
    set_later,
)
from tests.jobapp.jobs import Gate, Noop

OWNER = "server-a"
T = TypeVar("T")


class Holders:
    """A lease book's holders that only record what they were told."""

    def __init__(self) -> None:
        self.given: list[Any] = []
        self.cancels: list[Any] = []

    def given_up(self, claim: Any, why: str) -> None:
        self.given.append((claim, why))

    def cancel_requested(self, claim: Any) -> None:
        self.cancels.append(claim)


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
    with ThreadPoolExecutor(1) as pool:
        store = ThreadedStore(later_db.alias)
        holders = Holders()
        book = LeaseBook(store=store, pool=pool, owner=OWNER, lease_ms=30_000, holders=holders)
        given_up = holders.given
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


def _hang_after_first_call(real: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Wrap ``real`` so that its first call does its work, then its answer
    never comes back (a connection that hangs after the database did the
    work). The first call is the first made, not the first answered: on a
    loaded machine the next call, made once the first is abandoned, can be
    answered before it, and must not hang instead."""
    calls = 0

    async def call(*args: Any, **kwargs: Any) -> T:
        nonlocal calls
        calls += 1
        first = calls == 1
        result = await real(*args, **kwargs)
        if first:
            await asyncio.Event().wait()
        return result

    return call


def _hang_after_first_claim(server: Any) -> None:
    """The first shared claim commits, then its answer never comes back."""
    server.queues[0].claimer.sessions.claim = _hang_after_first_call(
        server.queues[0].claimer.sessions.claim
    )


def test_jobs_of_an_abandoned_claim_that_committed_run_without_losing_an_attempt(
    later_db: LaterDb, record: Path, tmp_path: Path, settings: Any
) -> None:
    """The supervisor abandons a shared claim that hung after it committed:
    the jobs it took are given back at the next claim, as if never claimed,
    and run at once, so a job with no retry left is not failed as "lease
    expired" without ever running."""
    # The job must be given back before its lease expires, or the stuck-job
    # recovery fails it (no retry left). A lease far longer than the worker's
    # back-off after the abandoned claim (up to 1.5 s) leaves room for a
    # loaded machine; success is awaited well within it, so only the
    # give-back can run the job again in time.
    set_later(settings, LEASE_DURATION=30)
    job_id = later.enqueue(Gate(path=str(tmp_path)))  # the gate is open

    async def body(server: Any) -> None:
        async def claimed_and_hung() -> bool:
            running = await in_thread(later_db.stage_of, job_id) == "running"
            return running and server.queues[0].claimer.hung_since() is not None

        await await_until(claimed_and_hung, 10, "the first claim commits and hangs")
        assert server.abandon_hung_calls(0.0) == ["claim default"]
        server.queues[0].wake.wake()
        await await_stage(job_id, "success", timeout=20)

    serve(body, workers=1, before_start=_hang_after_first_claim)
    assert [r.attempt for r in read_records(record, "gate", job_id)] == [1]
    info = later.get_job(job_id)
    assert info.stage == "success" and info.attempts == 1


def _hang_after_first_completion(server: Any) -> None:
    """The first shared completion commits, then its answer never comes back."""
    sessions = server.completer.sessions
    sessions.complete_many = _hang_after_first_call(sessions.complete_many)


def test_a_completion_abandoned_after_it_committed_counts_as_stored(
    later_db: LaterDb, caplog: pytest.LogCaptureFixture
) -> None:
    """The supervisor abandons a shared completion that hung after it
    committed; storing the success again finds it stored, so the job is
    counted as a success, not reported as a lost lease."""
    job_id = later.enqueue(Noop())

    async def body(server: Any) -> Any:
        async def stored_and_hung() -> bool:
            stored = await in_thread(later_db.stage_of, job_id) == "success"
            return stored and server.completer.hung_since() is not None

        await await_until(stored_and_hung, 10, "the first completion commits and hangs")
        assert server.abandon_hung_calls(0.0) == ["complete"]

        async def settled() -> bool:
            return not server.completer.unstored

        await await_until(settled, 10, "the outcome is settled")
        return server.completer.outcomes

    with caplog.at_level(logging.WARNING, logger="later_django"):
        outcomes = serve(body, workers=1, before_start=_hang_after_first_completion)
    assert later_db.stage_of(job_id) == "success"
    assert "discarded" not in caplog.text
    assert outcomes.succeeded == 1


def test_a_spare_kept_past_its_deadline_is_given_back_to_the_database(later_db: LaterDb) -> None:
    """A job claimed for a worker that went away, kept aside until its lease
    was no longer confirmed, is given back (ready again) instead of left
    running with no holder until the stuck-job recovery."""
    job_id = later.enqueue(Noop())
    with ThreadPoolExecutor(2) as pool:
        store = ThreadedStore(later_db.alias)

        async def main() -> tuple[Any, LeaseBook]:
            book = LeaseBook(
                store=store, pool=pool, owner=OWNER, lease_ms=30_000, holders=Holders()
            )
            setup = ClaimSetup(
                alias=later_db.alias,
                namespace="default",
                owner=OWNER,
                store=store,
                pool=pool,
                leases=book,
                prepare=True,
            )
            claimer = Claimer(setup, wake=Wakeup())
            [spare] = await claimer.sessions.claim(
                ClaimRequest(namespace="default", owner=OWNER, limit=1, lease_ms=30_000)
            )
            # Held since long enough ago that its lease is no longer confirmed.
            book.hold([(spare.id, spare.attempts)], asyncio.get_running_loop().time() - 60)
            claimer._keep_spare(spare)
            taken = await claimer.claim()
            await claimer.release_spares()
            await claimer.close()
            return taken, book

        taken, book = asyncio.run(main())
    store.close(5)
    stage = later_db.stage_of(job_id)
    if taken is None:
        assert (stage, later_db.job_field(job_id, "lease_owner")) == ("enqueued", None)
    else:  # given back first, then claimed afresh by the same call
        assert stage == "running" and taken.id == job_id


def test_an_unconfirmed_retry_is_stored_only_if_its_own_error_is(later_db: LaterDb) -> None:
    """A retry or failure whose store may have committed unseen counts as
    stored only when the claim left the job with that outcome's own error:
    the stuck-job rescue requeues a claim too, as "lease expired"."""
    from later_django.db import dialect_for
    from later_django.db.rows import OwnerFence, RetryWrite
    from later_django.maintenance.steps import LEASE_EXPIRED
    from later_django.worker.executor import Outcome

    mine, rescued = later.enqueue(Noop(n=1)), later.enqueue(Noop(n=2))
    jobs = {job.id: job for job in claim(later_db, owner=OWNER, limit=2)}
    dialect = dialect_for(later_db.alias)
    with connections[later_db.alias].cursor() as cursor:
        for job_id, error in ((mine, "boom"), (rescued, LEASE_EXPIRED)):
            fence = OwnerFence(job_id=job_id, attempts=jobs[job_id].attempts, owner=OWNER)
            retry = RetryWrite(delay_ms=60_000, error=error, retry_policy=None)
            assert dialect.hot.retry(cursor, fence, retry)
    outcome = Outcome(kind="retry", error="boom", delay_ms=60_000)

    async def body(server: Any) -> list[str | None]:
        return [await server.completer._stored_before(jobs[j], outcome) for j in (mine, rescued)]

    assert serve(body) == ["retry", None]
