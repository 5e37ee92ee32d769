"""later's thread pools: a thread per call at once, not per call made."""

from __future__ import annotations

import asyncio
import threading
import time

from later_django.threaded_store import new_pool


def test_a_steady_stream_of_short_calls_reuses_its_threads():
    """8 callers, 300 calls each: about 8 threads. (Python 3.12's own pool
    starts one for nearly every call, up to max_workers.)"""
    pool = new_pool("test", 256)

    async def caller() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(300):
            await loop.run_in_executor(pool, time.sleep, 0.0005)

    async def main() -> None:
        await asyncio.gather(*(caller() for _ in range(8)))

    try:
        asyncio.run(main())
        assert len(pool._threads) <= 12
    finally:
        pool.shutdown(wait=True)


def test_calls_that_never_return_do_not_hold_up_new_ones():
    """Threads stuck in calls that never end (an abandoned sync handler) are
    busy: a new call gets a thread of its own, at once."""
    pool = new_pool("test", 16)
    release = threading.Event()
    try:
        for _ in range(20):  # many short calls first, leaving idle credits behind
            pool.submit(time.sleep, 0).result(timeout=5)
        stuck = [pool.submit(release.wait) for _ in range(3)]
        for _ in range(20):
            assert pool.submit(lambda: "ran").result(timeout=5) == "ran"
        assert not any(future.done() for future in stuck)
        assert len(pool._threads) <= 5
    finally:
        release.set()
        pool.shutdown(wait=True)
