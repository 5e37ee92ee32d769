"""The supervisor after the whole process stood still (SIGSTOP, a suspended host).

Found by the chaos runner (docs/chaos.md): after SIGSTOP ... SIGCONT a worker
process replaced every idle worker as "hung" and restarted its maintenance,
because every progress marker was as old as the pause. A late supervisor
tick now restarts the markers instead of judging them.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from later_django.worker import supervisor
from later_django.worker.server import WorkerSlot


class PendingTask:
    """Stands in for a running worker task."""

    def __init__(self) -> None:
        self.cancelled_by_supervisor = False

    def done(self) -> bool:
        return False

    def cancel(self) -> bool:
        self.cancelled_by_supervisor = True
        return True


def fake_server(idle_for: float) -> Any:
    now = time.monotonic()
    slots = [
        WorkerSlot(id=i, task=PendingTask(), last_active=now - idle_for)  # type: ignore[arg-type]
        for i in range(3)
    ]
    replaced: list[WorkerSlot] = []

    def replace_worker(slot: WorkerSlot) -> WorkerSlot:
        replaced.append(slot)
        new = WorkerSlot(id=99 + len(replaced), task=PendingTask())  # type: ignore[arg-type]
        server.slots[server.slots.index(slot)] = new
        return new

    server = SimpleNamespace(
        slots=slots,
        replaced=replaced,
        replace_worker=replace_worker,
        maintenance=SimpleNamespace(last_tick=now - idle_for, interval=0.3),
        service_task=lambda name: None,
    )
    return server


def test_forgive_stall_restarts_every_marker(settings):
    settings.LATER = {**settings.LATER, "HUNG_WORKER_THRESHOLD": timedelta(seconds=1)}
    server = fake_server(idle_for=30)
    supervisor.forgive_stall(server, time.monotonic())
    assert supervisor.check_once(server) == []
    assert server.replaced == []


def test_supervise_does_not_replace_workers_after_a_stall(settings):
    settings.LATER = {
        **settings.LATER,
        "HUNG_WORKER_THRESHOLD": timedelta(milliseconds=300),
        "SUPERVISOR_INTERVAL": timedelta(milliseconds=100),
    }
    server = fake_server(idle_for=0)

    async def run() -> None:
        task = asyncio.create_task(supervisor.supervise(server))
        await asyncio.sleep(0.05)
        time.sleep(1.5)  # noqa: ASYNC251  the loop (like the whole process) stands still
        await asyncio.sleep(0.15)  # the late tick: forgiven
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    assert server.replaced == [], "healthy workers were replaced after a stall"


def test_a_worker_stuck_alone_is_still_replaced(settings):
    settings.LATER = {**settings.LATER, "HUNG_WORKER_THRESHOLD": timedelta(milliseconds=300)}
    server = fake_server(idle_for=5)
    actions = supervisor.check_once(server)
    assert len(actions) == 3 and all("replaced hung worker" in a for a in actions)
