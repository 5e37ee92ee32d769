"""Job types with a concurrency limit (docs/how-to/concurrency-limits.md).

Not the app's jobs module: a registered type with a concurrency key makes
its queue's claims the keyed ones, so these are registered only where a
test asks. A worker process loads them with LATER["JOBS_MODULE"] =
"limited_jobs" (through LATER_TEST_SETTINGS); a test in this process calls
``register()`` and ``unregister()`` around itself.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import timedelta

from later_django import JobContext, RetryPolicy, job, registry
from tests.jobapp.jobs import _record


@dataclass
class Keyed:
    """Runs ``seconds`` under concurrency key ``key`` (one at a time), then
    fails while ``fail_until`` is above its attempt."""

    key: str
    seconds: float = 0.0
    n: int = 0
    fail_until: int = 0


def keyed_key(payload: Keyed) -> str:
    return payload.key


def run_keyed(ctx: JobContext, payload: Keyed) -> None:
    _record("keyed-start", ctx, payload.key)
    time.sleep(payload.seconds)
    _record("keyed-end", ctx, payload.key)
    if ctx.attempt < payload.fail_until:
        raise RuntimeError(f"failing until attempt {payload.fail_until}")


@dataclass
class Pair:
    """Runs ``seconds`` under key ``key``, two at a time."""

    key: str
    seconds: float = 0.0


async def run_pair(ctx: JobContext, payload: Pair) -> None:
    _record("pair-start", ctx, payload.key)
    await asyncio.sleep(payload.seconds)
    _record("pair-end", ctx, payload.key)


@dataclass
class Exclusive:
    """A type limited as a whole: one of its jobs at a time."""

    seconds: float = 0.0


async def run_exclusive(ctx: JobContext, payload: Exclusive) -> None:
    _record("exclusive-start", ctx)
    await asyncio.sleep(payload.seconds)
    _record("exclusive-end", ctx)


def register() -> None:
    """Register the types (again: a test unregisters them after itself)."""
    retry = RetryPolicy.fixed(3, timedelta(milliseconds=20))
    job(concurrency_key=keyed_key, retry=retry)(run_keyed)
    job(concurrency_key=lambda payload: f"pair-{payload.key}", concurrency=2)(run_pair)
    job(concurrency=1)(run_exclusive)


def unregister() -> None:
    for payload_type in (Keyed, Pair, Exclusive):
        registry.unregister(payload_type)


register()
