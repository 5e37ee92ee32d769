"""PostgreSQL LISTEN: idle workers wake on commits, also after the connection is lost."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

import later_django as later
from later_django import wakeup
from later_django.db import dialect_for
from tests.helpers import await_stage, await_until, in_thread, serve, set_later
from tests.jobapp.jobs import Noop, Ordered


def _terminate_listeners(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_idle_workers_wake_on_notify_after_the_listener_was_cut(
    later_db, record, settings, monkeypatch
):
    if not dialect_for(later_db.alias).supports_listen:
        pytest.skip("SQLite cannot notify: its workers watch the commit counter")
    # Polling alone would take a minute: only a notification can start the
    # jobs within the deadlines below.
    set_later(settings, POLL_INTERVAL=timedelta(seconds=60))
    monkeypatch.setattr(wakeup, "_listeners", set())  # no in-process wake-ups either
    monkeypatch.setattr(wakeup, "add_listener", lambda listener: None)

    async def body(server: Any) -> None:
        await asyncio.wait_for(server.notifier.connected.wait(), 10)
        first = await in_thread(later.enqueue, Noop(n=1))
        await await_stage(first, "success", timeout=5)
        assert await in_thread(_terminate_listeners, later_db.alias) == 1

        async def cut() -> bool:
            return not server.notifier.connected.is_set()

        await await_until(cut, 10, "the listener to see its connection cut")
        await asyncio.wait_for(server.notifier.connected.wait(), 10)
        second = await in_thread(later.enqueue, Noop(n=2))
        await await_stage(second, "success", timeout=5)

    serve(body, workers=1)


def test_notify_payloads_count_the_jobs_that_became_ready(later_db):
    if not dialect_for(later_db.alias).supports_listen:
        pytest.skip("SQLite cannot notify")
    import psycopg

    from later_django.db.postgresql import connect_kwargs

    with psycopg.connect(autocommit=True, **connect_kwargs(later_db.alias)) as listener:
        listener.execute("LISTEN later")
        later.enqueue(Noop(n=1))
        later.enqueue_many([Noop(n=n) for n in range(3)])
        later.enqueue_delayed(Noop(n=9), timedelta(hours=1))  # not ready: no notification
        payloads = [note.payload for note in listener.notifies(timeout=2, stop_after=2)]
    assert payloads == ["default", "default\x1f3"]


def test_partition_jobs_notify_their_own_channel_never_the_plain_one(later_db, settings):
    """A ready partition job wakes partition pollers (channel later_partition)
    and no plain worker (channel later); a plain job the other way round."""
    if not dialect_for(later_db.alias).supports_listen:
        pytest.skip("SQLite cannot notify")
    import psycopg

    from later_django.db.postgresql import connect_kwargs

    set_later(settings, TOPICS={"ordered": 8})
    with psycopg.connect(autocommit=True, **connect_kwargs(later_db.alias)) as listener:
        listener.execute("LISTEN later")
        listener.execute("LISTEN later_partition")
        job_id = later.enqueue_to_partition(Ordered("k", 0))
        later.enqueue_to_partition_delayed(Ordered("k", 1), timedelta(hours=1))  # not ready
        later.enqueue(Noop(n=1))
        notes = [(n.channel, n.payload) for n in listener.notifies(timeout=2, stop_after=4)]
    partition = _partition_of(later_db, job_id)
    # The partition by name (migration 0018), and the bare namespace for
    # servers of the previous release.
    assert notes == [
        ("later_partition", "default"),
        ("later_partition", f"default\x1fordered\x1e{partition}"),
        ("later", "default"),
    ]


def _partition_of(later_db, job_id: str) -> int:
    return int(later_db.scalar("SELECT partition FROM later_job WHERE id = %s", [job_id]))


def test_a_finished_partition_head_names_its_partition_and_only_it(later_db, settings):
    """A head that finishes announces its partition, so the server that
    wins it queues it without a look over every partition; a job that only
    starts announces nothing."""
    if not dialect_for(later_db.alias).supports_listen:
        pytest.skip("SQLite cannot notify")
    import psycopg

    from later_django.db.postgresql import connect_kwargs
    from later_django.worker.notifier import partition_noticed

    set_later(settings, TOPICS={"ordered": 8})
    job_id = later.enqueue_to_partition(Ordered("k", 0))
    partition = _partition_of(later_db, job_id)
    with psycopg.connect(autocommit=True, **connect_kwargs(later_db.alias)) as listener:
        listener.execute("LISTEN later_partition")

        async def body(server: Any) -> None:
            await await_stage(job_id, "success")

        serve(body, workers=1)
        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert payloads == ["default", f"default\x1fordered\x1e{partition}"]
    assert [partition_noticed(p, "default") for p in payloads] == [None, ("ordered", partition)]


def test_partition_payloads_are_read_for_this_namespace_only():
    from later_django.worker.notifier import partition_noticed

    assert partition_noticed("ns\x1fledger\x1e7", "ns") == ("ledger", 7)
    assert partition_noticed("ns\x1fa.b\x1e0", "ns") == ("a.b", 0)
    assert partition_noticed("other\x1fledger\x1e7", "ns") is None
    assert partition_noticed("ns", "ns") is None  # the previous release's payload
    assert partition_noticed("ns\x1fledger\x1e", "ns") is None
