"""The worker's own connections for claims and completions, under database faults.

Each test runs on SQLite and on PostgreSQL, each with the fault that database
really has: SQLite's write lock held by another connection, a PostgreSQL
backend terminated under the worker.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time

import psycopg
import pytest
from django.db import connections

import later_django as later
from later_django.db.rows import ClaimRequest
from later_django.db.sessions import WorkerSessions
from tests.helpers import in_thread, sqlite_write_lock
from tests.jobapp.jobs import Noop

OWNER = "test-owner"
LEASE_MS = 30_000
RETENTION_MS = 60_000
LOCK_HELD = 0.3  # seconds another connection holds SQLite's write lock


async def _claim(path: WorkerSessions, limit: int = 1) -> list[str]:
    jobs = await path.claim(
        ClaimRequest(namespace="default", owner=OWNER, limit=limit, lease_ms=LEASE_MS)
    )
    return [job.id for job in jobs]


def test_hot_path_claims_and_completes_with_continuations(later_db):
    parent = later.enqueue(Noop(n=1))
    child = later.enqueue_continue(parent, Noop(n=2))

    async def scenario() -> tuple[list[str], list[str], int, list[str]]:
        claims, completions = (
            WorkerSessions(later_db.alias, prepare=True),
            WorkerSessions(later_db.alias, prepare=True),
        )
        try:
            claimed = await _claim(claims, limit=5)
            completion = await completions.complete_many(
                owner=OWNER, jobs=[(parent, 1)], retention_ms=RETENTION_MS
            )
            done, released = completion.done_ids, completion.released
            return claimed, done, released, await _claim(claims, limit=5)
        finally:
            await claims.close()
            await completions.close()

    claimed, done, released, next_claim = asyncio.run(scenario())
    assert claimed == [parent], "the waiting continuation is not claimable yet"
    assert (done, released) == ([parent], 1)
    assert next_claim == [child], "the released continuation is claimable at once"
    assert later_db.stage_of(parent) == "success"


def test_hot_path_completion_is_fenced_by_owner_and_attempt(later_db):
    job_id = later.enqueue(Noop(n=1))

    async def scenario() -> tuple[list[str], list[str]]:
        path = WorkerSessions(later_db.alias, prepare=True)
        try:
            await _claim(path)
            stranger = await path.complete_many(
                owner="someone-else", jobs=[(job_id, 1)], retention_ms=RETENTION_MS
            )
            stale = await path.complete_many(
                owner=OWNER, jobs=[(job_id, 2)], retention_ms=RETENTION_MS
            )
            return stranger.done_ids, stale.done_ids
        finally:
            await path.close()

    assert asyncio.run(scenario()) == ([], [])
    assert later_db.stage_of(job_id) == "running"


def test_hot_path_survives_its_database_fault(later_db):
    job_id = later.enqueue(Noop(n=1))
    if later_db.vendor == "sqlite":
        _claim_behind_a_held_write_lock(later_db, job_id)
    else:
        _claim_after_the_backend_was_terminated(later_db, job_id)
    assert later_db.stage_of(job_id) == "running"


def _claim_behind_a_held_write_lock(later_db, job_id: str) -> None:
    """The claim waits for the lock with asyncio sleeps: the loop keeps running."""

    async def scenario(holder: sqlite3.Connection) -> tuple[list[str], int, float]:
        path = WorkerSessions(later_db.alias, prepare=True)
        ticks = 0

        async def tick() -> None:
            # Counts how often the event loop runs while the claim waits.
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        ticker = asyncio.create_task(tick())
        asyncio.get_running_loop().call_later(LOCK_HELD, holder.execute, "COMMIT")
        started = time.monotonic()
        try:
            claimed = await _claim(path)
        finally:
            ticker.cancel()
            await path.close()
        return claimed, ticks, time.monotonic() - started

    with sqlite_write_lock(later_db) as holder:
        claimed, ticks, waited = asyncio.run(scenario(holder))
    assert claimed == [job_id]
    assert waited >= LOCK_HELD * 0.9, "the claim cannot have written under the other lock"
    # A loop blocked inside SQLite's busy handler would not tick at all.
    assert ticks >= 50, f"the event loop ran only {ticks} times while the claim waited"


def _claim_after_the_backend_was_terminated(later_db, job_id: str) -> None:
    """A dead connection fails one call, then the session reconnects."""

    async def scenario() -> list[str]:
        path = WorkerSessions(later_db.alias, prepare=True)
        try:
            # Connect with a claim that finds nothing (another namespace).
            assert (
                await path.claim(
                    ClaimRequest(namespace="elsewhere", owner=OWNER, limit=1, lease_ms=1)
                )
                == []
            )
            assert path.postgres is not None and path.postgres._conn is not None
            pid = path.postgres._conn.info.backend_pid
            await in_thread(_terminate, later_db.alias, pid)
            with pytest.raises(psycopg.OperationalError):
                await _claim(path)
            return await _claim(path)
        finally:
            await path.close()

    assert asyncio.run(scenario()) == [job_id]


def _terminate(alias: str, pid: int) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_postgres_claims_are_planned_once_per_session(later_db):
    """The claim runs its cached generic plan: planning it anew for every
    claim cost as much as running it."""
    if later_db.vendor != "postgresql":
        pytest.skip("SQLite keeps no server-side plans")
    # A backlog the size of a real one: with a handful of rows every plan is cheap.
    later.enqueue_many([Noop(n=n) for n in range(5000)])
    with connections[later_db.alias].cursor() as cursor:
        cursor.execute("ANALYZE later_job")

    async def scenario() -> tuple[int, int, int]:
        path = WorkerSessions(later_db.alias, prepare=True)
        try:
            claimed = sum([len(await _claim(path, limit=3)) for _ in range(10)], 0)

            async def plans(_d: object, conn: psycopg.AsyncConnection) -> tuple[int, int]:
                cursor = await conn.execute(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE '%SKIP LOCKED%'"
                )
                row = await cursor.fetchone()
                assert row is not None, "the claim is a prepared statement"
                return int(row[0]), int(row[1])

            assert path.postgres is not None
            generic, custom = await path.postgres.run(plans)
            return claimed, generic, custom
        finally:
            await path.close()

    claimed, generic, custom = asyncio.run(scenario())
    assert claimed == 30
    # The server tries custom plans for the first five runs, then keeps the
    # generic one only if it is no dearer.
    assert (generic, custom) == (5, 5)


@pytest.mark.parametrize("prepare", [True, False])
def test_sessions_prepare_their_statements_only_when_told(later_db, prepare):
    """The claim and the completion on a connection of their own are
    prepared on the server exactly when the sessions were told to (the
    server's LATER['PREPARED_STATEMENTS']: a pooler may not keep them)."""
    job_id = later.enqueue(Noop(n=1))

    async def scenario() -> tuple[list[str], list[str] | None]:
        path = WorkerSessions(later_db.alias, prepare=prepare)
        try:
            claimed = await _claim(path)
            await path.complete_many(owner=OWNER, jobs=[(job_id, 1)], retention_ms=RETENTION_MS)
            if path.postgres is None:  # inline (no supports_async_connection)
                return claimed, None

            async def prepared(_d: object, conn: psycopg.AsyncConnection) -> list[str]:
                cursor = await conn.execute("SELECT statement FROM pg_prepared_statements")
                return [str(row[0]) for row in await cursor.fetchall()]

            return claimed, await path.postgres.run(prepared)
        finally:
            await path.close()

    claimed, statements = asyncio.run(scenario())
    assert claimed == [job_id]
    assert later_db.stage_of(job_id) == "success"
    if statements is not None:
        assert any("SKIP LOCKED" in s for s in statements) is prepare, statements
        assert any("later_complete_many" in s for s in statements) is prepare, statements
