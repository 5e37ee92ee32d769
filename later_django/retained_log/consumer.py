"""``consume()``: the common case of a consumer group member, as one loop.

It leases what partitions it may, reads each from the group's committed
offset, runs the handler on every record and commits after each batch.
Delivery is at least once: records handled but not committed are read again
by the next holder.
"""

from __future__ import annotations

import contextlib
import logging
import math
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
    position: int  # the next offset to read: the committed offset
    renewed_at: float  # time.monotonic() just before the last acquire, renew or commit


class _Leases:
    """The leases one ``consume()`` call holds, and their renewal.

    A renewal sets the expiry to the database's now plus the lease duration,
    and ``renewed_at`` is taken before the statement is sent, so a lease
    never expires before ``renewed_at`` plus the duration.
    """

    def __init__(self, topic: str, *, group: str, member: str) -> None:
        self.topic = topic
        self.group = group
        self.member = member
        self.renew_every = conf.seconds("RETAINED_LOG_LEASE_DURATION") / 3
        self.held: dict[int, _Held] = {}
        self.lost = 0
        self._due = math.inf  # time.monotonic() of the next renewal

    def take(self, partitions: Iterable[int]) -> None:
        """Acquire the partitions not held yet that nobody else holds."""
        for partition in partitions:
            if partition in self.held:
                continue
            self.renew_due()  # one acquire per partition: many take a while
            started = time.monotonic()
            lease = acquire(self.topic, group=self.group, partition=partition, member=self.member)
            if lease is not None:
                self.held[partition] = _Held(lease, lease.committed_offset, started)
                self._due = min(self._due, started + self.renew_every)

    def renew_due(self) -> None:
        """Renew every held lease a third of whose duration has passed since
        its last renewal; drop (and count) the ones another member took."""
        if time.monotonic() < self._due:
            return
        for partition, entry in list(self.held.items()):
            started = time.monotonic()
            if started - entry.renewed_at < self.renew_every:
                continue
            try:
                entry.lease.renew()
            except LeaseLost as exc:
                self.drop(partition, exc)
                continue
            entry.renewed_at = started
        self._due = min(
            (entry.renewed_at + self.renew_every for entry in self.held.values()),
            default=math.inf,
        )

    def commit(self, entry: _Held, next_offset: int) -> None:
        """Commit ``next_offset`` under the entry's lease, which renews it."""
        started = time.monotonic()
        entry.lease.commit(next_offset)
        # Tracked here, not read back from the lease: inside a caller's
        # transaction the lease's offset moves only when that commits.
        entry.position = next_offset
        entry.renewed_at = started

    def drop(self, partition: int, exc: LeaseLost) -> None:
        del self.held[partition]
        self.lost += 1
        logger.warning("%s", exc, extra={"action": "log_lease_lost", "partition": partition})

    def release_all(self) -> None:
        for entry in self.held.values():
            # Best effort: an unreleased lease expires on its own.
            with contextlib.suppress(DatabaseError):
                entry.lease.release()
        self.held.clear()


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

    Leases are renewed before a handler call once a third of
    RETAINED_LOG_LEASE_DURATION has passed, so a batch may take any time but
    one handler call must take less than two thirds of it; past that another
    member may take the partition, dropped here at the next renewal or commit.
    """
    count = partitions_of(topic)
    wanted = (
        list(range(count))
        if partitions is None
        else [check_partition(topic, p) for p in partitions]
    )
    check_count(batch_size, "batch_size", low=1, high=MAX_READ_LIMIT)
    leases = _Leases(topic, group=group, member=member)
    # An idle wait longer than the renewal interval would let leases lapse.
    wait = min(idle_wait, leases.renew_every)
    handled = 0
    try:
        while stop is None or not stop.is_set():
            leases.take(wanted)
            busy = False
            for partition in list(leases.held):
                leases.renew_due()
                if partition not in leases.held:
                    continue
                try:
                    n = _step(leases, partition, handler, batch_size)
                except LeaseLost as exc:
                    leases.drop(partition, exc)
                    continue
                handled += n
                busy = busy or n > 0
            if not busy:
                if until_idle:
                    break
                if stop is not None:
                    stop.wait(wait)
                else:
                    time.sleep(wait)
    finally:
        leases.release_all()
    return ConsumeResult(records=handled, leases_lost=leases.lost)


def _step(
    leases: _Leases, partition: int, handler: Callable[[Record], object], batch_size: int
) -> int:
    """Handle one batch of a held partition; return how many records were
    handled and committed."""
    entry = leases.held[partition]
    records = read(leases.topic, partition, entry.position, batch_size)
    for record in records:
        # Renew before every call, not once a batch: only one call's time
        # separates two renewals of every lease, however long the batch.
        leases.renew_due()
        if leases.held.get(partition) is not entry:
            return 0  # taken over meanwhile: the batch is the new holder's
        try:
            handler(record)
        except BaseException:
            if record.offset > entry.position:
                # Keep what was done; the failing record is read again.
                with contextlib.suppress(LeaseLost):
                    leases.commit(entry, record.offset)
            raise
    if records:
        leases.commit(entry, records[-1].offset + 1)
    return len(records)
