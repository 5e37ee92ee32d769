"""Builds the parts of one worker server, each handed its collaborators when
it is made, so a part that lacks one fails at once rather than at its first
job. It starts nothing: worker/server.py runs the parts' life cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from later_django import tracing
from later_django.conf import conf
from later_django.context import build_app
from later_django.leases import Leader
from later_django.maintenance.runner import Maintenance
from later_django.maintenance.steps import StepContext
from later_django.threaded_store import ThreadedStore, new_pool
from later_django.worker.atomic import AtomicRunner
from later_django.worker.claimer import Claimer, ClaimSetup
from later_django.worker.completer import Completer
from later_django.worker.executor import Executor
from later_django.worker.handler_threads import HandlerThreads
from later_django.worker.lease_book import LeaseBook
from later_django.worker.membership import Membership
from later_django.worker.notifier import Notifier, Wakeup
from later_django.worker.partitions import PartitionClaimer, PartitionWakeup
from later_django.worker.plan import ServerPlan
from later_django.worker.queue_workers import QueueWorkers, ready_backlog, worker_count
from later_django.worker.services import ServiceGroup
from later_django.worker.status import OutcomeCounts, StatusReporter
from later_django.worker.workers import MAX_WORKERS, WorkerPool, WorkerPools

# Thread pools, each thread with its own connection (opened when first
# used): at most 4 + 4 + 2, plus the claim, completion and LISTEN
# connections (docs/how-to/operations.md, "Connections").
DB_THREADS = 4  # storing failures and retries: a statement each, about a millisecond
SERVICE_THREADS = 4  # renewals, heartbeat, backlog readings, giving back claims
MAINTENANCE_THREADS = 2
PG_BACKSTOP_POLL = 1.0  # seconds; LISTEN wakes workers, this only covers a lost listener
PARTITION_WORKER_IDS = 1000  # partition workers are numbered from here


@dataclass(eq=False, kw_only=True)
class Parts:
    """The parts of one server; worker/server.py runs them."""

    store: ThreadedStore
    service_pool: ThreadPoolExecutor  # renewals, heartbeat, readings, extensions' calls
    services: ServiceGroup
    pools: WorkerPools
    leases: LeaseBook
    maintenance: Maintenance
    completer: Completer
    notifier: Notifier
    queues: list[QueueWorkers]
    partitions: PartitionClaimer
    partition_pool: WorkerPool
    membership: Membership
    status: StatusReporter
    handler_threads: HandlerThreads

    def thread_pools(self) -> list[ThreadPoolExecutor | HandlerThreads]:
        """Every thread pool of the server, to shut down at its end."""
        return [self.completer.pool, self.service_pool, self.handler_threads, self.maintenance.pool]


def build_parts(plan: ServerPlan) -> Parts:
    """Make every part of a server that runs ``plan``."""
    store = ThreadedStore(plan.alias)
    service_pool = new_pool("service", SERVICE_THREADS)
    services, pools, outcomes = ServiceGroup(), WorkerPools(), OutcomeCounts()
    lease_ms = conf.millis("LEASE_DURATION")
    leader = Leader(namespace=plan.namespace, owner=plan.server_id, ttl_ms=lease_ms)
    # The pools are the claims' holders: a claim given up stops its handler.
    leases = LeaseBook(
        store=store, pool=service_pool, owner=plan.server_id, lease_ms=lease_ms, holders=pools
    )
    setup = ClaimSetup(
        alias=plan.alias,
        namespace=plan.namespace,
        owner=plan.server_id,
        store=store,
        pool=service_pool,
        leases=leases,
        prepare=plan.prepare,
    )
    partitions = PartitionClaimer(
        setup,
        wake=PartitionWakeup(),
        partition_lease_ms=conf.millis("PARTITION_LEASE_DURATION"),
        server_ttl_ms=conf.millis("PARTITION_HEARTBEAT_TTL"),
    )
    wakes = {name: Wakeup() for name in plan.served}
    notifier = Notifier(
        wakes,
        alias=plan.alias,
        namespace=plan.namespace,
        listen=store.dialect.supports_listen,
        watch=store.dialect.supports_change_counter,
        partitions=partitions if plan.topics else None,
        keyed=frozenset(name for name, found in plan.limits.items() if found.keyed),
    )
    # Jobs became ready in queues this server cannot tell (continuations
    # released, delayed jobs promoted): the workers of each look.
    maintenance = _maintenance(plan, store, leader, wake=notifier.wake_all, outcomes=outcomes)
    retention_ms = conf.millis("DASHBOARD_RETENTION")
    completer = Completer(
        setup,
        retention_ms=retention_ms,
        # Claims and successes go through connections of their own; only
        # failures and retries use this pool, one statement each.
        pool=new_pool("db", 1 if store.dialect.single_writer else DB_THREADS),
        wake=notifier.wake_all,
        maintenance=maintenance,
        lanes=partitions,
        outcomes=outcomes,
    )
    handler_threads = HandlerThreads(MAX_WORKERS + 1)
    poll = conf.seconds("POLL_INTERVAL")
    make_pool = partial(
        WorkerPool,
        completer=completer,
        executor=Executor(
            handler_threads,
            app=build_app(),
            atomic=AtomicRunner(alias=plan.alias, owner=plan.server_id, retention_ms=retention_ms),
            traced=tracing.enabled(),
        ),
        owner=plan.server_id,
        tasks=services,
        poll_interval=max(poll, PG_BACKSTOP_POLL) if notifier.listen else poll,
    )
    queues = _queues(plan, setup, wakes, pools.add, make_pool)
    partition_pool = pools.add(
        make_pool(
            claimer=partitions,
            wake=partitions.wake,
            first_id=PARTITION_WORKER_IDS,
            kind="partition-worker",
        )
    )
    return Parts(
        store=store,
        service_pool=service_pool,
        services=services,
        pools=pools,
        leases=leases,
        maintenance=maintenance,
        completer=completer,
        notifier=notifier,
        queues=queues,
        partitions=partitions,
        partition_pool=partition_pool,
        membership=Membership(
            plan,
            store=store,
            pool=service_pool,
            leader=leader,
            partitions=partitions,
            queues=queues,
        ),
        status=StatusReporter(
            outcomes, partial(ready_backlog, queues), partial(worker_count, queues)
        ),
        handler_threads=handler_threads,
    )


def _queues(
    plan: ServerPlan,
    setup: ClaimSetup,
    wakes: dict[str, Wakeup],
    add_pool: Callable[[WorkerPool], WorkerPool],
    make_pool: Callable[..., WorkerPool],
) -> list[QueueWorkers]:
    """The workers of each served queue: a claimer and a pool apiece."""
    queues: list[QueueWorkers] = []
    for name, count in plan.served.items():
        claimer = Claimer(setup, wake=wakes[name], queue=name, limits=plan.limits.get(name))
        # Workers are numbered across queues, so logs and metrics tell them apart.
        first_id = sum(queue.workers for queue in queues)
        pool = add_pool(
            make_pool(
                claimer=claimer,
                wake=claimer.wake,
                first_id=first_id,
                queue=name,
                wake_when_stored=claimer.limits is not None and claimer.limits.keyed,
            )
        )
        queues.append(QueueWorkers(name, count, claimer.wake, claimer, pool, plan.autoscale))
    return queues


def _maintenance(
    plan: ServerPlan,
    store: ThreadedStore,
    leader: Leader,
    *,
    wake: Callable[[int | None], None],
    outcomes: OutcomeCounts,
) -> Maintenance:
    vacuum = conf.VACUUM_INTERVAL
    lease_ms = conf.millis("LEASE_DURATION")
    return Maintenance(
        store,
        new_pool("maintenance", MAINTENANCE_THREADS),
        StepContext(
            alias=plan.alias,
            namespace=plan.namespace,
            retention_ms=conf.millis("DASHBOARD_RETENTION"),
            stuck_grace_ms=conf.millis("STUCK_JOB_GRACE"),
            server_ttl_ms=max(4 * conf.millis("PARTITION_HEARTBEAT_TTL"), 60_000),
            vacuum_interval_ms=int(vacuum.total_seconds() * 1000) if vacuum else None,
            leader=leader,
            missed_grace_ms=conf.millis("RECURRING_MISSED_GRACE"),
            schedule_ahead_ms=2 * conf.millis("MAINTENANCE_INTERVAL"),
        ),
        conf.seconds("MAINTENANCE_INTERVAL"),
        lease=lease_ms / 1000,
        wake=wake,
        on_rescued=outcomes.add_recovered,
    )
