"""Waking idle workers: as many as jobs became ready, in the order they waited."""

from __future__ import annotations

import asyncio

from later_django.worker.notifier import Wakeup, ready_count


async def _waiting(wake: Wakeup, n: int) -> list[asyncio.Task[None]]:
    tasks = [asyncio.create_task(wake.wait(timeout=30)) for _ in range(n)]
    for _ in range(3):
        await asyncio.sleep(0)  # let each task reach its wait
    return tasks


def test_wake_releases_as_many_waiters_as_asked_in_order():
    async def scenario() -> tuple[list[bool], list[bool], list[bool]]:
        wake = Wakeup()
        tasks = await _waiting(wake, 3)
        wake.wake(1)
        await asyncio.sleep(0)
        first = [t.done() for t in tasks]
        wake.wake(5)  # more than wait: the rest
        await asyncio.sleep(0)
        second = [t.done() for t in tasks]
        more = await _waiting(wake, 2)
        wake.wake()
        await asyncio.sleep(0)
        return first, second, [t.done() for t in more]

    first, second, everyone = asyncio.run(scenario())
    assert first == [True, False, False], "one job wakes one worker: the first to wait"
    assert second == [True, True, True]
    assert everyone == [True, True], "wake() with no count releases every waiter"


def test_a_wait_that_timed_out_leaves_nothing_behind():
    async def scenario() -> tuple[int, bool]:
        wake = Wakeup()
        for _ in range(50):
            await wake.wait(timeout=0)
        waiting = len(wake._waiters)
        tasks = await _waiting(wake, 1)
        wake.wake(1)  # must reach the live waiter, not a stale one
        await asyncio.sleep(0)
        return waiting, tasks[0].done()

    waiting, woken = asyncio.run(scenario())
    assert waiting == 0
    assert woken


def test_a_wake_during_a_claim_is_not_slept_through():
    async def scenario() -> bool:
        wake = Wakeup()
        seen = wake.generation  # a worker notes it, then claims...
        wake.wake(1)  # ...while a commit wakes nobody (no one waits)
        await asyncio.wait_for(wake.wait(since=seen, timeout=30), 1)
        return True

    assert asyncio.run(scenario())


def test_notify_payloads_say_how_many_jobs_of_which_namespace():
    assert ready_count("default", "default") == ("default", 1)
    assert ready_count("default\x1f500", "default") == ("default", 500)
    assert ready_count("other\x1f500", "default") == ("default", 0)
    assert ready_count("other", "default") == ("default", 0)
    assert ready_count("a\x1fb", "a") == ("default", 1), "a count that is not a number wakes one"
    # A named queue's jobs (migration 0014): the queue after chr(30).
    assert ready_count("default\x1eemails", "default") == ("emails", 1)
    assert ready_count("default\x1eemails\x1f7", "default") == ("emails", 7)
    assert ready_count("other\x1eemails\x1f7", "default") == ("default", 0)
