"""consume() under load, on both databases: it keeps every lease it holds
while its handler works, however long a pass over its partitions takes, and
gives a partition up only when one handler call outlasts the lease.

Consumers run on threads of their own; a second member acquires from the
test's thread, on its own connection.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import Counter

from django.db import connections

from later_django import partition_for_key
from later_django import retained_log as log
from tests.helpers import set_later, wait_until

TOPIC = "events"


def stored_offset(later_db, group: str = "g", partition: int = 0) -> int:
    """The group's committed offset as stored."""
    value = later_db.scalar(
        "SELECT committed_offset FROM later_log_consumer "
        "WHERE topic = %s AND consumer_group = %s AND part = %s",
        [TOPIC, group, partition],
    )
    return int(value)  # type: ignore[call-overload]


class ConsumerThread(threading.Thread):
    """consume() on a thread of its own, which closes its connection at the end."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(daemon=True)
        self.kwargs = kwargs
        self.result: log.ConsumeResult | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = log.consume(TOPIC, **self.kwargs)  # type: ignore[arg-type]
        except BaseException as exc:
            self.error = exc
        finally:
            connections.close_all()


# -- consume() renews every lease it holds ----------------------------------------------


def test_consume_keeps_every_lease_while_its_batches_outlast_the_lease(later_db, settings):
    """Four busy partitions, each batch 30% of the lease: a pass over them takes
    longer than the lease, yet a second member polling acquire() gets no
    partition while the consumer works, and every record is handled once.
    (Once every record is handled the consumer releases its leases and ends:
    a take then is no take from a live consumer; one during the last commit
    would show as a lost lease in its result.)"""
    lease = 2.0  # seconds
    per_record = 0.2  # seconds of work per record: a batch of 3 is 30% of the lease
    set_later(settings, RETAINED_LOG_LEASE_DURATION=dt.timedelta(seconds=lease))
    log.register_topic(TOPIC, partitions=4)
    keys: dict[int, list[str]] = {p: [] for p in range(4)}
    for key in (f"k{n}" for n in range(1000)):
        keys[partition_for_key(key, 4)].append(key)
    # Six records per partition: two batches of three each.
    log.append_many(TOPIC, [(key, b"") for p in range(4) for key in keys[p][:6]])
    working = threading.Event()
    handled: list[tuple[int, int]] = []

    def handler(record: log.Record) -> None:
        working.set()
        handled.append((record.partition, record.offset))
        time.sleep(per_record)  # the handler's work

    first = ConsumerThread(
        group="g", member="first", handler=handler, batch_size=3, until_idle=True
    )
    first.start()
    assert working.wait(10), "the consumer to start handling"
    taken: list[int] = []
    while first.is_alive():
        for partition in range(4):
            working_still = len(handled) < 24  # read before the try: the end releases all
            second = log.acquire(TOPIC, group="g", partition=partition, member="second")
            if second is not None:
                if working_still:
                    taken.append(partition)
                second.release()
        first.join(0.1)  # a bounded look at the consumer, between two tries
    first.join()
    assert first.error is None, first.error
    assert taken == [], f"the second member took partitions {taken} from a live consumer"
    assert first.result == log.ConsumeResult(records=24, leases_lost=0)
    twice = [key for key, n in Counter(handled).items() if n > 1]
    assert twice == []
    assert sorted(handled) == [(p, o) for p in range(4) for o in range(6)]


def test_consume_gives_up_a_partition_whose_handler_call_outlasts_the_lease(later_db, settings):
    """One handler call longer than the lease: another member takes the
    partition, and the slow consumer, once its call returns, stops handling
    that batch, commits nothing and counts the lease as lost. The new holder
    reads from the committed offset, so the batch is handled again."""
    set_later(settings, RETAINED_LOG_LEASE_DURATION=dt.timedelta(seconds=1))
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"%d" % n) for n in range(5)])
    slow_started = threading.Event()
    taken_over = threading.Event()
    handled: list[int] = []

    def handler(record: log.Record) -> None:
        handled.append(record.offset)
        if record.offset == 1:
            slow_started.set()
            assert taken_over.wait(10), "the second member to take the partition"

    first = ConsumerThread(
        group="g", member="first", handler=handler, batch_size=5, until_idle=True
    )
    first.start()
    try:
        assert slow_started.wait(10), "the consumer to reach the slow record"
        second = wait_until(
            lambda: log.acquire(TOPIC, group="g", partition=0, member="second"),
            10,
            "the slow consumer's lease to run out",
        )
    finally:
        taken_over.set()
    first.join(10)
    assert not first.is_alive()
    assert first.error is None, first.error
    assert first.result == log.ConsumeResult(records=0, leases_lost=1)
    assert handled == [0, 1]
    assert second.committed_offset == 0
    assert [r.offset for r in log.read(TOPIC, 0, second.committed_offset)] == list(range(5))
    assert stored_offset(later_db) == 0


def test_consume_handles_a_batch_longer_than_the_lease(later_db, settings):
    """One batch whose records together take longer than the lease, each
    record well under it: the consumer keeps the lease throughout."""
    set_later(settings, RETAINED_LOG_LEASE_DURATION=dt.timedelta(seconds=1))
    log.register_topic(TOPIC, partitions=1)
    log.append_many(TOPIC, [("k", b"") for _ in range(8)])
    started = threading.Event()

    def handler(record: log.Record) -> None:
        started.set()
        time.sleep(0.2)  # the handler's work: 1.6 s for the batch

    first = ConsumerThread(
        group="g", member="first", handler=handler, batch_size=8, until_idle=True
    )
    first.start()
    assert started.wait(10), "the consumer to start handling"
    taken = False
    while first.is_alive() and not taken:
        second = log.acquire(TOPIC, group="g", partition=0, member="second")
        taken = second is not None
        first.join(0.1)
    first.join()
    assert not taken, "the second member took the partition from a live consumer"
    assert first.error is None, first.error
    assert first.result == log.ConsumeResult(records=8, leases_lost=0)
