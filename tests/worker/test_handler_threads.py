"""The threads sync handlers run in: as few at once as keep the work moving."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait

import pytest

from later_django.worker import handler_threads
from later_django.worker.handler_threads import HandlerThreads, next_limit


@pytest.fixture
def pool():
    threads = HandlerThreads(16, name="test-handler")
    yield threads
    threads.shutdown(wait=False, cancel_futures=True)


def test_results_and_exceptions_reach_the_caller(pool: HandlerThreads) -> None:
    assert pool.submit(lambda a, b=0: a + b, 2, b=3).result(timeout=5) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    # Even SystemExit raised by a call is its caller's, not the thread's end.
    with pytest.raises(SystemExit):
        pool.submit(exit_now).result(timeout=5)
    assert pool.submit(lambda: "still served").result(timeout=5) == "still served"


def exit_now() -> None:
    raise SystemExit(3)


def test_calls_blocked_on_each_other_get_a_thread_each(pool: HandlerThreads) -> None:
    """Eight calls that can only end together (a barrier of 8): the limit
    starts at one thread and must grow to eight, since the process is idle."""
    barrier = threading.Barrier(8, timeout=10)
    futures = [pool.submit(barrier.wait) for _ in range(8)]
    done, _ = wait(futures, timeout=15)
    assert len(done) == 8
    assert sorted(f.result() for f in futures) == list(range(8))
    assert pool.limit >= 8


def test_calls_held_by_hung_calls_still_start(pool: HandlerThreads) -> None:
    """Threads held by calls that never end (an abandoned sync handler) do
    not hold up the calls behind them, whatever the process's CPU."""
    release = threading.Event()
    try:
        stuck = [pool.submit(release.wait) for _ in range(3)]
        for _ in range(20):
            assert pool.submit(lambda: "ran").result(timeout=5) == "ran"
        assert not any(future.done() for future in stuck)
    finally:
        release.set()


def test_a_call_cancelled_while_it_waits_never_runs() -> None:
    pool = HandlerThreads(1, name="test-one")
    release, ran = threading.Event(), threading.Event()
    try:
        first = pool.submit(release.wait)
        second = pool.submit(ran.set)
        assert second.cancel()
        release.set()
        assert first.result(timeout=5) is True
        assert pool.submit(lambda: "next").result(timeout=5) == "next"
        assert not ran.is_set()
    finally:
        pool.shutdown(wait=True)


def test_shutdown_cancels_waiting_calls_and_ends_every_thread() -> None:
    """The worker closes each handler thread's connection once its thread
    has ended: shutdown must end idle threads, and busy ones after their call."""
    pool = HandlerThreads(1, name="test-one")
    started, release = threading.Event(), threading.Event()
    running = pool.submit(lambda: started.set() or release.wait())
    assert started.wait(5)
    waiting = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)
    release.set()
    assert running.result(timeout=5) is True
    for thread in pool._threads:
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_a_thread_that_finishes_takes_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """At one thread, calls run one after another on the same thread, in the
    order they were made, and no other thread is started."""
    monkeypatch.setattr(handler_threads, "WINDOW", 60.0)  # no governor's move meanwhile
    pool = HandlerThreads(8, name="test-handler")
    release = threading.Event()
    order: list[tuple[int, str]] = []
    try:
        first = pool.submit(release.wait)
        rest = [
            pool.submit(lambda n=n: order.append((n, threading.current_thread().name)))
            for n in range(5)
        ]
        assert not any(future.done() for future in rest)  # waiting behind the first
        release.set()
        wait([first, *rest], timeout=5)
        assert [n for n, _ in order] == list(range(5))
        assert len({name for _, name in order}) == 1
        assert len(pool._threads) == 1
    finally:
        pool.shutdown(wait=True)


