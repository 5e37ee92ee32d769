"""Retry policies: how many times a failed job is retried, and after what delay."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

DEFAULT_BASE_DELAY = timedelta(seconds=1)
DEFAULT_MAX_DELAY = timedelta(hours=1)
DEFAULT_JITTER = 0.1  # +/- 10 % of the computed delay


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a failed attempt is retried. Build one with the class methods."""

    retries: int
    kind: Literal["exponential", "fixed"] = "exponential"
    delay: timedelta = DEFAULT_BASE_DELAY
    factor: float = 2.0
    max_delay: timedelta = DEFAULT_MAX_DELAY
    jitter: float = DEFAULT_JITTER

    def __post_init__(self) -> None:
        # Checked at run time too: policies are often built from settings.
        retries: object = self.retries
        delay: object = self.delay
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {self.retries!r}")
        if not isinstance(delay, timedelta) or delay < timedelta(0):
            raise ValueError(f"delay must be a timedelta >= 0, got {self.delay!r}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be within 0..1, got {self.jitter!r}")

    @classmethod
    def exponential(
        cls,
        retries: int = 6,
        *,
        base: timedelta = DEFAULT_BASE_DELAY,
        factor: float = 2.0,
        max_delay: timedelta = DEFAULT_MAX_DELAY,
        jitter: float = DEFAULT_JITTER,
    ) -> RetryPolicy:
        """Retry ``retries`` times after base, base*factor, ... (capped, jittered)."""
        return cls(
            retries=retries,
            kind="exponential",
            delay=base,
            factor=factor,
            max_delay=max_delay,
            jitter=jitter,
        )

    @classmethod
    def fixed(cls, retries: int, delay: timedelta) -> RetryPolicy:
        """Retry ``retries`` times, each after the same ``delay``."""
        return cls(retries=retries, kind="fixed", delay=delay, jitter=0.0)

    @classmethod
    def no_retries(cls) -> RetryPolicy:
        """Fail on the first error."""
        return cls(retries=0, kind="fixed", delay=timedelta(0), jitter=0.0)

    def next_delay(self, attempt: int) -> timedelta | None:
        """Return the delay before the retry after failed ``attempt`` (1-based),
        or None when retries are exhausted."""
        if attempt > self.retries:
            return None
        if self.kind == "fixed":
            return self.delay
        seconds = min(
            self.delay.total_seconds() * self.factor ** (attempt - 1),
            self.max_delay.total_seconds(),
        )
        if self.jitter:
            seconds *= 1 + random.uniform(-self.jitter, self.jitter)
        return timedelta(seconds=max(seconds, 0.0))

    def to_json(self) -> str:
        return json.dumps(
            {
                "retries": self.retries,
                "kind": self.kind,
                "delay": self.delay.total_seconds(),
                "factor": self.factor,
                "max_delay": self.max_delay.total_seconds(),
                "jitter": self.jitter,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> RetryPolicy:
        data: dict[str, Any] = json.loads(text)
        return cls(
            retries=int(data["retries"]),
            kind=data["kind"],
            delay=timedelta(seconds=data["delay"]),
            factor=float(data["factor"]),
            max_delay=timedelta(seconds=data["max_delay"]),
            jitter=float(data["jitter"]),
        )


def default_policy() -> RetryPolicy:
    """The server-wide policy: DEFAULT_RETRY_POLICY, else DEFAULT_RETRY_COUNT."""
    from later_django.conf import conf

    policy = conf.DEFAULT_RETRY_POLICY
    if isinstance(policy, RetryPolicy):
        return policy
    return RetryPolicy.exponential(int(conf.DEFAULT_RETRY_COUNT))
