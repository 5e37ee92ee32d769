"""What the partition operations take and return: a partition job's slot, a
poller's claim of a partition head, and the head's completion or forced failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from later_django.types import ClaimedJob, PartitionLane

# -- parameters ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionClaimRequest:
    """A poller's claim of a partition's head: its lease for ``owner``
    (``partition_lease_ms``), the head's job lease (``job_lease_ms``), and
    how long a silent owner's heartbeat stays live (``server_ttl_ms``)."""

    lane: PartitionLane
    owner: str
    partition_lease_ms: int
    job_lease_ms: int
    server_ttl_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadFailure:
    """force_fail_partition_head: fail the head of ``lane``'s partition (only
    if it is ``job_id``, when given) with ``error``."""

    lane: PartitionLane
    error: str
    retention_ms: int
    job_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionCompletion:
    """The success of ``job``, a partition head ``owner`` claimed."""

    job: ClaimedJob
    owner: str
    retention_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadSuccesses:
    """The successes of ``heads``, partition heads ``owner`` claimed, each
    stored behind its claim and its partition's fence. Where ``chain``
    (one flag per head) is true, the partition's next head, if it is
    ready, is claimed for ``owner`` with them (a job lease of
    ``job_lease_ms``): a partition running head after head pays one
    statement a job, not a success and a claim."""

    owner: str
    heads: Sequence[ClaimedJob]
    chain: Sequence[bool]
    retention_ms: int
    job_lease_ms: int = 0


# -- rows ------------------------------------------------------------------------------


class HeadsStored(NamedTuple):
    """HeadSuccesses stored: the heads whose fences held, how many waiting
    continuations became ready, and the next heads claimed (each with its
    partition's lane and epoch)."""

    done_ids: list[str]
    released: int
    next_heads: list[ClaimedJob]


class PartitionSlot(NamedTuple):
    """Where a partition job goes: its partition and its sequence there."""

    lane: PartitionLane
    sequence: int


class PartitionClaim(NamedTuple):
    """A partition lease taken or kept at ``epoch``, and the head claimed
    under it (None when the head is not ready)."""

    epoch: int
    job: ClaimedJob | None


class JobPlace(NamedTuple):
    """Where a job is: its topic and partition (both None for a plain job)."""

    topic: str | None
    partition: int | None


class PartitionHead(NamedTuple):
    """A partition and its head job (None when it has no unfinished job)."""

    topic: str
    partition: int
    job_id: str | None
    stage: str | None
