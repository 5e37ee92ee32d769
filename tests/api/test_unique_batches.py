"""Unique jobs in bulk on both databases (docs/how-to/unique-jobs.md): a
batch's unique jobs are inserted in the order of their keys, its ids come
back in the caller's order, and two transactions taking the same keys in
opposite orders never deadlock within a call; across separate calls they
can, and PostgreSQL's deadlock_detected reaches the caller as it is."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import psycopg
import pytest
from django.db import OperationalError, connections, transaction

import later_django as later
from later_django.db import dialect_for
from tests.helpers import wait_until
from tests.jobapp.jobs import Noop, Refresh


def test_enqueue_many_writes_unique_jobs_in_key_order_and_returns_the_callers(
    later_db, monkeypatch
):
    """A batch's unique jobs are inserted in the order of their keys, so two
    batches of the same keys lock them in one order; the ids come back in
    the caller's order, a duplicate in place."""
    enqueue = dialect_for(later_db.alias).enqueue
    insert = enqueue.insert_unique
    written: list[str | None] = []

    def recorded(cursor, job, retention_ms):
        written.append(job.unique_key)
        return insert(cursor, job, retention_ms)

    monkeypatch.setattr(enqueue, "insert_unique", recorded)
    payloads = [Refresh(account=3), Noop(n=1), Refresh(account=1), Refresh(account=2)]
    payloads.append(Refresh(account=3, n=2))
    ids = later.enqueue_many(payloads)
    assert written == ["account-1", "account-2", "account-3", "account-3"]
    assert [later.get_job(i).unique_key for i in ids] == [  # type: ignore[union-attr]
        "account-3",
        None,
        "account-1",
        "account-2",
        "account-3",
    ]
    assert [i.duplicate for i in ids] == [False, False, False, False, True]
    assert ids[4] == ids[0], "the first in the caller's order holds the key"
    assert ids[:4] == sorted(ids[:4]), "ids in the caller's order"


def test_two_batches_of_the_same_keys_in_opposite_orders_never_deadlock(later_db, monkeypatch):
    """Two transactions enqueue the keys account-1 and account-2, one in
    that order, the other reversed, each held open after its first insert
    until the other made its first one or waits for a lock: both commit,
    one holds both keys, the other's ids are its duplicates, in its order."""
    alias = later_db.alias
    dialect = dialect_for(alias)
    if dialect.single_writer:
        pytest.skip("one writer at a time: two transactions never hold a key each")
    insert = dialect.enqueue.insert_unique
    first_done = {"forward": threading.Event(), "reversed": threading.Event()}

    def waits_for_a_lock(cursor) -> bool:
        # Read afresh: in a transaction, pg_stat_activity repeats its first read.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return bool(cursor.fetchone()[0])

    released_by: dict[str, str] = {}

    def held_open(cursor, job, retention_ms):
        inserted = insert(cursor, job, retention_ms)
        me = threading.current_thread().name
        if not first_done[me].is_set():
            first_done[me].set()
            other = first_done["reversed" if me == "forward" else "forward"]
            released_by[me] = wait_until(
                lambda: (
                    (other.is_set() and "its first insert")
                    or (waits_for_a_lock(cursor) and "its wait for a lock")
                ),
                10,
                "the other batch's first insert, or its wait for this one's key",
            )
        return inserted

    monkeypatch.setattr(dialect.enqueue, "insert_unique", held_open)
    accounts = {"forward": [1, 2], "reversed": [2, 1]}
    returned: dict[str, list[later.JobId]] = {}
    errors: dict[str, BaseException] = {}

    def batch() -> None:
        me = threading.current_thread().name
        try:
            with transaction.atomic(using=alias):
                returned[me] = later.enqueue_many([Refresh(account=a) for a in accounts[me]])
        except Exception as exc:
            errors[me] = exc
        finally:
            connections.close_all()

    run_threads(batch, names=accounts)
    assert errors == {}
    assert sorted(released_by.values()) == ["its first insert", "its wait for a lock"], (
        "one batch waited for the key the other inserted first"
    )
    assert later_db.job_count() == 2
    for name, ids in returned.items():
        keys = [later.get_job(i).unique_key for i in ids]  # type: ignore[union-attr]
        assert keys == [f"account-{a}" for a in accounts[name]]
    held = {i for ids in returned.values() for i in ids if not i.duplicate}
    assert len(held) == 2, "one batch wrote both jobs, the other found both keys held"
    assert sorted(i.duplicate for ids in returned.values() for i in ids) == [
        False,
        False,
        True,
        True,
    ]


def test_crossed_keys_in_separate_calls_can_deadlock_with_operational_error(later_db):
    """The key order holds within one call: two transactions that take the
    same two keys in opposite orders in separate calls each wait for the
    other's. PostgreSQL ends one with deadlock_detected (SQLSTATE 40P01),
    passed through as Django's OperationalError; the other commits."""
    alias = later_db.alias
    if dialect_for(alias).single_writer:
        pytest.skip("one writer at a time: two transactions never hold a key each")
    accounts = {"forward": (1, 2), "reversed": (2, 1)}
    first_done = {name: threading.Event() for name in accounts}
    returned: dict[str, list[later.JobId]] = {}
    errors: dict[str, BaseException] = {}

    def two_calls() -> None:
        me = threading.current_thread().name
        other = first_done["reversed" if me == "forward" else "forward"]
        first, second = accounts[me]
        try:
            with transaction.atomic(using=alias):
                ids = [later.enqueue(Refresh(account=first))]
                first_done[me].set()
                assert other.wait(10)
                ids.append(later.enqueue(Refresh(account=second)))
                returned[me] = ids
        except Exception as exc:
            errors[me] = exc
        finally:
            connections.close_all()

    run_threads(two_calls, names=accounts)
    assert len(errors) == 1 and len(returned) == 1, (errors, returned)
    (error,) = errors.values()
    assert type(error) is OperationalError
    assert isinstance(error.__cause__, psycopg.errors.DeadlockDetected)
    assert error.__cause__.sqlstate == "40P01"
    assert str(error).startswith("deadlock detected")
    (ids,) = returned.values()
    assert sorted(ids) == sorted(i for (i, _) in later_db.rows("SELECT id, stage FROM later_job"))


def run_threads(target: Callable[[], None], *, names: Iterable[str]) -> None:
    """Run ``target`` on one thread per name at once, and wait for them all."""
    threads = [threading.Thread(target=target, name=name) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
