"""The worker server: one asyncio loop running N worker tasks plus its services.

worker/assembly.py builds the parts; the server runs their life cycle: the
order they start in, and the order a shutdown stops them in. Every task
belongs to one TaskGroup. Nothing here decides what a job's outcome is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from later_django import events
from later_django.conf import conf
from later_django.types import PartitionLocal
from later_django.worker import supervisor
from later_django.worker.assembly import build_parts
from later_django.worker.claimer import Claimer
from later_django.worker.completer import Completer
from later_django.worker.extensions import Extension, ExtensionFactory
from later_django.worker.extensions import registered as registered_extensions
from later_django.worker.plan import plan_server
from later_django.worker.queue_workers import ready_backlog, worker_count
from later_django.worker.workers import MAX_WORKERS, WorkerSlot

__all__ = ["Server"]

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

    from later_django.db.base import Dialect

logger = logging.getLogger(__name__)
T = TypeVar("T")

CONNECTION_CLOSE_TIMEOUT = 2.0  # seconds shutdown waits for pool threads to release connections


class Server:
    """A supervised pool of workers sharing the LATER database and namespace."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        autoscale: tuple[int, int] | None = None,
        shutdown_timeout: float | None = None,
        queues: dict[str, int] | None = None,
        extensions: Sequence[ExtensionFactory] = (),
    ) -> None:
        """``extensions``: made at start for this server only, besides those
        registered for every server (worker/extensions.py), such as the
        Prometheus feed of ``later_worker --metrics-port``."""
        self.plan = plan = plan_server(
            workers=workers, autoscale=autoscale, shutdown_timeout=shutdown_timeout, queues=queues
        )
        self.server_id, self.namespace, self.alias = plan.server_id, plan.namespace, plan.alias
        self.initial_workers, self.autoscale = plan.initial_workers, plan.autoscale
        self.shutdown_timeout, self.topics, self.limits = (
            plan.shutdown_timeout, plan.topics, plan.limits,
        )  # fmt: skip
        self.parts = parts = build_parts(plan)
        self.store, self.services, self.leases = parts.store, parts.services, parts.leases
        self.maintenance, self.completer = parts.maintenance, parts.completer
        self.notifier, self.queues = parts.notifier, parts.queues
        self.partitions, self.partition_pool = parts.partitions, parts.partition_pool
        self._own_extensions = list(extensions)
        self._extensions: list[Extension] = []  # made at start
        self.stopping = False
        self.closed = asyncio.Event()
        self._hurry = asyncio.Event()  # set by hurry(): the grace period ends now

    # -- what the supervisor, the extensions and the command see ------------------
    @property
    def worker_count(self) -> int:
        return worker_count(self.queues)

    @property
    def slots(self) -> list[WorkerSlot]:
        """Every worker the supervisor watches: plain and partition ones."""
        return self.parts.pools.slots

    @property
    def processed(self) -> int:
        return self.parts.pools.processed

    def replace_worker(self, slot: WorkerSlot) -> WorkerSlot:
        return self.parts.pools.replace(slot)

    def abandon_hung_calls(self, threshold: float) -> list[str]:
        """Give up on a shared claim or completion stuck longer than ``threshold``."""
        now = time.monotonic()
        parts: list[tuple[str, Claimer | Completer]] = [
            (f"claim {q.name}", q.claimer) for q in self.queues
        ]
        parts.append(("complete", self.completer))
        hung = [
            (n, p) for n, p in parts if (t := p.hung_since()) is not None and now - t > threshold
        ]
        for _, part in hung:
            part.reset()
        return [name for name, _ in hung]

    async def ready_backlog(self) -> int:
        return await ready_backlog(self.queues)

    # -- lifecycle --------------------------------------------------------------
    async def start(self) -> None:
        """Start the services and the workers; return once they run."""
        parts, services = self.parts, self.services
        self.notifier.start()
        await services.open()
        # Workers first, so the first heartbeat reports their number, not 0.
        for queue in self.queues:
            for _ in range(queue.workers):
                queue.pool.spawn()
        if events.active:  # before any worker task has run
            events.emit(events.ServerStarted(self.server_id, self.namespace, self.worker_count))
        await parts.membership.heartbeat()
        if self.topics:
            await self._start_partitions()
        services.start("renew", self.leases.run_renewals)
        services.start("deadlines", self.leases.run_deadlines)
        services.start("cancels", self.leases.run_cancel_checks)
        for queue in self.queues:
            services.start(f"poll {queue.name}", queue.pool.run_backstop)
        services.start("heartbeat", parts.membership.run_heartbeats)
        services.start("maintenance", self.maintenance.run)
        services.start("supervisor", lambda: supervisor.supervise(self))
        services.start("status", parts.status.run)
        makers = [*registered_extensions(), *self._own_extensions]
        self._extensions = [make(self) for make in makers]
        for extension in self._extensions:
            services.start(extension.name, extension.run)
        if self.autoscale:
            for queue in self.queues:
                services.start(
                    f"autoscale {queue.name}", functools.partial(supervisor.autoscale, queue)
                )
        self._log_started()

    async def _start_partitions(self) -> None:
        """Register the topics, learn the live topic servers, then start as
        many partition workers as plain ones."""
        await self.parts.membership.register_topics()
        await self.partitions.refresh()
        for _ in range(self.initial_workers):
            self.partition_pool.spawn()
        interval = min(
            conf.seconds("PARTITION_HEARTBEAT_INTERVAL"),
            conf.seconds("PARTITION_LEASE_DURATION") / 3,
        )
        self.services.start("partitions", lambda: self.partitions.run_refresh(interval))
        self.services.start("partition-poll", self.partition_pool.run_backstop)

    def _log_started(self) -> None:
        logger.info(
            "later server %s started: %d workers on %s, namespace %r, queues %s",
            self.server_id,
            self.worker_count,
            self.alias,
            self.namespace,
            self.served_queues,
            extra={"action": "server_started"},
        )
        for name, found in self.limits.items():
            logger.info(
                "queue %s: %s",
                name,
                ", ".join(
                    ([f"at most {found.rate} starts across every server"] if found.rate else [])
                    + (["concurrency keys kept"] if found.keyed else [])
                ),
                extra={"action": "queue_limits", "queue": name},
            )

    async def add_worker(self) -> int:
        """Start one more worker of the first served queue (at most 255 in
        all); return the new count of every queue's."""
        if self.worker_count >= MAX_WORKERS:
            raise ValueError(f"a server runs at most {MAX_WORKERS} workers")
        await self.queues[0].add_worker()
        return self.worker_count

    async def remove_worker(self) -> int:
        """Stop one worker of the first served queue after its current job;
        at least one remains. Returns the new count of every queue's."""
        await self.queues[0].remove_worker()
        return self.worker_count

    def hurry(self) -> None:
        """Cut a shutdown's grace period short: running handlers are stopped
        now (async ones cancelled and their jobs given back)."""
        self._hurry.set()

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop claiming, let running handlers commit, then stop everything.

        Past ``timeout`` seconds, remaining handlers are cancelled; their jobs
        are recovered through their leases."""
        if self.stopping:
            await self.closed.wait()
            return
        self.stopping = True
        self.partitions.stopping = True
        timeout = self.shutdown_timeout if timeout is None else timeout
        await self.services.stop("supervisor")
        for queue in self.queues:
            await self.services.stop(f"autoscale {queue.name}")
        await self._stop_workers(timeout)
        if self._hurry.is_set():
            timeout = 0.0
        pending = await self.completer.wait(timeout)
        if pending:
            for queue in self.queues:
                await queue.claimer.close()
            await self.partitions.close()
            await self.completer.abandon(pending)
        # Next heads the last successes claimed, which no worker will start.
        await self.partitions.release_spares()
        await self.services.stop_all()
        self.notifier.stop()
        for extension in self._extensions:
            await extension.stop()  # e.g. the dashboard's figures since its last row
        await self.parts.membership.leave()
        for pool in self.parts.thread_pools():
            pool.shutdown(wait=False, cancel_futures=True)
        # Without this, each pool thread's connection stays open until garbage
        # collection (on PostgreSQL, a session per thread of an in-process server).
        await asyncio.to_thread(self.store.close, CONNECTION_CLOSE_TIMEOUT)
        await self.notifier.join(CONNECTION_CLOSE_TIMEOUT)
        for queue in self.queues:
            await queue.claimer.close()
        await self.partitions.close()
        await self.completer.close()
        self.closed.set()
        await self.services.close(CONNECTION_CLOSE_TIMEOUT)
        if events.active:
            events.emit(events.ServerStopped(self.server_id, self.namespace, self.processed))
        logger.info(
            "later server %s stopped after %d jobs",
            self.server_id,
            self.processed,
            extra={"action": "server_stopped"},
        )

    async def _stop_workers(self, timeout: float) -> None:
        """Let every worker finish its job within ``timeout``; give back what
        the deadline stopped, and the spares no worker took."""
        pools = self.parts.pools.all
        aborted = sum(
            await asyncio.gather(*(pool.stop_all(timeout, self._hurry) for pool in pools))
        )
        if aborted:
            stopped = [job for pool in pools for job in pool.stopped_jobs]
            given = await self.queues[0].claimer.give_back(stopped)
            logger.warning(
                "shutdown deadline passed: stopped %d running jobs; %d given back to run "
                "again at once (the attempt not counted), %d left to their leases (sync "
                "handlers go on in their threads until the process exits)",
                aborted,
                given,
                aborted - given,
                extra={"action": "shutdown_abort", "given_back": given},
            )
        for queue in self.queues:
            await queue.claimer.release_spares()

    # -- what extensions see (worker/extensions.py, ServerFacts) ------------------
    @property
    def served_queues(self) -> str:
        """The queues served, as later_server records them: "emails,default"."""
        return self.parts.membership.served_queues

    def worker_counts(self) -> tuple[int, int]:
        """(workers, busy workers) of this server, for later_workers."""
        slots = [slot for queue in self.queues for slot in queue.pool.slots]
        busy = sum(1 for slot in slots if slot.busy_since is not None)
        return self.worker_count, busy

    def partition_local(self) -> PartitionLocal:
        """This server's partition leases, workers and claim counts."""
        return PartitionLocal(
            active=dict(Counter(topic for topic, _ in list(self.partitions.held))),
            workers=self.partition_pool.count,
            counts=dict(self.partitions.counts),
        )

    async def run_db(self, op: Callable[[Dialect, CursorWrapper], T]) -> T:
        """Run ``op(dialect, cursor)`` on the service pool (for extensions)."""
        return await self.store.run(self.parts.service_pool, op)
