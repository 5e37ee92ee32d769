"""Time as integer epoch milliseconds, and conversions for public values."""

from __future__ import annotations

import datetime as dt
import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def to_datetime(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def from_datetime(value: dt.datetime, *, argument: str = "when") -> int:
    """Convert an aware datetime to epoch ms; naive ones raise ValueError."""
    if not isinstance(value, dt.datetime):
        raise TypeError(f"{argument} must be a datetime, got {type(value).__name__}")
    if value.utcoffset() is None:
        raise ValueError(
            f"{argument}={value.isoformat()} is a naive datetime; pass an aware one "
            "(e.g. django.utils.timezone.now() + timedelta(...))"
        )
    return int(value.timestamp() * 1000)
