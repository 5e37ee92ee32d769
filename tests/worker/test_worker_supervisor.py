"""The worker supervisor (later_django/worker/supervisor.py): it replaces
exited and hung workers, forgives a process that stood still, and scales the
worker count with the backlog.

The tests on a fake server need no database; the others drive a Server in
this process on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import later_django as later
from later_django.worker import supervisor
from later_django.worker.server import Server
from later_django.worker.workers import WorkerSlot
from tests.helpers import await_record, await_stage, await_until, in_thread, serve, set_later
from tests.jobapp.jobs import Noop, Sleep


# -- a fake server: markers only -----------------------------------------------------
# After SIGSTOP ... SIGCONT a worker process replaced every idle worker as
# "hung" and restarted its maintenance, because every progress marker was as
# old as the pause (found by the chaos runner, docs/project/chaos.md). A late
# supervisor tick now restarts the markers instead of judging them.
class PendingTask:
    """Stands in for a running worker task."""

    def __init__(self) -> None:
        self.cancelled_by_supervisor = False

    def done(self) -> bool:
        return False

    def cancel(self) -> bool:
        self.cancelled_by_supervisor = True
        return True


@dataclass
class FakeMaintenance:
    last_tick: float
    interval: float = 0.3


class FakeServices:
    def task(self, name: str) -> asyncio.Task[None] | None:
        return None

    def restart(self, name: str) -> None:
        raise AssertionError("no service to restart")


class FakeServer:
    """A supervisor.Supervised with progress markers only: no tasks run."""

    def __init__(self, idle_for: float) -> None:
        now = time.monotonic()
        self._slots = [
            WorkerSlot(id=i, task=PendingTask(), last_active=now - idle_for)  # type: ignore[arg-type]
            for i in range(3)
        ]
        self._maintenance = FakeMaintenance(last_tick=now - idle_for)
        self.replaced: list[WorkerSlot] = []
        self.checks: list[float] = []

    @property
    def slots(self) -> list[WorkerSlot]:
        return self._slots

    @property
    def maintenance(self) -> FakeMaintenance:
        return self._maintenance

    def replace_worker(self, slot: WorkerSlot) -> WorkerSlot:
        self.replaced.append(slot)
        new = WorkerSlot(id=99 + len(self.replaced), task=PendingTask())  # type: ignore[arg-type]
        self._slots[self._slots.index(slot)] = new
        return new

    def abandon_hung_calls(self, threshold: float) -> list[str]:
        self.checks.append(time.monotonic())  # check_once calls it first
        return []

    @property
    def services(self) -> FakeServices:
        return FakeServices()


def fake_server(idle_for: float) -> FakeServer:
    server = FakeServer(idle_for)
    _: supervisor.Supervised = server  # the protocol is all the supervisor needs
    return server


def test_forgive_stall_restarts_every_marker(settings):
    """Markers as old as a pause are not judged once forgive_stall restarted them."""
    set_later(settings, HUNG_WORKER_THRESHOLD=timedelta(seconds=1))
    server = fake_server(idle_for=30)
    supervisor.forgive_stall(server, time.monotonic())
    assert supervisor.check_once(server) == []
    assert server.replaced == []


def test_idle_workers_waiting_for_work_are_never_hung(settings):
    """A worker waiting for a wake-up makes no progress by design: with jobs
    arriving one at a time, one worker per job wakes and the others may wait
    for as long as the stream lasts."""
    set_later(settings, HUNG_WORKER_THRESHOLD=timedelta(seconds=1))
    server = fake_server(idle_for=30)
    for slot in server.slots[1:]:
        slot.idle = True
    actions = supervisor.check_once(server)
    assert actions == [f"replaced hung worker 0 with {server.slots[0].id}"]
    assert [slot.id for slot in server.replaced] == [0], "only the one outside any wait"


def test_supervise_does_not_replace_workers_after_a_stall(settings):
    """The tick that comes late because the whole process stood still restarts
    the markers instead of replacing every worker as hung."""
    set_later(
        settings,
        HUNG_WORKER_THRESHOLD=timedelta(milliseconds=300),
        SUPERVISOR_INTERVAL=timedelta(milliseconds=100),
    )
    server = fake_server(idle_for=0)

    async def checked() -> bool:
        return bool(server.checks)

    async def ticked_after(moment: float) -> bool:
        # The late tick forgives (restarting the maintenance marker) or checks.
        return server.maintenance.last_tick >= moment or server.checks[-1] >= moment

    async def run() -> None:
        task = asyncio.create_task(supervisor.supervise(server))
        # Soon after it: the workers' markers go stale 0.3 s after they were set.
        await await_until(checked, 5, "the supervisor's first check", interval=0.01)
        # The scenario: the loop (like the whole process) stands still.
        time.sleep(1.5)  # noqa: ASYNC251
        resumed = time.monotonic()
        await await_until(lambda: ticked_after(resumed), 5, "the supervisor's tick after the stall")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    assert server.replaced == [], "healthy workers were replaced after a stall"


def test_a_worker_stuck_alone_is_still_replaced(settings):
    """Without a stall, workers with no progress past the threshold are replaced."""
    set_later(settings, HUNG_WORKER_THRESHOLD=timedelta(milliseconds=300))
    server = fake_server(idle_for=5)
    actions = supervisor.check_once(server)
    assert len(actions) == 3 and all("replaced hung worker" in a for a in actions)


# -- a Server in this process ---------------------------------------------------
def test_supervisor_replaces_exited_worker(later_db, record):
    """check_once replaces a worker whose task ended with a new slot."""

    async def body(server: Server) -> None:
        assert supervisor.check_once(server) == []
        dead = server.slots[0]
        assert dead.task is not None
        dead.task.cancel()
        await asyncio.wait([dead.task])
        actions = supervisor.check_once(server)
        ids = [slot.id for slot in server.slots]
        assert actions == [f"replaced exited worker {dead.id} with {ids[-1]}"]
        assert server.worker_count == 2
        assert dead not in server.slots
        assert ids[-1] not in (0, 1)
        job_id = await in_thread(later.enqueue, Noop(n=1))
        await await_stage(job_id, "success")

    serve(body, workers=2)


def test_supervisor_replaces_hung_worker(later_db, record, settings):
    """A worker stuck outside any handler past the threshold is cancelled and replaced."""
    set_later(
        settings,
        HUNG_WORKER_THRESHOLD=timedelta(milliseconds=500),
        SUPERVISOR_INTERVAL=timedelta(hours=1),
    )
    calls = {"n": 0}
    hung: list[asyncio.Event] = []

    def patch_claim(server: Server) -> None:
        original = server.queues[0].claimer.claim
        hung.append(asyncio.Event())

        async def claim_hangs_once() -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                hung[0].set()
                await asyncio.get_running_loop().create_future()  # never resolves
            return await original()

        server.queues[0].claimer.claim = claim_hangs_once  # type: ignore[method-assign]

    async def body(server: Server) -> None:
        await asyncio.wait_for(hung[0].wait(), 10)
        stuck = server.slots[0]
        assert supervisor.check_once(server) == [], "not stale yet"
        threshold = 0.5

        async def stale() -> bool:
            return time.monotonic() - stuck.last_active > threshold

        await await_until(stale, 10, "the hung worker's marker to go stale")
        actions = supervisor.check_once(server)
        new = server.slots[-1]
        assert actions == [f"replaced hung worker {stuck.id} with {new.id}"]
        assert stuck.task is not None
        await asyncio.wait([stuck.task], timeout=5)
        assert stuck.task.cancelled()
        assert server.worker_count == 1
        job_id = await in_thread(later.enqueue, Noop(n=1))
        await await_stage(job_id, "success")
        assert calls["n"] >= 2

    serve(body, workers=1, before_start=patch_claim)


def test_supervisor_reports_but_keeps_slow_handler(later_db, record, settings):
    """A handler running past the threshold is reported once, never replaced."""
    set_later(
        settings,
        HUNG_WORKER_THRESHOLD=timedelta(milliseconds=200),
        SUPERVISOR_INTERVAL=timedelta(hours=1),
    )

    async def body(server: Server) -> None:
        job_id = await in_thread(later.enqueue, Sleep(seconds=1.0))
        await await_record(record, "sleep-start", job_id)
        busy = next(slot for slot in server.slots if slot.current_job == job_id)

        async def slow() -> bool:
            return time.monotonic() - (busy.busy_since or time.monotonic()) > 0.2

        await await_until(slow, 10, "the handler to run past the threshold")
        assert supervisor.check_once(server) == [f"reported slow job {job_id}"]
        assert supervisor.check_once(server) == [], "reported once"
        assert busy in server.slots
        info = await await_stage(job_id, "success")
        assert info.attempts == 1

    serve(body, workers=1)


# -- autoscale --------------------------------------------------------------------
def test_autoscale_scale_once_adds_one_worker_per_tick(later_db, record, settings):
    """A backlog above 20 x workers adds one worker per tick, never above max."""
    set_later(settings, AUTOSCALE_INTERVAL=timedelta(hours=1))

    async def body(server: Server) -> None:
        state = {"empty": 0}
        assert server.worker_count == 2
        assert await supervisor.scale_once(server, 40, state) is None, "not above 20 x 2"
        assert server.worker_count == 2
        assert await supervisor.scale_once(server, 10_000, state) == "up"
        assert server.worker_count == 3, "one change per tick"
        assert await supervisor.scale_once(server, 10_000, state) == "up"
        assert server.worker_count == 4
        assert await supervisor.scale_once(server, 10_000, state) is None, "at max"
        assert server.worker_count == 4

    serve(body, workers=2, autoscale=(1, 4))


def test_autoscale_scale_once_removes_after_three_empty_readings(later_db, record, settings):
    """Three consecutive empty readings remove one worker, never below min."""
    set_later(settings, AUTOSCALE_INTERVAL=timedelta(hours=1))

    async def body(server: Server) -> None:
        state = {"empty": 0}
        assert server.worker_count == 3
        readings = [0, 0, 5, 0, 0]  # a non-empty reading resets the count
        assert [await supervisor.scale_once(server, n, state) for n in readings] == [None] * 5
        assert server.worker_count == 3
        assert await supervisor.scale_once(server, 0, state) == "down"
        assert server.worker_count == 2
        for _ in range(2):
            assert await supervisor.scale_once(server, 0, state) is None
        assert await supervisor.scale_once(server, 0, state) == "down"
        assert server.worker_count == 1
        for _ in range(4):
            assert await supervisor.scale_once(server, 0, state) is None, "at min"
        assert server.worker_count == 1

    serve(body, workers=3, autoscale=(1, 3))


def test_a_crashed_worker_takes_nothing_else_down_and_is_replaced(later_db, record, caplog):
    """A worker task that raises outside any handler ends alone: the other
    tasks of the server's group keep running, and the supervisor replaces it."""

    def patch_store(server: Server) -> None:
        original = server.completer.store_outcome

        def crash_once(job: Any, outcome: Any, ran: float) -> Any:
            server.completer.store_outcome = original  # type: ignore[method-assign]
            raise RuntimeError("worker bug")

        server.completer.store_outcome = crash_once  # type: ignore[method-assign]

    async def body(server: Server) -> None:
        first = await in_thread(later.enqueue, Noop(n=1))
        crashed = server.slots[0]

        async def ended() -> bool:
            return crashed.task is not None and crashed.task.done()

        await await_until(ended, 10, "the worker to crash")
        assert repr(crashed.crash) == "RuntimeError('worker bug')"
        assert server.services.task("renew") is not None
        assert not server.services.task("renew").done(), "the services still run"
        actions = supervisor.check_once(server)
        assert actions == [f"replaced exited worker {crashed.id} with {server.slots[-1].id}"]
        assert "worker 0 crashed: RuntimeError('worker bug'); replacing it" in caplog.text
        # The crashed worker's job was never stored: its lease recovers it.
        assert await in_thread(later_db.stage_of, first) == "running"
        second = await in_thread(later.enqueue, Noop(n=2))
        await await_stage(second, "success")

    serve(body, workers=1, before_start=patch_store)
