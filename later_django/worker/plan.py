"""What one server runs: its arguments and the settings, checked once into a
frozen plan that every part of the server is built from."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import cast

from later_django import limits, registry
from later_django import queues as later_queues
from later_django.conf import conf
from later_django.limits import QueueLimits
from later_django.partitions.reserved import recurring_partitions
from later_django.worker.workers import MAX_WORKERS


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerPlan:
    """What one server runs, from its arguments and the settings, checked."""

    alias: str
    namespace: str
    server_id: str
    initial_workers: int
    autoscale: tuple[int, int] | None
    served: dict[str, int]  # queue name -> its workers
    shutdown_timeout: float
    # Partition pollers run where topics are set (docs/how-to/partitions.md).
    topics: bool
    # What each served queue's claims keep (docs/how-to/rate-limits.md,
    # docs/how-to/concurrency-limits.md); a queue without limits claims plainly.
    limits: dict[str, QueueLimits]
    # Whether the worker's own sessions prepare later's statements
    # (PostgreSQL; LATER["PREPARED_STATEMENTS"]), as the settings say at start.
    prepare: bool


def plan_server(
    *,
    workers: int | None,
    autoscale: tuple[int, int] | None,
    shutdown_timeout: float | None,
    queues: dict[str, int] | None,
) -> ServerPlan:
    """Check the arguments (a bad one raises ValueError) and fill in the rest."""
    initial = int(workers if workers is not None else conf.WORKERS)
    scale = autoscale if autoscale is not None else conf.AUTOSCALE
    bounds = cast("tuple[int, int]", tuple(scale)) if scale else None
    if not 1 <= initial <= MAX_WORKERS:
        raise ValueError(f"workers must be 1..{MAX_WORKERS}, got {initial}")
    if bounds and not 1 <= bounds[0] <= bounds[1] <= MAX_WORKERS:
        raise ValueError(f"autoscale must be (min, max) within 1..{MAX_WORKERS}")
    if bounds:
        initial = min(max(initial, bounds[0]), bounds[1])
    # Every declared queue with the server's worker count by default.
    served = dict(queues) if queues else later_queues.served(None, initial)
    if bounds:
        served = {name: min(max(count, bounds[0]), bounds[1]) for name, count in served.items()}
    if sum(served.values()) > MAX_WORKERS or min(served.values()) < 1:
        raise ValueError(
            f"a server runs 1..{MAX_WORKERS} workers in all, each queue at least one; got {served}"
        )
    keyed_queues = registry.keyed_queues()
    return ServerPlan(
        alias=conf.database,
        namespace=conf.namespace,
        server_id=f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}",
        initial_workers=initial,
        autoscale=bounds,
        served=served,
        shutdown_timeout=(
            shutdown_timeout if shutdown_timeout is not None else conf.seconds("SHUTDOWN_TIMEOUT")
        ),
        topics=bool(conf.TOPICS) or recurring_partitions() is not None,
        prepare=conf.prepared_statements,
        limits={
            name: found
            for name in served
            if (found := limits.queue_limits(conf.QUEUES, keyed_queues, name)) is not None
        },
    )
