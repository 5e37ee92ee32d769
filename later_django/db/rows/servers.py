"""What the server and lease operations take: a server's heartbeat and stats
flush, and the generic epoch-fenced lease.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """A running server, as ``later_server`` records it."""

    server_id: str
    namespace: str
    hostname: str
    pid: int
    workers: int
    # Runs partition pollers (LATER["TOPICS"] is set): may win partitions.
    topics: bool = False
    # The queues it serves, comma-separated.
    queues: str = "default"
    # The release it runs (later_django.__version__), at most 64 characters.
    version: str | None = None


@dataclass(frozen=True, slots=True)
class StatRow:
    """One flush: what this server's workers did since the previous one."""

    started: int
    succeeded: int
    retried: int
    failed: int
    regular_waits: str
    regular_sum_ms: int
    regular_max_ms: int
    partition_waits: str
    partition_sum_ms: int
    partition_max_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRequest:
    """Take or renew the lease ``name`` for ``owner`` until the database's now
    plus ``ttl_ms``."""

    namespace: str
    name: str
    owner: str
    ttl_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldLease:
    """The lease ``name`` as (``owner``, ``epoch``) holds it: the fence of
    writes made under it."""

    namespace: str
    name: str
    owner: str
    epoch: int
