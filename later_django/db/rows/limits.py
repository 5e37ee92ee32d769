"""What the limited claims take and return (docs/how-to/rate-limits.md,
docs/how-to/concurrency-limits.md)."""

from __future__ import annotations

from dataclasses import dataclass

from later_django.limits import QueueLimits, RateLimit
from later_django.types import ClaimedJob

from .jobs import ClaimRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitedClaimRequest:
    """``claim`` on a queue whose claims keep ``limits``."""

    claim: ClaimRequest
    limits: QueueLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitedClaim:
    """What a limited claim took, and, when the queue's rate limit is spent
    in the window it counted in, how long until that window ends
    (``retry_in_ms``, on the database's clock): no claim of the queue with
    the same limit can start a job before then."""

    jobs: list[ClaimedJob]
    retry_in_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RateWindow:
    """The window a rate-limited claim counts in (the queue's row's): its
    end (epoch ms), the starts counted in it, and the database's clock when
    read."""

    end_ms: int
    started: int
    now_ms: int

    def remaining(self, rate: RateLimit) -> int:
        """Starts left in this window for a claim that keeps ``rate``."""
        return max(rate.count - self.started, 0)

    def ends_in_ms(self) -> int:
        """Milliseconds until this window ends (at least 1)."""
        return max(self.end_ms - self.now_ms, 1)
