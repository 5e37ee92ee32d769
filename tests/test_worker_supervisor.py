"""Worker fixes found by the chaos runner (docs/chaos.md).

- After SIGSTOP ... SIGCONT a worker process replaced every idle worker as
  "hung" and restarted its maintenance, because every progress marker was as
  old as the pause. A late supervisor tick now restarts the markers instead
  of judging them.
- A handler whose lease was lost while it ran (its job recovered elsewhere)
  kept its worker forever; hung ones piled up until the process ran nothing.
  The worker is now replaced.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import later_django as later
from later_django.worker import supervisor
from later_django.worker.server import Server, WorkerSlot
from tests.helpers import await_stage, await_until, in_thread, set_later
from tests.jobapp.jobs import Noop, Sleep


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
        abandon_hung_calls=lambda threshold: [],
    )
    return server


def test_forgive_stall_restarts_every_marker(settings):
    set_later(settings, HUNG_WORKER_THRESHOLD=timedelta(seconds=1))
    server = fake_server(idle_for=30)
    supervisor.forgive_stall(server, time.monotonic())
    assert supervisor.check_once(server) == []
    assert server.replaced == []


def test_supervise_does_not_replace_workers_after_a_stall(settings):
    set_later(
        settings,
        HUNG_WORKER_THRESHOLD=timedelta(milliseconds=300),
        SUPERVISOR_INTERVAL=timedelta(milliseconds=100),
    )
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
    set_later(settings, HUNG_WORKER_THRESHOLD=timedelta(milliseconds=300))
    server = fake_server(idle_for=5)
    actions = supervisor.check_once(server)
    assert len(actions) == 3 and all("replaced hung worker" in a for a in actions)


# -- a handler whose lease was lost stops holding a worker ------------------------------
def test_sync_handler_that_lost_its_lease_gives_its_worker_back(later_db, record, settings):
    """Found by the chaos runner: a process paused past its lease kept each
    hung sync handler's worker after the job was recovered elsewhere, until
    no worker was left. Now the worker stops waiting for the handler (whose
    thread goes on; its outcome is discarded) and takes other jobs."""
    set_later(
        settings,
        LEASE_DURATION=timedelta(milliseconds=600),
        SUPERVISOR_INTERVAL=timedelta(hours=1),
    )

    async def main() -> None:
        server = Server(workers=1)  # the only worker: it must come back
        await server.start()
        try:
            job_id = await in_thread(later.enqueue, Sleep(seconds=6))

            async def running() -> bool:
                return any(slot.current_job == job_id for slot in server.slots)

            await await_until(running, 10, f"job {job_id} running")
            await asyncio.sleep(0.8)  # older than the lease
            # Another server recovers the job (as maintenance would after a pause).
            await in_thread(
                later_db.rows,
                "UPDATE later_job SET lease_owner = 'elsewhere', attempts = attempts + 1 "
                "WHERE id = %s RETURNING id",
                [job_id],
            )
            other = await in_thread(later.enqueue, Noop(n=1))
            # Long before the old handler returns.
            await await_stage(other, "success", timeout=4.0)
            assert server.worker_count == 1
            assert not any(slot.current_job == job_id for slot in server.slots)
            assert await in_thread(later_db.stage_of, job_id) == "running", "owned elsewhere"
        finally:
            await server.shutdown(1)

    asyncio.run(main())