def test_a_call_wakes_the_thread_that_ran_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads exist, one may run: calls made one after another all run
    on the same thread, the other stays asleep (woken first in, first out,
    the two would take turns)."""
    monkeypatch.setattr(handler_threads, "WINDOW", 60.0)
    pool = HandlerThreads(8, name="test-handler")
    try:
        pool.limit = 2
        release = threading.Event()
        both = [pool.submit(release.wait) for _ in range(2)]
        release.set()
        wait(both, timeout=5)
        assert len(pool._threads) == 2
        pool.limit = 1
        names = [
            pool.submit(lambda: threading.current_thread().name).result(timeout=5)
            for _ in range(10)
        ]
        assert len(set(names)) == 1
    finally:
        pool.shutdown(wait=True)


def test_calls_waiting_on_io_get_more_threads_up_to_the_calls_there_are() -> None:
    # Clearly waiting (a quarter of a core at most): twice as many at once.
    assert next_limit(1, cpu=0.05, on_cpu=0.05, stalled=False, wanted=10) == 2
    assert next_limit(4, cpu=0.05, on_cpu=0.05, stalled=False, wanted=10) == 8
    assert next_limit(8, cpu=0.05, on_cpu=0.05, stalled=False, wanted=10) == 10
    # Waiting, with the GIL not yet full: one more.
    assert next_limit(4, cpu=0.5, on_cpu=0.05, stalled=False, wanted=10) == 5
    assert next_limit(10, cpu=0.05, on_cpu=0.05, stalled=False, wanted=10) == 10


def test_a_process_bound_by_the_gil_runs_fewer_calls_at_once() -> None:
    assert next_limit(8, cpu=0.85, on_cpu=0.05, stalled=False, wanted=8) == 7
    assert next_limit(1, cpu=0.95, on_cpu=0.05, stalled=False, wanted=8) == 1
    # Between the thresholds: left alone.
    assert next_limit(3, cpu=0.75, on_cpu=0.05, stalled=False, wanted=8) == 3


def test_calls_busy_with_python_get_no_more_threads_however_idle_the_process() -> None:
    """Calls that spend much of their time on their thread's CPU (short
    database round trips) would only take turns at the GIL in more threads."""
    assert next_limit(1, cpu=0.3, on_cpu=0.4, stalled=False, wanted=8) == 1


def test_a_window_in_which_no_call_started_adds_a_thread_whatever_the_cpu() -> None:
    """Calls longer than a window, or hung: the next call gets a thread."""
    assert next_limit(3, cpu=1.0, on_cpu=0.05, stalled=True, wanted=8) == 4
    assert next_limit(8, cpu=1.0, on_cpu=0.05, stalled=True, wanted=8) == 8


def test_the_governor_takes_a_convoy_back_to_one_thread() -> None:
    """From eight threads in a process bound by its CPU to one, a window each."""
    limit = 8
    for _ in range(7):
        limit = next_limit(limit, cpu=0.85, on_cpu=0.05, stalled=False, wanted=8)
    assert limit == 1


def test_a_steady_stream_of_short_blocking_calls_uses_few_threads(pool: HandlerThreads) -> None:
    """8 callers making 200 short calls each: never more threads than calls at once."""

    def caller() -> None:
        for _ in range(200):
            pool.submit(time.sleep, 0.0005).result(timeout=5)

    callers = [threading.Thread(target=caller) for _ in range(8)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(timeout=30)
    assert len(pool._threads) <= 8


# Outcomes handed to the event loop (run_on_loop, the worker's path).


def run_in_loop(coroutine_function):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine_function())


@pytest.fixture
def governed() -> Iterator[HandlerThreads]:
    """Two threads at most, the limit starting at one: a governor runs."""
    threads = HandlerThreads(2, name="test-two")
    yield threads
    threads.shutdown(wait=True)


def test_outcomes_reach_the_loop(pool: HandlerThreads) -> None:
    async def main() -> None:
        waiter, future = pool.run_on_loop(lambda a, b: a + b, 2, 3)
        assert await waiter == 5
        assert future.result() == 5
        waiter, _ = pool.run_on_loop(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            await waiter
        waiter, _ = pool.run_on_loop(exit_now)
        with pytest.raises(SystemExit):
            await waiter
        waiter, _ = pool.run_on_loop(lambda: "still served")
        assert await waiter == "still served"

    run_in_loop(main)


def test_outcomes_of_calls_that_ran_back_to_back_reach_the_loop_together(
    governed: HandlerThreads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread runs four queued calls one after another: the loop is
    woken once for all four, not once for each (a wake-up of the loop and
    a turn of the GIL per outcome)."""
    # No governor window ends meanwhile to hand over what it finds kept.
    monkeypatch.setattr(handler_threads, "WINDOW", 30.0)
    release = threading.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        wakes = []
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(*args):  # type: ignore[no-untyped-def]
            wakes.append(args)
            return call_soon_threadsafe(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        first, _ = governed.run_on_loop(release.wait)
        rest = [governed.run_on_loop(lambda n=n: n) for n in range(3)]
        release.set()
        assert await asyncio.wait_for(first, timeout=5) is True
        assert [await waiter for waiter, _ in rest] == [0, 1, 2]
        assert len(wakes) == 1

    run_in_loop(main)


def test_an_outcome_is_not_held_back_by_a_long_call_after_it(governed: HandlerThreads) -> None:
    """A short call's outcome waits for the call its thread takes next only
    while that one is short: past a window of the governor it is handed
    over on its own."""
    release = threading.Event()

    async def main() -> None:
        short, _ = governed.run_on_loop(lambda: "short")
        long, _ = governed.run_on_loop(release.wait)
        try:
            assert await asyncio.wait_for(short, timeout=5) == "short"
            assert not long.done()
        finally:
            release.set()
        assert await long is True

    run_in_loop(main)


def test_a_call_whose_waiter_is_cancelled_before_it_starts_never_runs() -> None:
    # One thread: a governor that grew the limit would start the second
    # call before its waiter is cancelled.
    one = HandlerThreads(1, name="test-one")
    release, ran = threading.Event(), threading.Event()

    async def main() -> None:
        first, _ = one.run_on_loop(release.wait)
        second, second_call = one.run_on_loop(ran.set)
        second.cancel()
        # The waiter's cancel reaches its call in a callback of the loop's
        # next turn; only then is the call "cancelled before it starts".
        await asyncio.sleep(0)
        assert second_call.cancelled()
        release.set()
        assert await first is True
        assert second_call.cancelled()
        next_one, _ = one.run_on_loop(lambda: "next")
        assert await next_one == "next"
        assert not ran.is_set()

    try:
        run_in_loop(main)
    finally:
        one.shutdown(wait=True)


def test_shutdown_cancels_the_waiters_of_calls_that_never_started(governed: HandlerThreads) -> None:
    started, release = threading.Event(), threading.Event()

    async def main() -> None:
        running, _ = governed.run_on_loop(lambda: started.set() or release.wait())
        waiting, _ = governed.run_on_loop(lambda: "never")
        assert await asyncio.to_thread(started.wait, 5)
        governed.shutdown(wait=False, cancel_futures=True)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, timeout=5)
        release.set()
        assert await asyncio.wait_for(running, timeout=5) is True

    run_in_loop(main)


