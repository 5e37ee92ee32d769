"""Consumer groups: one member at a time holds a partition's lease, fenced by
an epoch, and commits the group's offset under it.

A lease lasts ``LATER["RETAINED_LOG_LEASE_DURATION"]`` on the database's
clock unless renewed (a commit renews it too). Every new holder gets a
higher epoch, and every write under a lease names the epoch it holds, so a
superseded holder can change nothing: it gets LeaseLost instead.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import transaction

from later_django.conf import conf
from later_django.db.rows import LogCommit, LogConsumerKey, LogFence, LogLeaseRequest
from later_django.exceptions import LeaseLost
from later_django.retained_log.connection import session
from later_django.retained_log.records import check_count, check_name
from later_django.retained_log.topics import check_partition


class Lease:
    """A member's lease on one partition for its group.

    ``committed_offset`` is the next offset the group reads: records below
    it are done. Inside ``transaction.atomic()`` a commit joins the caller's
    transaction, so the offset can commit together with the writes its
    records caused; ``committed_offset`` then moves when that transaction
    commits, and not at all when it rolls back.
    """

    def __init__(self, key: LogConsumerKey, *, member: str, epoch: int, committed: int) -> None:
        self.key = key
        self.member = member
        self.epoch = epoch
        self.committed_offset = committed

    @property
    def topic(self) -> str:
        return self.key.topic

    @property
    def group(self) -> str:
        return self.key.group

    @property
    def partition(self) -> int:
        return self.key.partition

    def __repr__(self) -> str:
        return (
            f"<Lease {self.group} on {self.topic}/{self.partition} by {self.member} "
            f"epoch {self.epoch} committed {self.committed_offset}>"
        )

    def commit(self, next_offset: int) -> None:
        """Store ``next_offset`` as the group's next offset to read, and renew
        the lease.

        ``committed_offset`` follows the stored offset: outside an atomic
        block on the LATER database it moves at once; inside one, when the
        outermost block commits (unchanged if the block, or the savepoint the
        commit ran in, rolls back).

        Raises LeaseLost (nothing stored) when a newer holder took the lease,
        and ValueError when ``next_offset`` is behind the committed offset or
        past the partition's end.
        """
        check_count(next_offset, "next_offset", low=0)
        fence = LogFence(key=self.key, epoch=self.epoch)
        commit = LogCommit(fence=fence, next_offset=next_offset, ttl_ms=_ttl_ms())
        with session() as s:
            if s.dialect.log.log_consumer_commit(s.cursor, commit):
                self._committed(next_offset)
                return
            state = s.dialect.log.log_consumer_state(s.cursor, self.key)
        if state is None or state.epoch != self.epoch:
            raise self._lost("commit")
        if next_offset < state.committed_offset:
            raise ValueError(
                f"next_offset {next_offset} is behind the committed offset "
                f"{state.committed_offset} of group {self.group!r} on {self.topic}/"
                f"{self.partition}; commit only forward (replay by reading from an "
                "earlier offset instead)"
            )
        raise ValueError(
            f"next_offset {next_offset} is past the end of {self.topic}/{self.partition} "
            f"({state.end_offset} records appended); commit the offset after the last "
            "record read: records[-1].offset + 1"
        )

    def renew(self) -> None:
        """Extend the lease by the lease duration; LeaseLost when a newer
        holder took it."""
        fence = LogFence(key=self.key, epoch=self.epoch)
        with session() as s:
            renewed = s.dialect.log.log_consumer_renew(s.cursor, fence, _ttl_ms())
        if not renewed:
            raise self._lost("renew")

    def release(self) -> bool:
        """Let the lease go now so another member can take it at once; return
        False when it was already taken over. The committed offset stays."""
        with session() as s:
            return s.dialect.log.log_consumer_release(
                s.cursor, LogFence(key=self.key, epoch=self.epoch)
            )

    async def acommit(self, next_offset: int) -> None:
        """The async twin of :meth:`commit`; it joins a transaction open on
        the thread ``sync_to_async`` runs it on."""
        await sync_to_async(self.commit)(next_offset)

    async def arenew(self) -> None:
        """The async twin of :meth:`renew`."""
        await sync_to_async(self.renew)()

    async def arelease(self) -> bool:
        """The async twin of :meth:`release`."""
        return await sync_to_async(self.release)()

    def _committed(self, next_offset: int) -> None:
        alias = conf.database
        if not transaction.get_connection(alias).in_atomic_block:
            self.committed_offset = next_offset
            return

        def moved() -> None:
            self.committed_offset = next_offset

        # The UPDATE is part of the caller's transaction: the offset in
        # memory moves with it, so a rollback leaves nothing to skip.
        transaction.on_commit(moved, using=alias)

    def _lost(self, action: str) -> LeaseLost:
        return LeaseLost(
            f"{action} refused: the lease of group {self.group!r} on {self.topic}/"
            f"{self.partition} held by {self.member!r} at epoch {self.epoch} was taken "
            "over by a newer holder; stop working on this partition (its records from "
            "the committed offset on are the new holder's)"
        )


def acquire(topic: str, *, group: str, partition: int, member: str) -> Lease | None:
    """Take the lease of ``partition`` for ``group`` as ``member``; return it,
    or None while another member holds it.

    Each take is a new, higher epoch. A member that takes a partition it
    already holds (a restarted process under the same name) takes over at
    once, and its earlier Lease gets LeaseLost.
    """
    check_name(group, "group")
    check_name(member, "member")
    check_partition(topic, partition)
    with session() as s:
        key = LogConsumerKey(namespace=s.namespace, topic=topic, group=group, partition=partition)
        request = LogLeaseRequest(key=key, member=member, ttl_ms=_ttl_ms())
        taken = s.dialect.log.log_consumer_acquire(s.cursor, request)
    if taken is None:
        return None
    return Lease(key, member=member, epoch=taken.epoch, committed=taken.committed_offset)


def _ttl_ms() -> int:
    return conf.millis("RETAINED_LOG_LEASE_DURATION")
