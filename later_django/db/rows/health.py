"""What ``later_health``'s reads return: the servers' heartbeats, the
counters that differ from the rows, the running jobs without a live lease."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerBeat:
    """A server's row of later_server, fresh or not."""

    id: str
    hostname: str
    pid: int
    # NULL: a server of a release before versions were recorded.
    version: str | None
    heartbeat_ms: int


@dataclass(frozen=True, slots=True)
class ServerBeats:
    """Every server of a namespace, and the database's clock read with them."""

    now_ms: int
    servers: tuple[ServerBeat, ...]


@dataclass(frozen=True, slots=True)
class CounterDrift:
    """A (stage, lane) whose counter says ``counted`` jobs where ``found`` are."""

    stage: str
    lane: str
    counted: int
    found: int


@dataclass(frozen=True, slots=True)
class UnleasedJob:
    id: str
    owner: str | None
    # How long ago its lease expired; None without one.
    expired_for_ms: int | None


@dataclass(frozen=True, slots=True)
class UnleasedRunning:
    """How many running jobs have no live lease, and the first few of them."""

    count: int
    examples: tuple[UnleasedJob, ...]
