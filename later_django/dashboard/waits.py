"""Dispatch waits as log-scale histograms that add up across servers.

A wait of ``w`` ms falls in bucket ``ceil(10 * log10(w))`` (bucket 0 for
1 ms or less): ten buckets a decade, so a percentile read from the merged
histogram is the upper bound of its bucket, at most 26 % above the truth.
The largest wait and the sum are kept exactly beside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

PER_DECADE = 10


def bucket_of(wait_ms: float) -> int:
    if wait_ms <= 1:
        return 0
    return math.ceil(PER_DECADE * math.log10(wait_ms))


def upper_ms(bucket: int) -> float:
    """The largest wait bucket ``bucket`` holds."""
    return 10 ** (bucket / PER_DECADE)


def encode(counts: dict[int, int]) -> str:
    """``{"3":1,"20":2}``: JSON, which the overview decodes at C speed for
    every server's row of the last minute."""
    return json.dumps(
        {str(bucket): n for bucket, n in sorted(counts.items())}, separators=(",", ":")
    )


def decode(text: str) -> dict[int, int]:
    return {int(bucket): n for bucket, n in json.loads(text or "{}").items()}


@dataclass(frozen=True, slots=True)
class WaitSummary:
    count: int
    avg_ms: float
    p50_ms: float
    p95_ms: float
    max_ms: float


@dataclass(slots=True)
class Waits:
    """A histogram of waits with their count, sum and maximum."""

    counts: dict[int, int]
    sum_ms: int = 0
    max_ms: int = 0

    @classmethod
    def empty(cls) -> Waits:
        return cls({})

    def add(self, wait_ms: int) -> None:
        wait_ms = max(wait_ms, 0)  # a host clock behind the database's
        bucket = bucket_of(wait_ms)
        self.counts[bucket] = self.counts.get(bucket, 0) + 1
        self.sum_ms += wait_ms
        self.max_ms = max(self.max_ms, wait_ms)

    def merge(self, text: str, sum_ms: int, max_ms: int) -> None:
        if text in ("", "{}"):
            return  # no job of this lane in the row
        counts = self.counts
        for bucket, n in json.loads(text).items():
            key = int(bucket)
            counts[key] = counts.get(key, 0) + n
        self.sum_ms += sum_ms
        self.max_ms = max(self.max_ms, max_ms)

    def summary(self) -> WaitSummary | None:
        count = sum(self.counts.values())
        if not count:
            return None
        return WaitSummary(
            count=count,
            avg_ms=self.sum_ms / count,
            p50_ms=self._percentile(0.50, count),
            p95_ms=self._percentile(0.95, count),
            max_ms=float(self.max_ms),
        )

    def _percentile(self, q: float, count: int) -> float:
        rank = math.ceil(q * count)
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return min(upper_ms(bucket), float(self.max_ms))
        return float(self.max_ms)


def merged(rows: Iterable[tuple[str, int, int]]) -> Waits:
    waits = Waits.empty()
    for text, sum_ms, max_ms in rows:
        waits.merge(text, sum_ms, max_ms)
    return waits
