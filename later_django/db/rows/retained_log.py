"""What the retained log's operations take and return: topics, appends and
reads of a partition, pruning, and consumer groups' fenced leases and offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# -- parameters ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LogTopicRow:
    """A retained-log topic as stored; ``retention_ms`` None keeps records forever."""

    name: str
    partitions: int
    retention_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPartitionKey:
    """One partition of a retained-log topic."""

    namespace: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAdvance:
    """Reserve ``count`` offsets of ``key``'s partition, whose topic must be
    stored with ``partitions`` partitions."""

    key: LogPartitionKey
    count: int
    partitions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAppend:
    """Records to append to ``topic`` (stored with ``partitions``
    partitions), grouped by partition in ascending order: each group's
    records take consecutive offsets in the order given."""

    namespace: str
    topic: str
    partitions: int
    groups: Sequence[tuple[int, Sequence[tuple[bytes, bytes]]]]

    @property
    def count(self) -> int:
        return sum(len(records) for _, records in self.groups)


class NewLogRecord(NamedTuple):
    """A record to store at ``offset`` of ``partition`` (a named tuple:
    append_many builds thousands)."""

    partition: int
    offset: int
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRead:
    """Up to ``limit`` records of ``key``'s partition from ``from_offset`` on."""

    key: LogPartitionKey
    from_offset: int
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPrune:
    """Delete the records of ``key``'s partition older than ``older_than_ms``,
    looking at its first ``limit`` records only."""

    key: LogPartitionKey
    older_than_ms: int
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConsumerKey:
    """A consumer group's place in one partition of a topic."""

    namespace: str
    topic: str
    group: str
    partition: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLeaseRequest:
    """Take ``key``'s lease for ``member`` until the database's now plus ``ttl_ms``."""

    key: LogConsumerKey
    member: str
    ttl_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogFence:
    """A consumer lease as its holder knows it: writes hold only at ``epoch``."""

    key: LogConsumerKey
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogCommit:
    """Store ``next_offset`` under ``fence`` and renew the lease for ``ttl_ms``."""

    fence: LogFence
    next_offset: int
    ttl_ms: int


# -- rows ------------------------------------------------------------------------------


class StoredRecord(NamedTuple):
    """A record as read back, its time on the database's clock."""

    offset: int
    key: bytes
    value: bytes
    appended_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAcquired:
    """A lease just taken: its epoch and the group's committed offset."""

    epoch: int
    committed_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConsumerState:
    """A consumer row as stored, and its partition's end (next offset)."""

    epoch: int
    committed_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLag:
    """Records of ``partition`` a group has not committed yet."""

    group: str
    partition: int
    lag: int
