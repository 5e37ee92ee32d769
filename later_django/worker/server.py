"""The worker server: one asyncio loop running N worker tasks plus its services.

The server builds the parts and runs their life cycle; each part does one
job: the Claimer claims, the WorkerPool runs handlers, the Completer stores
outcomes, the LeaseBook renews leases and holds their deadlines, the
supervisor replaces dead and hung workers, maintenance runs the periodic
steps. Every task belongs to one TaskGroup. Nothing here decides what a
job's outcome is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from later_django import events, limits, registry, tracing
from later_django import queues as later_queues
from later_django.conf import conf
from later_django.context import build_app
from later_django.db.rows import Heartbeat
from later_django.leases import Leader
from later_django.maintenance.runner import Maintenance
from later_django.maintenance.steps import StepContext
from later_django.metrics_feed import MetricsFeed
from later_django.partitions.reserved import recurring_partitions, registered_topics
from later_django.threaded_store import ThreadedStore, new_pool
from later_django.types import PartitionLocal
from later_django.version import __version__
from later_django.worker import extensions, supervisor
from later_django.worker.atomic import AtomicRunner
from later_django.worker.claimer import Claimer
from later_django.worker.completer import Completer
from later_django.worker.executor import Executor
from later_django.worker.handler_threads import HandlerThreads
from later_django.worker.lease_book import Claim, LeaseBook
from later_django.worker.notifier import Notifier, Wakeup
from later_django.worker.partitions import PartitionClaimer, PartitionWakeup
from later_django.worker.queue_workers import QueueWorkers
from later_django.worker.services import ServiceGroup
from later_django.worker.status import StatusReporter
from later_django.worker.workers import MAX_WORKERS, WorkerPool, WorkerSlot

__all__ = ["MAX_WORKERS", "Server", "WorkerSlot"]

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

    from later_django.db.base import Dialect
    from later_django.metrics import Metrics

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Thread pools, each thread with its own connection (opened when first
# used): at most 4 + 4 + 2, plus the claim, completion and LISTEN
# connections (docs/how-to/operations.md, "Connections").
DB_THREADS = 4  # storing failures and retries: a statement each, about a millisecond
SERVICE_THREADS = 4  # renewals, heartbeat, backlog readings, giving back claims
MAINTENANCE_THREADS = 2
PG_BACKSTOP_POLL = 1.0  # seconds; LISTEN wakes workers, this only covers a lost listener
CONNECTION_CLOSE_TIMEOUT = 2.0  # seconds shutdown waits for pool threads to release connections


class Server:
    """A supervised pool of workers sharing the LATER database and namespace."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        autoscale: tuple[int, int] | None = None,
        shutdown_timeout: float | None = None,
        metrics: Metrics | None = None,
        queues: dict[str, int] | None = None,
    ) -> None:
        # The metrics this server feeds (later_worker --metrics-port), if any.
        self.metrics = metrics
        self.alias = conf.database
        self.namespace = conf.namespace
        self.initial_workers = int(workers if workers is not None else conf.WORKERS)
        autoscale = autoscale if autoscale is not None else conf.AUTOSCALE
        self.autoscale = tuple(autoscale) if autoscale else None
        if not 1 <= self.initial_workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1..{MAX_WORKERS}, got {self.initial_workers}")
        if self.autoscale and not 1 <= self.autoscale[0] <= self.autoscale[1] <= MAX_WORKERS:
            raise ValueError(f"autoscale must be (min, max) within 1..{MAX_WORKERS}")
        if self.autoscale:
            self.initial_workers = min(
                max(self.initial_workers, self.autoscale[0]), self.autoscale[1]
            )
        # The queues served and their workers (later_worker --queues):
        # every declared queue with the server's worker count by default.
        served = dict(queues) if queues else later_queues.served(None, self.initial_workers)
        if self.autoscale:
            low, high = self.autoscale
            served = {name: min(max(count, low), high) for name, count in served.items()}
        if sum(served.values()) > MAX_WORKERS or min(served.values()) < 1:
            raise ValueError(
                f"a server runs 1..{MAX_WORKERS} workers in all, each queue at least one; "
                f"got {served}"
            )
        self.shutdown_timeout = (
            shutdown_timeout if shutdown_timeout is not None else conf.seconds("SHUTDOWN_TIMEOUT")
        )
        host = socket.gethostname()[:40]
        self.server_id = f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
        lease_ms = conf.millis("LEASE_DURATION")
        retention_ms = conf.millis("DASHBOARD_RETENTION")
        self.store = ThreadedStore(self.alias)
        wakes = {name: Wakeup() for name in served}
        # What each served queue's claims keep (docs/how-to/rate-limits.md,
        # docs/how-to/concurrency-limits.md): known at start from the settings and
        # the registered types; a queue without limits claims plainly.
        keyed_queues = registry.keyed_queues()
        self.limits = {
            name: found
            for name in served
            if (found := limits.queue_limits(conf.QUEUES, keyed_queues, name)) is not None
        }
        self.stopping = False
        self.closed = asyncio.Event()
        self._hurry = asyncio.Event()  # set by hurry(): the grace period ends now
        # What rides along (worker/extensions.py), made at start.
        self._extensions: list[extensions.Extension] = []
        self.services = ServiceGroup()
        # Claims and successes go through connections of their own; only
        # failures and retries use this pool, one statement each.
        self._db_pool = new_pool("db", 1 if self.store.dialect.single_writer else DB_THREADS)
        self._service_pool = new_pool("service", SERVICE_THREADS)
        self._handler_pool = HandlerThreads(MAX_WORKERS + 1)
        self.leader = Leader(namespace=self.namespace, owner=self.server_id, ttl_ms=lease_ms)
        vacuum = conf.VACUUM_INTERVAL
        self.maintenance = Maintenance(
            self.store,
            new_pool("maintenance", MAINTENANCE_THREADS),
            StepContext(
                alias=self.alias,
                namespace=self.namespace,
                retention_ms=retention_ms,
                stuck_grace_ms=conf.millis("STUCK_JOB_GRACE"),
                server_ttl_ms=max(4 * conf.millis("PARTITION_HEARTBEAT_TTL"), 60_000),
                vacuum_interval_ms=int(vacuum.total_seconds() * 1000) if vacuum else None,
                leader=self.leader,
                missed_grace_ms=conf.millis("RECURRING_MISSED_GRACE"),
                schedule_ahead_ms=2 * conf.millis("MAINTENANCE_INTERVAL"),
            ),
            conf.seconds("MAINTENANCE_INTERVAL"),
            lease=lease_ms / 1000,
            wake=self.wake_every_queue,
        )
        self.leases = LeaseBook(
            store=self.store, pool=self._service_pool, owner=self.server_id, lease_ms=lease_ms
        )
        # Whether the claims and completions on connections of their own are
        # prepared statements (PostgreSQL), as the settings say at start.
        self.prepare = bool(conf.PREPARED_STATEMENTS)
        self.completer = Completer(
            alias=self.alias,
            owner=self.server_id,
            retention_ms=retention_ms,
            store=self.store,
            pool=self._db_pool,
            leases=self.leases,
            wake=self.wake_every_queue,
            maintenance=self.maintenance,
            prepare=self.prepare,
        )
        # Partition pollers run where topics are set (docs/how-to/partitions.md).
        self.topics = bool(conf.TOPICS) or recurring_partitions() is not None
        self.partition_wake = PartitionWakeup()
        self.notifier = Notifier(
            wakes,
            alias=self.alias,
            namespace=self.namespace,
            listen=self.store.dialect.supports_listen,
            watch=self.store.dialect.supports_change_counter,
            partition_wake=self.partition_wake if self.topics else None,
            keyed=frozenset(name for name, found in self.limits.items() if found.keyed),
        )
        poll = conf.seconds("POLL_INTERVAL")
        poll_interval = max(poll, PG_BACKSTOP_POLL) if self.notifier.listen else poll
        executor = Executor(
            self._handler_pool,
            app=build_app(),
            atomic=AtomicRunner(alias=self.alias, owner=self.server_id, retention_ms=retention_ms),
            traced=tracing.enabled(),
        )
        self.queues: list[QueueWorkers] = []
        for name, count in served.items():
            # Workers are numbered across queues, so logs and metrics tell them apart.
            first_id = sum(queue.workers for queue in self.queues)
            self.queues.append(
                self._queue_workers(name, count, wakes[name], executor, poll_interval, first_id)
            )
        self.partitions = PartitionClaimer(
            alias=self.alias,
            namespace=self.namespace,
            owner=self.server_id,
            store=self.store,
            pool=self._service_pool,
            leases=self.leases,
            wake=self.partition_wake,
            partition_lease_ms=conf.millis("PARTITION_LEASE_DURATION"),
            server_ttl_ms=conf.millis("PARTITION_HEARTBEAT_TTL"),
            prepare=self.prepare,
        )
        self.partition_pool = WorkerPool(
            claimer=self.partitions,
            completer=self.completer,
            executor=executor,
            owner=self.server_id,
            tasks=self.services,
            wake=self.partition_wake,
            poll_interval=poll_interval,
            first_id=1000,
            kind="partition-worker",
        )
        self.partitions.on_lost = self.leases.give_up
        self.completer.on_lane_done = self.partitions.done
        self.completer.wants_next = self.partitions.wants_next
        self.completer.on_next_head = self.partitions.next_head
        self.leases.on_given_up = self._claim_given_up
        self.leases.on_cancel_requested = self._cancel_requested
        self.maintenance.on_rescued = self.completer.outcomes.add_recovered
        self.status = StatusReporter(
            self.completer.outcomes, self.ready_backlog, lambda: self.worker_count
        )

    def _queue_workers(
        self,
        name: str,
        count: int,
        wake: Wakeup,
        executor: Executor,
        poll_interval: float,
        first_id: int,
    ) -> QueueWorkers:
        claimer = Claimer(
            alias=self.alias,
            namespace=self.namespace,
            owner=self.server_id,
            store=self.store,
            pool=self._service_pool,
            leases=self.leases,
            wake=wake,
            prepare=self.prepare,
            queue=name,
            limits=self.limits.get(name),
        )
        pool = WorkerPool(
            claimer=claimer,
            completer=self.completer,
            executor=executor,
            owner=self.server_id,
            tasks=self.services,
            wake=wake,
            poll_interval=poll_interval,
            first_id=first_id,
            queue=name,
        )
        found = self.limits.get(name)
        pool.wake_when_stored = found is not None and found.keyed
        return QueueWorkers(name, count, wake, claimer, pool, self.store, self.autoscale)

    def wake_every_queue(self, count: int | None = None) -> None:
        """Jobs became ready in queues this server cannot tell (continuations
        released, delayed jobs promoted): wake the workers of each."""
        for queue in self.queues:
            queue.wake.wake(count)

    @property
    def _pools(self) -> list[WorkerPool]:
        return [queue.pool for queue in self.queues] + [self.partition_pool]

    def _claim_given_up(self, claim: Claim, why: str) -> None:
        for queue in self.queues:
            queue.claimer.drop(claim)
        self.partitions.drop(claim)
        for pool in self._pools:
            pool.stop_handler_of(claim, why)

    def _cancel_requested(self, claim: Claim) -> None:
        for pool in self._pools:
            pool.cancel_handler_of(claim)

    # -- what tests, the supervisor and the command use --------------------------
    # A server of one queue is one queue's workers: claimer and wake are the
    # first served queue's.
    @property
    def claimer(self) -> Claimer:
        return self.queues[0].claimer

    @property
    def wake(self) -> Wakeup:
        return self.queues[0].wake

    @property
    def worker_count(self) -> int:
        return sum(queue.pool.count for queue in self.queues)

    @property
    def slots(self) -> list[WorkerSlot]:
        """Every worker the supervisor watches: plain and partition ones."""
        return [slot for pool in self._pools for slot in pool.slots]

    @property
    def processed(self) -> int:
        return sum(pool.processed for pool in self._pools)

    async def renew_leases(self) -> list[Claim]:
        return await self.leases.renew()

    def replace_worker(self, slot: WorkerSlot) -> WorkerSlot:
        pool = next(pool for pool in self._pools if slot in pool.slots)
        return pool.replace(slot)

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
        """Jobs of the served queues ready to run now (none of a paused
        queue), read from the counters."""
        return sum([await queue.ready_backlog() for queue in self.queues])

    # -- lifecycle --------------------------------------------------------------
    async def start(self) -> None:
        """Start the services and the workers; return once they run."""
        self.notifier.start()
        await self.services.open()
        # Workers first, so the first heartbeat reports their number, not 0.
        for queue in self.queues:
            for _ in range(queue.workers):
                queue.pool.spawn()
        if events.active:  # before any worker task has run
            events.emit(events.ServerStarted(self.server_id, self.namespace, self.worker_count))
        await self._heartbeat_once()
        if self.topics:
            await self._start_partitions()
        self.services.start("renew", self.leases.run_renewals)
        self.services.start("deadlines", self.leases.run_deadlines)
        self.services.start("cancels", self.leases.run_cancel_checks)
        for queue in self.queues:
            self.services.start(f"poll {queue.name}", queue.pool.run_backstop)
        self.services.start("heartbeat", self._heartbeat_loop)
        self.services.start("maintenance", self.maintenance.run)
        self.services.start("supervisor", lambda: supervisor.supervise(self))
        self.services.start("status", self.status.run)
        self._extensions = [make(self) for make in extensions.registered()]
        if self.metrics is not None:
            self._extensions.append(MetricsFeed(self.metrics, self))
        for extension in self._extensions:
            self.services.start(extension.name, extension.run)
        if self.autoscale:
            for queue in self.queues:
                self.services.start(
                    f"autoscale {queue.name}", functools.partial(supervisor.autoscale, queue)
                )
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

    @property
    def served_queues(self) -> str:
        """The queues served, as later_server records them: "emails,default"."""
        return ",".join(queue.name for queue in self.queues)

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
        aborted = sum(
            await asyncio.gather(*(pool.stop_all(timeout, self._hurry) for pool in self._pools))
        )
        if aborted:
            stopped = [job for pool in self._pools for job in pool.stopped_jobs]
            given = await self.claimer.give_back(stopped)
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
        try:
            await self.store.run(self._service_pool, self._deregister)
        except Exception as exc:  # noqa: BLE001  best effort: the rows expire anyway
            logger.warning("could not deregister server %s: %s", self.server_id, exc)
        for pool in (self._db_pool, self._service_pool, self._handler_pool, self.maintenance.pool):
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

    def _deregister(self, dialect: Any, cursor: Any) -> None:
        """Leave the cluster: another server leads at its next tick."""
        self.leader.release_all(dialect, cursor)
        if self.topics:
            self.partitions.release_all(dialect, cursor)
        dialect.cluster.server_remove(cursor, server_id=self.server_id)

    async def _start_partitions(self) -> None:
        """Register the topics, learn the live topic servers, then start as
        many partition workers as plain ones."""
        topics = registered_topics()
        await self.store.run(
            self._service_pool,
            lambda d, c: [
                d.partitions.topic_register(
                    c, namespace=self.namespace, name=name, partitions=count
                )
                for name, count in topics.items()
            ],
            atomic=True,
        )
        await self.partitions.refresh()
        for _ in range(self.initial_workers):
            self.partition_pool.spawn()
        interval = min(
            conf.seconds("PARTITION_HEARTBEAT_INTERVAL"),
            conf.seconds("PARTITION_LEASE_DURATION") / 3,
        )
        self.services.start("partitions", lambda: self.partitions.run_refresh(interval))
        self.services.start("partition-poll", self.partition_pool.run_backstop)

    async def _heartbeat_once(self) -> None:
        await self.store.run(
            self._service_pool,
            lambda d, c: d.cluster.server_heartbeat(
                c,
                Heartbeat(
                    server_id=self.server_id,
                    namespace=self.namespace,
                    hostname=socket.gethostname()[:255],
                    pid=os.getpid(),
                    workers=self.worker_count,
                    topics=self.topics,
                    queues=self.served_queues,
                    version=__version__[:64],
                ),
            ),
        )

    async def run_db(self, op: Callable[[Dialect, CursorWrapper], T]) -> T:
        """Run ``op(dialect, cursor)`` on the service pool (for extensions)."""
        return await self.store.run(self._service_pool, op)

    async def _heartbeat_loop(self) -> None:
        interval = conf.seconds("PARTITION_HEARTBEAT_INTERVAL")
        while True:
            await asyncio.sleep(interval)
            try:
                await self._heartbeat_once()
            except Exception as exc:  # noqa: BLE001
                logger.error("heartbeat failed: %s", exc, extra={"action": "heartbeat_error"})
