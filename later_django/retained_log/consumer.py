"""``consume()``: the common case of a consumer group member, as one loop.

It takes the leases of the partitions it may, reads each from the group's
committed offset, runs the handler on every record and commits after each
batch (which renews the lease); idle leases are renewed before a third of
their duration has passed. Delivery is at least once: a member that dies
after handling records but before committing them leaves them to the next
holder, which reads from the committed offset.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import DatabaseError

from later_django.conf import conf
from later_django.exceptions import LeaseLost
from later_django.retained_log.groups import Lease, acquire
from later_django.retained_log.reads import read
from later_django.retained_log.records import MAX_READ_LIMIT, Record, check_count
from later_django.retained_log.topics import check_partition, partitions_of

logger = logging.getLogger(__name__)

# Seconds between two looks at partitions that had nothing new.
IDLE_WAIT = 0.25


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeResult:
    """What one ``consume()`` call did: records handled and committed, and
    leases it lost to another member (their records are that member's now)."""

    records: int
    leases_lost: int


@dataclass(slots=True)
class _Held:
    lease: Lease
    renewed_at: float  # time.monotonic() of the last acquire, renew or commit


def consume(
    topic: str,
    *,
    group: str,
    member: str,
    handler: Callable[[Record], object],
    partitions: Iterable[int] | None = None,
    batch_size: int = 100,
    until_idle: bool = False,
    stop: threading.Event | None = None,
    idle_wait: float = IDLE_WAIT,
) -> ConsumeResult:
    """Run ``handler(record)`` on every record of ``topic`` that ``group`` has
    not committed, as ``member``, on the partitions it can lease (all, or
    ``partitions``). Partitions another member holds are retried every pass.

    Commits after each batch of up to ``batch_size`` records of a partition.
    If the handler raises, the records before the failing one are committed,
    the leases are released and the error propagates: the failing record is
    read again by the next holder. Returns when ``stop`` is set, or with
    ``until_idle`` once a pass over the held partitions found nothing new.
    A batch's handling must take well under RETAINED_LOG_LEASE_DURATION:
    past it another member may take the partition and commit first.
    """
    count = partitions_of(topic)
    wanted = (
        list(range(count))
        if partitions is None
        else [check_partition(topic, p) for p in partitions]
    )
    check_count(batch_size, "batch_size", low=1, high=MAX_READ_LIMIT)
    renew_every = conf.seconds("RETAINED_LOG_LEASE_DURATION") / 3
    held: dict[int, _Held] = {}
    handled = lost = 0
    try:
        while stop is None or not stop.is_set():
            for partition in wanted:
                if partition not in held:
                    lease = acquire(topic, group=group, partition=partition, member=member)
                    if lease is not None:
                        held[partition] = _Held(lease, time.monotonic())
            busy = False
            for partition, entry in list(held.items()):
                try:
                    n = _step(entry, handler, batch_size, renew_every)
                except LeaseLost as exc:
                    del held[partition]
                    lost += 1
                    logger.warning(
                        "%s", exc, extra={"action": "log_lease_lost", "partition": partition}
                    )
                    continue
                handled += n
                busy = busy or n > 0
            if not busy:
                if until_idle:
                    break
                if stop is not None:
                    stop.wait(idle_wait)
                else:
                    time.sleep(idle_wait)
    finally:
        for entry in held.values():
            # Best effort: an unreleased lease expires on its own.
            with contextlib.suppress(DatabaseError):
                entry.lease.release()
    return ConsumeResult(records=handled, leases_lost=lost)


def _step(
    entry: _Held, handler: Callable[[Record], object], batch_size: int, renew_every: float
) -> int:
    """Handle one batch of a held partition, or renew its lease when idle
    for a while; return how many records were handled."""
    lease = entry.lease
    records = read(lease.topic, lease.partition, lease.committed_offset, batch_size)
    if not records:
        if time.monotonic() - entry.renewed_at >= renew_every:
            lease.renew()
            entry.renewed_at = time.monotonic()
        return 0
    for record in records:
        try:
            handler(record)
        except BaseException:
            if record.offset > lease.committed_offset:
                # Keep what was done; the failing record is read again.
                with contextlib.suppress(LeaseLost):
                    lease.commit(record.offset)
            raise
    lease.commit(records[-1].offset + 1)
    entry.renewed_at = time.monotonic()
    return len(records)