def test_an_outcome_for_a_closed_loop_does_not_stop_the_pool(governed: HandlerThreads) -> None:
    """A loop that stopped waiting (closed) while its call ran: the thread
    drops the outcome and serves the next loop's calls."""
    started, release = threading.Event(), threading.Event()

    async def leave_a_call_running() -> None:
        governed.run_on_loop(lambda: started.set() or release.wait())
        assert await asyncio.to_thread(started.wait, 5)

    async def next_loop() -> None:
        release.set()
        waiter, _ = governed.run_on_loop(lambda: "served")
        assert await asyncio.wait_for(waiter, timeout=5) == "served"

    run_in_loop(leave_a_call_running)
    run_in_loop(next_loop)


def test_an_outcome_kept_behind_calls_cancelled_meanwhile_is_handed_over(
    governed: HandlerThreads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls queued when a call ended were cancelled before a thread
    took them (their timeouts passed): its thread finds nothing to run and
    hands the kept outcome over itself, not a governor window later."""
    monkeypatch.setattr(handler_threads, "WINDOW", 30.0)
    release = threading.Event()

    async def main() -> None:
        first, _ = governed.run_on_loop(release.wait)
        second, second_call = governed.run_on_loop(lambda: "never")
        second.cancel()
        await asyncio.sleep(0)  # its done-callbacks run: the call is cancelled
        assert second_call.cancelled()
        release.set()
        assert await asyncio.wait_for(first, timeout=5) is True

    run_in_loop(main)


def test_a_sync_outcome_on_its_way_when_the_timeout_passes_counts() -> None:
    """A handler that ended before its timeout, its outcome not yet handed
    to the loop when the timeout passed, succeeded: its result stands."""
    from later_django.context import JobContext
    from later_django.worker.executor import _wait_sync_within

    async def main() -> None:
        never_handed_over: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        ended: Future[str] = Future()
        ended.set_running_or_notify_cancel()
        ended.set_result("done")
        ctx = JobContext(job_id="01j0000000000000000000000", attempt=1, app=None)  # type: ignore[arg-type]
        assert await _wait_sync_within(10, never_handed_over, ended, ctx) == "done"
        assert not ctx.cancel_requested.is_set()

    run_in_loop(main)
