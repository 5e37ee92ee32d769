"""``Lease.committed_offset`` follows the transaction its commit ran in, on
both databases: it moves when that transaction commits, and stays where it
was when it rolls back, as the stored offset does.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction

from later_django import retained_log as log

TOPIC = "events"


def stored_offset(later_db, group: str = "g", partition: int = 0) -> int:
    """The group's committed offset as stored."""
    value = later_db.scalar(
        "SELECT committed_offset FROM later_log_consumer "
        "WHERE topic = %s AND consumer_group = %s AND part = %s",
        [TOPIC, group, partition],
    )
    return int(value)  # type: ignore[call-overload]


def test_commit_moves_the_offset_at_once_outside_a_transaction(later_db):
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(4)])
    lease = log.acquire(TOPIC, group="g", partition=0, member="m")
    assert lease is not None
    lease.commit(2)
    assert lease.committed_offset == 2
    assert stored_offset(later_db) == 2


def test_commit_in_a_rolled_back_transaction_leaves_the_offset(later_db):
    """A commit inside an atomic block that raises: neither the stored offset
    nor ``lease.committed_offset`` moves, so reading from it skips nothing."""
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(4)])
    lease = log.acquire(TOPIC, group="g", partition=0, member="m")
    assert lease is not None
    with pytest.raises(RuntimeError), transaction.atomic(using=later_db.alias):
        records = log.read(TOPIC, 0, lease.committed_offset, 3)
        lease.commit(records[-1].offset + 1)
        raise RuntimeError("the caller's own write failed")
    assert lease.committed_offset == 0
    assert stored_offset(later_db) == 0
    assert [r.offset for r in log.read(TOPIC, 0, lease.committed_offset)] == [0, 1, 2, 3]


def test_commit_in_a_rolled_back_savepoint_leaves_the_offset(later_db):
    """An inner block that rolls back undoes its commit even when the outer
    block commits."""
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(4)])
    lease = log.acquire(TOPIC, group="g", partition=0, member="m")
    assert lease is not None
    with transaction.atomic(using=later_db.alias):
        lease.commit(1)
        with pytest.raises(RuntimeError), transaction.atomic(using=later_db.alias):
            lease.commit(3)
            raise RuntimeError
    assert lease.committed_offset == 1
    assert stored_offset(later_db) == 1


def test_commit_in_a_committed_transaction_moves_the_offset_after_it(later_db):
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(4)])
    lease = log.acquire(TOPIC, group="g", partition=0, member="m")
    assert lease is not None
    with transaction.atomic(using=later_db.alias):
        lease.commit(3)
        assert lease.committed_offset == 0  # not committed yet
    assert lease.committed_offset == 3
    assert stored_offset(later_db) == 3


def test_acommit_offset_follows_the_transaction(later_db):
    """The async twin joins the transaction its sync thread has open: the
    offset moves when it commits and stays when it rolls back."""

    async def main() -> None:
        try:
            await scenario()
        finally:
            await sync_to_async(connections.close_all)()

    async def scenario() -> None:
        await log.aregister_topic(TOPIC, partitions=1)
        await log.aappend_many(TOPIC, [("k", b"%d" % n) for n in range(4)])
        lease = await log.aacquire(TOPIC, group="g", partition=0, member="m")
        assert lease is not None
        await lease.acommit(1)
        assert lease.committed_offset == 1

        block = transaction.atomic(using=later_db.alias)
        await sync_to_async(block.__enter__)()
        await lease.acommit(3)
        error = RuntimeError("the caller's own write failed")
        await sync_to_async(block.__exit__)(RuntimeError, error, None)
        assert lease.committed_offset == 1
        assert await sync_to_async(stored_offset)(later_db) == 1

        block = transaction.atomic(using=later_db.alias)
        await sync_to_async(block.__enter__)()
        await lease.acommit(3)
        assert lease.committed_offset == 1
        await sync_to_async(block.__exit__)(None, None, None)
        assert lease.committed_offset == 3
        assert await sync_to_async(stored_offset)(later_db) == 3

    asyncio.run(main())


def test_consume_inside_a_transaction_reads_on_from_its_own_commits(later_db):
    """consume() inside an atomic block (all of it one transaction) reads on
    from the offsets it committed, though the leases' offsets move only when
    the block commits: every record once, then it returns."""
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(7)])
    seen: list[int] = []

    def handler(record: log.Record) -> None:
        assert record.offset not in seen, f"offset {record.offset} handled twice"
        seen.append(record.offset)

    with transaction.atomic(using=later_db.alias):
        result = log.consume(
            TOPIC, group="g", member="m", handler=handler, batch_size=3, until_idle=True
        )
    assert result == log.ConsumeResult(records=7, leases_lost=0)
    assert seen == list(range(7))
    assert stored_offset(later_db) == 7
