"""Supervision of a Server's workers: replace dead and hung ones, and autoscale.

A worker moves its progress marker after each database call; one that stops
moving outside a handler means the worker is stuck (a starved connection,
say). A long handler is reported, never killed: its lease recovers the job
if the process dies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from later_django.conf import conf
from later_django.worker.workers import WorkerSlot

logger = logging.getLogger(__name__)

SCALE_UP_FACTOR = 20  # ready backlog per worker above which one worker is added
SCALE_DOWN_AFTER = 3  # consecutive empty readings before one worker is removed


class Ticking(Protocol):
    """A periodic service whose progress is watched."""

    last_tick: float  # time.monotonic() of its last completed tick
    interval: float  # seconds between ticks


class Services(Protocol):
    """What the supervisor restarts of a server's services."""

    def task(self, name: str) -> asyncio.Task[None] | None: ...
    def restart(self, name: str) -> None: ...


class Supervised(Protocol):
    """What the supervisor sees of a server."""

    @property
    def slots(self) -> list[WorkerSlot]: ...
    @property
    def maintenance(self) -> Ticking: ...
    def replace_worker(self, slot: WorkerSlot) -> WorkerSlot: ...
    def abandon_hung_calls(self, threshold: float) -> list[str]: ...
    @property
    def services(self) -> Services: ...


class Scaled(Protocol):
    """What autoscaling sees of a server."""

    @property
    def autoscale(self) -> tuple[int, int] | None: ...
    @property
    def worker_count(self) -> int: ...
    async def add_worker(self) -> int: ...
    async def remove_worker(self) -> int: ...
    async def ready_backlog(self) -> int: ...


async def supervise(server: Supervised) -> None:
    interval = conf.seconds("SUPERVISOR_INTERVAL")
    last = time.monotonic()
    while True:
        await asyncio.sleep(interval)
        now = time.monotonic()
        stalled = now - last - interval
        last = now
        if stalled > max(interval, 1.0):
            # This tick itself came late: the whole process stood still
            # (SIGSTOP, a suspended host). Every marker is stale for that
            # reason alone; judging them now would replace healthy workers.
            logger.warning(
                "this process stood still for %.0fs; worker checks restart from now",
                stalled,
                extra={"action": "process_stalled"},
            )
            forgive_stall(server, now)
            continue
        check_once(server)


def forgive_stall(server: Supervised, now: float) -> None:
    """Restart every progress marker from ``now`` after the process was frozen."""
    for slot in server.slots:
        slot.last_active = max(slot.last_active, now)
    server.maintenance.last_tick = max(server.maintenance.last_tick, now)


def check_once(server: Supervised) -> list[str]:
    """Replace exited and hung workers; return what was done (for tests and logs)."""
    threshold = conf.seconds("HUNG_WORKER_THRESHOLD")
    now = time.monotonic()
    actions = []
    # A shared claim or completion stuck in the database holds every worker
    # waiting on it; give up on it so replacements do not queue behind it.
    for call in server.abandon_hung_calls(threshold):
        logger.error(
            "a shared %s call made no progress for %.0fs; abandoning it",
            call,
            threshold,
            extra={"action": "call_abandoned", "call": call},
        )
        actions.append(f"abandoned hung {call} call")
    for slot in list(server.slots):
        if slot.stopping or slot.task is None:
            continue
        if slot.task.done():
            reason = "exited" if slot.crash is None else f"crashed: {slot.crash!r}"
            logger.error(
                "worker %d %s; replacing it",
                slot.id,
                reason,
                extra={"action": "worker_replaced", "worker": slot.id},
            )
            new = server.replace_worker(slot)
            actions.append(f"replaced exited worker {slot.id} with {new.id}")
        elif not slot.idle and slot.busy_since is None and now - slot.last_active > threshold:
            logger.error(
                "worker %d made no progress for %.0fs outside any handler; it looks "
                "hung (e.g. a starved database connection): replacing it",
                slot.id,
                now - slot.last_active,
                extra={"action": "worker_hung", "worker": slot.id},
            )
            slot.task.cancel()
            new = server.replace_worker(slot)
            actions.append(f"replaced hung worker {slot.id} with {new.id}")
        elif (
            slot.busy_since is not None
            and now - slot.busy_since > threshold
            and not slot.reported_slow
        ):
            slot.reported_slow = True
            logger.warning(
                "job %s has been running for %.0fs on worker %d; its handler may "
                "be hung. It keeps this worker slot; the lease recovers it if this "
                "process dies.",
                slot.current_job,
                now - slot.busy_since,
                slot.id,
                extra={"action": "handler_slow", "job_id": slot.current_job},
            )
            actions.append(f"reported slow job {slot.current_job}")
    maintenance = server.services.task("maintenance")
    stale_after = max(threshold, 10 * server.maintenance.interval)
    if maintenance is not None and now - server.maintenance.last_tick > stale_after:
        logger.error(
            "maintenance made no progress for %.0fs; restarting it",
            now - server.maintenance.last_tick,
            extra={"action": "maintenance_hung"},
        )
        server.maintenance.last_tick = now
        server.services.restart("maintenance")
        actions.append("restarted maintenance")
    return actions


async def autoscale(server: Scaled) -> None:
    interval = conf.seconds("AUTOSCALE_INTERVAL")
    state = {"empty": 0}
    while True:
        await asyncio.sleep(interval)
        try:
            backlog = await server.ready_backlog()
        except Exception as exc:  # noqa: BLE001  next tick reads again
            logger.warning("autoscale could not read the backlog: %s", exc)
            continue
        await scale_once(server, backlog, state)


async def scale_once(server: Scaled, backlog: int, state: dict[str, int]) -> str | None:
    """Apply one autoscale reading; at most one worker changes per tick."""
    assert server.autoscale is not None
    low, high = server.autoscale
    count = server.worker_count
    if backlog == 0:
        state["empty"] += 1
    else:
        state["empty"] = 0
    if backlog > SCALE_UP_FACTOR * count and count < high:
        await server.add_worker()
        logger.info(
            "autoscale: backlog %d, added a worker (now %d)",
            backlog,
            server.worker_count,
            extra={"action": "autoscale_up"},
        )
        return "up"
    if state["empty"] >= SCALE_DOWN_AFTER and count > low:
        state["empty"] = 0
        await server.remove_worker()
        logger.info(
            "autoscale: idle, removed a worker (now %d)",
            server.worker_count,
            extra={"action": "autoscale_down"},
        )
        return "down"
    return None
