"""Prometheus metrics, fed by the events hook (never by a write per job).

Nothing runs until ``install()`` (``later_worker --metrics-port``, or the app
in a web process with ``django_prometheus``), so until then jobs pay nothing.
Metrics go to prometheus_client's default registry. The families are in
``families``, ``job_events`` (fed by events) and ``gauges``.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry

from later_django.metrics.gauges import LagValues
from later_django.metrics.job_events import Metrics

__all__ = [
    "Metrics",
    "install",
    "install_for_web",
    "installed",
    "read_limited_jobs",
    "read_retained_log_lag",
    "read_stage_counts",
]

_installed: Metrics | None = None
_install_lock = threading.Lock()


def install(registry: CollectorRegistry = REGISTRY) -> Metrics:
    """Create later's metrics in ``registry`` and subscribe them to events,
    once per process; return them."""
    global _installed
    with _install_lock:
        if _installed is None:
            metrics = Metrics(registry)
            metrics.subscribe()
            _installed = metrics
        return _installed


def installed() -> Metrics | None:
    """later's metrics if install() ran in this process."""
    return _installed


def read_stage_counts() -> dict[tuple[str, str], int]:
    """The namespace's counts per queue and stage, through the calling
    thread's connection."""
    from django.db import connections

    from later_django.conf import conf
    from later_django.db import dialect_for
    from later_django.queue_names import counts_by_queue

    alias = conf.database
    with connections[alias].cursor() as cursor:
        lanes = dialect_for(alias).reads.lane_counts(cursor, namespace=conf.namespace)
    return counts_by_queue(lanes)


def read_retained_log_lag() -> LagValues:
    """The lag LATER["RETAINED_LOG_LAG"] names, through the calling thread's
    connection; nothing is read when it names nothing."""
    from later_django.retained_log.reads import configured_lag

    return configured_lag()


def read_limited_jobs() -> dict[str, int]:
    """The ready jobs a limit holds back, per declared queue with limits,
    through the calling thread's connection; nothing is read when no queue
    has limits."""
    from django.db import connections

    from later_django import limits, registry
    from later_django.conf import conf
    from later_django.db import dialect_for

    limited = limits.served_limits(conf.QUEUES, registry.keyed_queues())
    if not limited:
        return {}
    alias = conf.database
    with connections[alias].cursor() as cursor:
        return dialect_for(alias).limits.held(cursor, namespace=conf.namespace, limits=limited)


def install_for_web(refresh_seconds: float) -> Metrics:
    """Metrics in a web process: stage counts, retained-log lag and the
    jobs limits hold back read on scrape, at most once per ``refresh_seconds``."""
    metrics = install()
    metrics.queue.read, metrics.queue.max_age = read_stage_counts, refresh_seconds
    metrics.lag.read, metrics.lag.max_age = read_retained_log_lag, refresh_seconds
    metrics.held.read, metrics.held.max_age = read_limited_jobs, refresh_seconds
    return metrics
