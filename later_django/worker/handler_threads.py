"""The threads sync handlers run in: as few at once as keep the work moving.

Threads take turns holding the GIL, so many threads doing short round trips
spend more on the turns than on the work; a handler waiting on a service,
though, needs a thread of its own. Calls start on at most ``limit`` threads
and a governor moves the limit (``next_limit``); outcomes for the event loop
are handed over together. Why and what was measured: docs/project/decisions.md
("Sync handlers start on as few threads as keep the work moving").
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

# How often the governor looks while calls wait, in seconds.
WINDOW = 0.05
# The process's CPU over a window, as a fraction of one core.
CLEARLY_WAITING = 0.25
GROW_BELOW = 0.7
# Below this fraction of their time on their thread's CPU, calls mostly wait.
CALLS_WAITING = 0.2
SHRINK_ABOVE = 0.8
# The most outcomes kept for one hand-over to the loop.
HAND_OVER_AT_MOST = 8


def _gil_enabled() -> bool:
    probe = getattr(sys, "_is_gil_enabled", None)
    return True if probe is None else bool(probe())


@dataclass
class _Call:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    # run_on_loop's waiter: the outcome is handed to it on its loop.
    waiter: asyncio.Future[Any] | None = None


class HandlerThreads(Executor):
    """An executor that runs calls on at most ``limit`` threads at once,
    the limit moved by a governor between 1 and ``max_threads``."""

    def __init__(self, max_threads: int, name: str = "later-handler") -> None:
        self.max_threads = max_threads
        self.name = name
        # Without a GIL the threads do not take turns: no reason to hold any back.
        self.limit = 1 if _gil_enabled() else max_threads
        self._lock = threading.Lock()
        self._waiting_calls = threading.Condition(self._lock)  # the governor waits here
        self._calls: deque[_Call] = deque()
        self._threads: list[threading.Thread] = []
        self._running = 0  # calls started and not yet ended
        # Threads waiting for a call, each on its own lock, the last to
        # arrive on top: the next call wakes the thread that ran most
        # recently, so threads beyond those the limit keeps busy stay asleep.
        self._sleepers: list[threading.Lock] = []
        self._woken = 0  # threads told to take a call that have not yet woken
        self._started = 0  # calls started, ever
        # Of the calls ended, ever: their threads' CPU time and wall time.
        self._call_cpu = 0.0
        self._call_wall = 0.0
        self._shutdown = False
        self._governor: threading.Thread | None = None
        self._governor_parked = False  # waiting for calls to wait
        # Ended calls of run_on_loop whose outcomes wait for a hand-over,
        # and when the first of them ended (time.monotonic()).
        self._ended: list[_Call] = []
        self._ended_since = 0.0
        self._handing_over: set[asyncio.AbstractEventLoop] = set()  # hand-overs sent, not yet run

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._add(_Call(future, fn, args, kwargs))
        return future

    def run_on_loop(
        self, fn: Callable[..., T], /, *args: Any
    ) -> tuple[asyncio.Future[T], Future[T]]:
        """Run ``fn(*args)`` for the running event loop: returns the future
        the loop awaits, and the call's own future (done once it ends,
        cancelled if it never starts). Cancelling the first cancels the call
        if it has not started."""
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future: Future[T] = Future()
        waiter.add_done_callback(lambda waiter: future.cancel() if waiter.cancelled() else None)
        self._add(_Call(future, fn, args, waiter=waiter))
        return waiter, future

    def _add(self, call: _Call) -> None:
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self.name}: cannot run new calls after shutdown")
            self._calls.append(call)
            self._dispatch()
            if self._calls:
                self._start_governor()
                if self._governor_parked:
                    self._waiting_calls.notify()

    def _ended_for_loop(self, call: _Call) -> None:
        """Keep the outcome of ``call`` for its loop: while its thread takes
        another call at once, that one's outcome joins it; the thread hands
        them over when it finds no call to take (the governor, if the next
        call runs long). Called with the lock held."""
        if not self._ended:
            self._ended_since = time.monotonic()
        self._ended.append(call)
        if len(self._ended) >= HAND_OVER_AT_MOST or self._governor is None:
            self._hand_over()

    def _hand_over(self) -> None:
        """Send the kept outcomes to their loops. Called with the lock held."""
        if not self._ended:
            return
        for loop in {call.waiter.get_loop() for call in self._ended if call.waiter is not None}:
            if loop in self._handing_over:
                continue  # the one on its way takes every outcome kept when it runs
            try:
                loop.call_soon_threadsafe(self._on_loop, loop)
            except RuntimeError:  # closed: nobody waits there any more
                self._ended = [call for call in self._ended if call.waiter.get_loop() is not loop]  # type: ignore[union-attr]
            else:
                self._handing_over.add(loop)

    def _on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._handing_over.discard(loop)
            ended = [call for call in self._ended if call.waiter.get_loop() is loop]  # type: ignore[union-attr]
            self._ended = [call for call in self._ended if call.waiter.get_loop() is not loop]  # type: ignore[union-attr]
            if self._ended:
                self._ended_since = time.monotonic()
        for call in ended:
            waiter, future = call.waiter, call.future
            assert waiter is not None
            if waiter.done():
                continue  # its caller stopped waiting
            if future.cancelled():
                waiter.cancel()
            elif (exc := future.exception()) is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(future.result())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._calls:
                    call = self._calls.popleft()
                    call.future.cancel()
                    if call.waiter is not None:
                        self._ended.append(call)
                self._hand_over()  # their waiters are cancelled
            while self._sleepers:
                self._sleepers.pop().release()
                self._woken += 1
            self._waiting_calls.notify_all()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()

    def _dispatch(self) -> None:
        """Wake or start a thread for each waiting call the limit lets start.
        Called with the lock held."""
        startable = min(self.limit - self._running, len(self._calls)) - self._woken
        for _ in range(startable):
            if self._sleepers:
                self._sleepers.pop().release()
            elif len(self._threads) < self.max_threads:
                thread = threading.Thread(
                    target=self._serve, name=f"{self.name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                return
            self._woken += 1

    def _serve(self) -> None:
        wake = threading.Lock()
        wake.acquire()
        with self._lock:
            self._woken -= 1  # started for a call: as if woken for it
            while True:
                while not self._calls or self._running >= self.limit:
                    self._hand_over()  # no call to take at once: nothing to keep them for
                    if self._shutdown:
                        return
                    self._sleepers.append(wake)
                    self._lock.release()
                    wake.acquire()  # until a call (or shutdown) releases it
                    self._lock.acquire()
                    self._woken -= 1
                call = self._calls.popleft()
                if not call.future.set_running_or_notify_cancel():
                    continue  # cancelled while it waited
                self._running += 1
                self._started += 1
                self._lock.release()
                cpu_before, wall_before = time.thread_time(), time.monotonic()
                try:
                    _run(call)
                finally:
                    self._lock.acquire()
                    self._running -= 1
                    self._call_cpu += time.thread_time() - cpu_before
                    self._call_wall += time.monotonic() - wall_before
                    if call.waiter is not None:
                        self._ended_for_loop(call)
                    del call

    def _start_governor(self) -> None:
        if self._governor is None and self.limit < self.max_threads:
            self._governor = threading.Thread(
                target=self._govern, name=f"{self.name}_governor", daemon=True
            )
            self._governor.start()

    def _govern(self) -> None:
        with self._lock:
            while not self._shutdown:
                if self._ended and time.monotonic() - self._ended_since >= WINDOW:
                    self._hand_over()  # the call after them runs long
                if not self._calls:
                    if self._ended:
                        self._waiting_calls.wait(WINDOW)
                        continue
                    self._governor_parked = True
                    self._waiting_calls.wait()
                    self._governor_parked = False
                    continue
                cpu_before, wall_before = time.process_time(), time.monotonic()
                started_before = self._started
                call_cpu_before, call_wall_before = self._call_cpu, self._call_wall
                self._waiting_calls.wait(WINDOW)  # only shutdown notifies while not parked
                if not self._calls or self._shutdown:
                    continue  # not a window the limit held calls back in
                cpu = (time.process_time() - cpu_before) / (time.monotonic() - wall_before)
                call_wall = self._call_wall - call_wall_before
                on_cpu = (self._call_cpu - call_cpu_before) / call_wall if call_wall else 0.0
                wanted = self._running + len(self._calls)
                limit = next_limit(
                    self.limit,
                    cpu=cpu,
                    on_cpu=on_cpu,
                    stalled=self._started == started_before,
                    wanted=min(wanted, self.max_threads),
                )
                if limit != self.limit:
                    self.limit = limit
                    self._dispatch()


def _run(call: _Call) -> None:
    try:
        result = call.fn(*call.args, **call.kwargs)
    except BaseException as exc:  # noqa: BLE001  the caller's to see
        call.future.set_exception(exc)
    else:
        call.future.set_result(result)


def next_limit(limit: int, *, cpu: float, on_cpu: float, stalled: bool, wanted: int) -> int:
    """The limit after a window in which calls waited: the process used
    ``cpu`` of one core, the calls that ended spent ``on_cpu`` of their
    time on their thread's CPU, no call started if ``stalled``, and
    ``wanted`` threads would start every call there is."""
    if stalled:
        return max(limit, min(limit + 1, wanted))
    if cpu < GROW_BELOW and on_cpu < CALLS_WAITING and limit < wanted:
        return min(limit * 2 if cpu < CLEARLY_WAITING else limit + 1, wanted)
    if cpu > SHRINK_ABOVE and limit > 1:
        return limit - 1
    return limit
