"""Chaos workload payloads and handlers. Every run is recorded.

Each handler run appends whole lines, with one ``O_APPEND`` write each, to
``$CHAOS_RECORD_DIR/rec-<pid>.txt``::

    S <job_id> <attempt> <pid> <time> <kind> <n>            first thing in the handler
    S <job_id> <attempt> <pid> <time> <kind> <n> <key> <seq>  the same, of a partitioned job
    E <job_id> <attempt> <pid> <time> ok|raise|cancelled     last thing

``cancelled``: an async handler (``awork``, ``ahang``) was cancelled by its
worker (lease lost, local lease deadline passed, shutdown); the line is
written when the ``CancelledError`` reaches the handler, so its time is when
the run really stopped. Sync handlers never write ``cancelled``: a thread
cannot be stopped, and one its worker abandoned writes its own end line
when it ends. No end line: the process was killed, or the run never ended
(a ``hang``, an ``ahang`` nobody cancelled).

``ordered`` (sync) and ``aordered`` (async) runs are partitioned jobs of
topic ``chaos-ordered``: ``key`` is their partition key and ``seq`` their
place among the jobs of that key, in enqueue order, so the report can check
that each key's jobs ran one at a time, in order.

``tick`` runs are occurrences of the recurring schedules the runner
registers (``Tick``; ``n`` is the schedule's index in the profile).

The runner reads these files back to find duplicate and overlapping runs
and waits; worker logs only tell it which handlers a worker abandoned or
cancelled, never when a run started or ended. Every payload carries
``n``, the workload's own number for the job, so rows can be matched to the
plan even when an enqueue had to be retried.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from later_django import JobContext, RetryPolicy, job
from tests.chaos.topics import ORDERED_TOPIC

# Generous: a job killed or paused mid-run several times still has retries left,
# so its expected outcome does not depend on where the faults fall.
WORK_RETRY = RetryPolicy.fixed(20, timedelta(milliseconds=100))
# Flaky jobs fail until attempt ``succeed_on``; with 4 retries (5 attempts) a
# job with succeed_on <= 3 succeeds even if two of its attempts are killed.
FLAKY_RETRIES = 4
FLAKY_RETRY = RetryPolicy.fixed(FLAKY_RETRIES, timedelta(milliseconds=200))
HANG_RETRY = RetryPolicy.fixed(1000, timedelta(milliseconds=100))

_fd: int | None = None
_fd_key: tuple[int, str] | None = None


def _write(line: str) -> None:
    global _fd, _fd_key
    folder = os.environ.get("CHAOS_RECORD_DIR")
    if not folder:
        return
    key = (os.getpid(), folder)
    if _fd_key != key:  # first run in this process
        path = os.path.join(folder, f"rec-{key[0]}.txt")
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _fd_key = key
    assert _fd is not None
    os.write(_fd, line.encode())  # one O_APPEND write: whole lines only


def _family() -> int:
    """The pid of the worker process a fault hits: this one, or with
    later_worker --processes, its parent (faults hit a parent's whole
    process group)."""
    return int(os.environ.get("LATER_WORKER_PARENT") or os.getpid())


def record_start(ctx: JobContext, kind: str, n: int, place: str = "") -> None:
    """``place``: ``<key> <seq>`` of a partitioned job, else empty."""
    tail = f" {place}" if place else ""
    _write(f"S {ctx.job_id} {ctx.attempt} {_family()} {time.time():.6f} {kind} {n}{tail}\n")


def record_end(ctx: JobContext, outcome: str) -> None:
    _write(f"E {ctx.job_id} {ctx.attempt} {_family()} {time.time():.6f} {outcome}\n")


@dataclass
class Work:
    """The bulk: a sync handler that sleeps ``sleep_ms`` (usually 0)."""

    n: int
    sleep_ms: int = 0


@job(retry=WORK_RETRY)
def run_work(ctx: JobContext, payload: Work) -> None:
    record_start(ctx, "work", payload.n)
    if payload.sleep_ms:
        time.sleep(payload.sleep_ms / 1000)
    record_end(ctx, "ok")


@dataclass
class AsyncWork:
    n: int
    sleep_ms: int = 0


@job(retry=WORK_RETRY)
async def run_async_work(ctx: JobContext, payload: AsyncWork) -> None:
    record_start(ctx, "awork", payload.n)
    try:
        if payload.sleep_ms:
            await asyncio.sleep(payload.sleep_ms / 1000)
    except asyncio.CancelledError:
        record_end(ctx, "cancelled")
        raise
    record_end(ctx, "ok")


@dataclass
class Flaky:
    """Raises until attempt ``succeed_on``; 0 raises on every attempt."""

    n: int
    succeed_on: int = 0


@job(retry=FLAKY_RETRY)
def run_flaky(ctx: JobContext, payload: Flaky) -> None:
    record_start(ctx, "flaky", payload.n)
    if payload.succeed_on == 0 or ctx.attempt < payload.succeed_on:
        record_end(ctx, "raise")
        raise RuntimeError(f"chaos flaky job {payload.n} fails attempt {ctx.attempt}")
    record_end(ctx, "ok")


@dataclass
class Hang:
    """A sync handler that never returns: it holds its worker slot forever."""

    n: int


@job(retry=HANG_RETRY)
def run_hang(ctx: JobContext, payload: Hang) -> None:
    record_start(ctx, "hang", payload.n)
    threading.Event().wait()


@dataclass
class AsyncHang:
    """An async handler that never returns."""

    n: int


@job(retry=HANG_RETRY)
async def run_async_hang(ctx: JobContext, payload: AsyncHang) -> None:
    record_start(ctx, "ahang", payload.n)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        record_end(ctx, "cancelled")
        raise


@dataclass
class Tick:
    """An occurrence of a recurring schedule; ``n`` is the schedule's index in
    the profile (every occurrence of a schedule has the same payload). It
    sleeps ``sleep_ms``, so that kills and pauses catch some running."""

    n: int
    sleep_ms: int = 0


@job(retry=WORK_RETRY)
def run_tick(ctx: JobContext, payload: Tick) -> None:
    record_start(ctx, "tick", payload.n)
    if payload.sleep_ms:
        time.sleep(payload.sleep_ms / 1000)
    record_end(ctx, "ok")


@dataclass
class Ordered:
    """A partitioned job: jobs of one ``key`` run one at a time, in ``seq``
    order. ``fail_first`` raises on attempt 1: its retry must keep its place
    (the jobs after it wait)."""

    n: int
    key: str
    seq: int
    sleep_ms: int = 0
    fail_first: bool = False

    def partition_key(self) -> str:
        return self.key


@job(topic=ORDERED_TOPIC, retry=WORK_RETRY)
def run_ordered(ctx: JobContext, payload: Ordered) -> None:
    record_start(ctx, "ordered", payload.n, f"{payload.key} {payload.seq}")
    if payload.sleep_ms:
        time.sleep(payload.sleep_ms / 1000)
    if payload.fail_first and ctx.attempt == 1:
        record_end(ctx, "raise")
        raise RuntimeError(f"chaos ordered job {payload.n} fails its first attempt")
    record_end(ctx, "ok")


@dataclass
class AsyncOrdered:
    """``Ordered`` with an ``async def`` handler (the same topic and keys)."""

    n: int
    key: str
    seq: int
    sleep_ms: int = 0
    fail_first: bool = False

    def partition_key(self) -> str:
        return self.key


@job(topic=ORDERED_TOPIC, retry=WORK_RETRY)
async def run_async_ordered(ctx: JobContext, payload: AsyncOrdered) -> None:
    record_start(ctx, "aordered", payload.n, f"{payload.key} {payload.seq}")
    try:
        if payload.sleep_ms:
            await asyncio.sleep(payload.sleep_ms / 1000)
    except asyncio.CancelledError:
        record_end(ctx, "cancelled")
        raise
    if payload.fail_first and ctx.attempt == 1:
        record_end(ctx, "raise")
        raise RuntimeError(f"chaos ordered job {payload.n} fails its first attempt")
    record_end(ctx, "ok")
