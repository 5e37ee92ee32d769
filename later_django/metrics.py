"""Prometheus metrics, fed by the events hook (never by a write per job).

Nothing here runs until ``install()``: ``later_worker --metrics-port`` calls
it in the worker process, and the app calls it in a web process that has
``django_prometheus`` installed. Until then no subscriber exists, and jobs
pay nothing. Metrics go to prometheus_client's default registry, the one
django-prometheus and ``--metrics-port`` serve.

Labels are bounded: the queue, the payload type, a worker's number in its
process, an outcome or a stage. Never a job id, an error text or a server
id: Prometheus's ``instance`` label tells processes apart.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from later_django import events
from later_django.types import PartitionLocal, PartitionStats

# The stage a stored outcome moves its job to.
OUTCOME_STAGE = {
    "succeeded": "success",
    "retry": "requeued",
    "failed": "failed",
    "snoozed": "delayed",
    "cancelled": "cancelled",
}
# What an attempt's end counts as in later_worker_commands_total.
COMMAND_OUTCOME = {
    "succeeded": "succeeded",
    "retry": "failed",
    "failed": "failed",
    "snoozed": "snoozed",
    "cancelled": "cancelled",
}
# From a millisecond's dispatch to a long batch job.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip

StageCounts = Callable[[], dict[tuple[str, str], int]]
# A JobFinished's series: the running and the outcome transitions, handler
# duration, job duration, wait, command.
FinishedSeries = tuple[list[float], list[float], list[float], list[float], list[float], list[float]]


class CounterFamily(Collector):
    """A counter kept as plain numbers per label tuple, exported on scrape.

    Cheaper per increment than prometheus_client's Counter (no label
    validation, no lock per child): a worker counts several per job. Each
    series is a one-element list, so a subscriber can keep it and add to it
    without looking its labels up again."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        self.values: dict[tuple[str, ...], list[float]] = {}

    def series(self, key: tuple[str, ...]) -> list[float]:
        """The series ``key`` (created at 0); the caller holds the Metrics lock."""
        found = self.values.get(key)
        if found is None:
            found = self.values[key] = [0.0]
        return found

    def inc(self, key: tuple[str, ...]) -> None:
        """Add one to the series ``key``; the caller holds the Metrics lock."""
        self.series(key)[0] += 1

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, (value,) in list(self.values.items()):
            family.add_metric(key, value)
        yield family


def _observe(series: list[float], value: float) -> None:
    series[bisect.bisect_left(DURATION_BUCKETS, value)] += 1
    series[-1] += value


class HistogramFamily(Collector):
    """A histogram kept as bucket counts and a sum per label tuple."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name, self.documentation, self.labels = name, documentation, labels
        # Per series: a count per bucket (the last is +Inf), then the sum.
        self.values: dict[tuple[str, ...], list[float]] = {}

    def series(self, key: tuple[str, ...]) -> list[float]:
        """The series ``key`` (created empty); the caller holds the lock."""
        found = self.values.get(key)
        if found is None:
            found = self.values[key] = [0.0] * (len(DURATION_BUCKETS) + 2)
        return found

    def observe(self, key: tuple[str, ...], value: float) -> None:
        """Record ``value`` in the series ``key``; the caller holds the lock."""
        _observe(self.series(key), value)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        bounds = [*map(str, DURATION_BUCKETS), "+Inf"]
        for key, series in list(self.values.items()):
            cumulative = list(itertools.accumulate(series[:-1]))
            family.add_metric(key, list(zip(bounds, cumulative, strict=True)), series[-1])
        yield family


class Metrics:
    """later's metric families, and the events subscriber that feeds them.

    Events arrive on the worker's event loop and on any thread that commits
    an enqueue; one lock keeps their counts exact, and a scrape reads them
    under the same lock."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lock = threading.Lock()
        self.transitions = CounterFamily(
            "later_job_transitions",
            "Durable stage changes of jobs seen by this process.",
            ("queue", "job_type", "state"),
        )
        self.handler_duration = HistogramFamily(
            "later_job_handler_duration_seconds",
            "How long handlers ran, per worker and outcome.",
            ("queue", "job_type", "worker_id", "outcome"),
        )
        self.job_duration = HistogramFamily(
            "later_job_duration_seconds",
            "From a job's creation to the stored outcome of an attempt.",
            ("queue", "job_type", "outcome"),
        )
        self.wait_duration = HistogramFamily(
            "later_job_wait_duration_seconds",
            "From a job's due time to the start of its handler.",
            ("queue", "job_type"),
        )
        self.commands = CounterFamily(
            "later_worker_commands",
            "Attempts a worker finished: succeeded, failed, or discarded (lease lost).",
            ("worker_id", "outcome"),
        )
        self.duplicates = CounterFamily(
            "later_job_duplicates",
            "Enqueues that found their unique key held by another job and wrote nothing.",
            ("queue", "job_type"),
        )
        # The series each JobFinished adds to, by its labels.
        self._finished: dict[tuple[str, str, int, str], FinishedSeries] = {}
        self.queue = QueueCollector()
        self.workers = WorkersCollector()
        self.lag = LagCollector()
        self.partitions = PartitionCollector()
        self.held = HeldCollector()
        registry.register(_Locked(self))
        registry.register(self.queue)
        registry.register(self.workers)
        registry.register(self.lag)
        registry.register(self.partitions)
        registry.register(self.held)

    def subscribe(self) -> None:
        """Feed these families from the events of this process."""
        events.subscribe(self.on_finished, events.JobFinished)
        events.subscribe(self.on_enqueued, events.JobEnqueued)
        events.subscribe(self.on_lease_lost, events.LeaseLost)
        events.subscribe(self.on_duplicate, events.JobDuplicate)

    # A worker's one event per job (JobFinished: it also says when the handler
    # started) finds the series it adds to in one lookup of its few labels,
    # which keeps metrics on within a few microseconds per job
    # (docs/how-to/monitoring.md, "Cost"). Starts are counted by the dashboard's
    # figures (JobStarted), not here.
    def on_finished(self, event: events.JobFinished) -> None:
        waited, since_created = event.waited, event.since_created
        with self.lock:
            labels = (event.queue, event.job_type, event.worker, event.outcome)
            found = self._finished.get(labels)
            if found is None:
                found = self._finished[labels] = self._finished_series(*labels)
            running, transition, handler, duration, wait, command = found
            running[0] += 1
            transition[0] += 1
            _observe(handler, event.handler_seconds)
            _observe(duration, since_created if since_created > 0 else 0.0)
            _observe(wait, waited if waited > 0 else 0.0)
            command[0] += 1

    def _finished_series(
        self, queue: str, job_type: str, worker: int, outcome: str
    ) -> FinishedSeries:
        return (
            self.transitions.series((queue, job_type, "running")),
            self.transitions.series((queue, job_type, OUTCOME_STAGE[outcome])),
            self.handler_duration.series((queue, job_type, str(worker), outcome)),
            self.job_duration.series((queue, job_type, outcome)),
            self.wait_duration.series((queue, job_type)),
            self.commands.series((str(worker), COMMAND_OUTCOME[outcome])),
        )

    def on_enqueued(self, event: events.JobEnqueued) -> None:
        with self.lock:
            self.transitions.inc((event.queue, event.job_type, event.stage))

    def on_lease_lost(self, event: events.LeaseLost) -> None:
        with self.lock:
            self.commands.inc((str(event.worker), "discarded"))

    def on_duplicate(self, event: events.JobDuplicate) -> None:
        with self.lock:
            self.duplicates.inc((event.queue, event.job_type))


class _Locked(Collector):
    """The event-fed families, read under the lock their updates take."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        m = self.metrics
        families = (
            m.transitions,
            m.handler_duration,
            m.job_duration,
            m.wait_duration,
            m.commands,
            m.duplicates,
        )
        with m.lock:
            collected = [family for source in families for family in source.collect()]
        yield from collected


class QueueCollector(Collector):
    """``later_queue_jobs``: jobs per stage in the namespace, from the
    database's counters, read at most once per refresh interval.

    A worker feeds it from a service of its own (``set``); elsewhere (a web
    process) a scrape reads the counters itself when they are stale. Every
    process reports the same shared value: aggregate with ``max``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._read_at = float("-inf")
        # Set in a process without a worker: how to read the counts, and how
        # old they may be before a scrape reads them again.
        self.read: StageCounts | None = None
        self.max_age = 5.0

    def set(self, counts: dict[tuple[str, str], int]) -> None:
        with self._lock:
            self._counts, self._read_at = dict(counts), time.monotonic()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.read is not None and time.monotonic() - self._read_at >= self.max_age:
            self.set(self.read())
        family = GaugeMetricFamily(
            "later_queue_jobs", "Jobs per stage in the namespace (use max across instances).",
            labels=["queue", "state"],
        )  # fmt: skip
        with self._lock:
            for (queue, stage), count in self._counts.items():
                family.add_metric([queue, stage], count)
        yield family


class HeldCollector(Collector):
    """``later_queue_limited_jobs``: ready jobs a limit holds back now, per
    queue with limits (a rate limit spent for the window, or a concurrency
    key at its limit; never a key as a label), read at most once per
    refresh interval.

    Fed like QueueCollector: by the worker's metrics service (``set``, the
    queues it serves), or on scrape in a process without a worker (every
    declared queue with limits). The same shared value in every process:
    aggregate with ``max``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._read_at = float("-inf")
        self.read: Callable[[], dict[str, int]] | None = None
        self.max_age = 5.0

    def set(self, held: dict[str, int]) -> None:
        with self._lock:
            self._held, self._read_at = dict(held), time.monotonic()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.read is not None and time.monotonic() - self._read_at >= self.max_age:
            self.set(self.read())
        family = GaugeMetricFamily(
            "later_queue_limited_jobs",
            "Ready jobs a rate limit or a concurrency key's limit holds back now "
            "(use max across instances).",
            labels=["queue"],
        )
        with self._lock:
            for queue, held in sorted(self._held.items()):
                family.add_metric([queue], held)
        yield family


LagValues = dict[tuple[str, str], int]


class LagCollector(Collector):
    """``later_retained_log_consumer_lag``: records appended but not committed,
    per retained-log topic and consumer group that LATER["RETAINED_LOG_LAG"]
    names, summed over partitions; read at most once per refresh interval.

    Fed like QueueCollector: by the worker's metrics service (``set``), or on
    scrape in a process without a worker. The same shared value in every
    process: aggregate with ``max``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: LagValues = {}
        self._read_at = float("-inf")
        self.read: Callable[[], LagValues] | None = None
        self.max_age = 5.0

    def set(self, values: LagValues) -> None:
        with self._lock:
            self._values, self._read_at = dict(values), time.monotonic()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.read is not None and time.monotonic() - self._read_at >= self.max_age:
            self.set(self.read())
        family = GaugeMetricFamily(
            "later_retained_log_consumer_lag",
            "Retained-log records appended but not committed by a consumer group "
            "(use max across instances).",
            labels=["topic", "group"],
        )
        with self._lock:
            for (topic, group), lag in sorted(self._values.items()):
                family.add_metric([topic, group], lag)
        yield family


class PartitionCollector(Collector):
    """Sequential partition mode, in a worker that runs partition workers.

    From partition_stats() (an index probe per partition, no count over
    jobs), refreshed by the worker's metrics service; the same shared values
    in every such process (aggregate with ``max``):
    ``later_partition_queue_depth`` (unfinished jobs of a partition),
    ``later_partition_backlog`` (of a topic) and
    ``later_partition_oldest_head_age_seconds`` (how long a topic's oldest
    due head has waited). From this process, read on scrape:
    ``later_partitions_active`` (partition leases it holds, by topic),
    ``later_partition_workers_live``, and the counters of its claims, heads
    claimed and lease renewals (``PartitionClaimer.counts``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: list[PartitionStats] = []
        self.local: Callable[[], PartitionLocal] | None = None

    def set(self, stats: list[PartitionStats]) -> None:
        with self._lock:
            self._stats = list(stats)

    def collect(self) -> Iterator[Any]:
        with self._lock:
            stats = list(self._stats)
        depth = GaugeMetricFamily(
            "later_partition_queue_depth",
            "Unfinished jobs of a partition (use max across instances).",
            labels=["topic", "partition"],
        )
        backlog = GaugeMetricFamily(
            "later_partition_backlog",
            "Unfinished jobs of a topic's partitions (use max across instances).",
            labels=["topic"],
        )
        age = GaugeMetricFamily(
            "later_partition_oldest_head_age_seconds",
            "How long the topic's oldest due partition head has waited (use max).",
            labels=["topic"],
        )
        now_ms = time.time() * 1000
        totals: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for row in stats:
            depth.add_metric([row.topic, str(row.partition)], row.depth)
            totals[row.topic] = totals.get(row.topic, 0) + row.depth
            due = row.head_run_at_ms
            waited = 0.0 if due is None else max(now_ms - due, 0.0) / 1000
            oldest[row.topic] = max(oldest.get(row.topic, 0.0), waited)
        for topic in sorted(totals):
            backlog.add_metric([topic], totals[topic])
            age.add_metric([topic], oldest[topic])
        yield from (depth, backlog, age)
        yield from self._local_families()

    def _local_families(self) -> Iterator[Any]:
        active = GaugeMetricFamily(
            "later_partitions_active",
            "Partition leases this process holds.",
            labels=["topic"],
        )
        live = GaugeMetricFamily(
            "later_partition_workers_live", "Partition workers of this process."
        )
        claims = CounterMetricFamily(
            "later_partition_claims",
            "Partition leases taken or kept for a claim by this process.",
            labels=["topic"],
        )
        heads = CounterMetricFamily(
            "later_partition_heads_claimed",
            "Partition heads this process claimed.",
            labels=["topic"],
        )
        renewals = CounterMetricFamily(
            "later_partition_lease_renewals",
            "Partition lease renewals of this process: renewed, or lost.",
            labels=["topic", "outcome"],
        )
        if self.local is not None:
            local = self.local()
            for topic, count in sorted(local.active.items()):
                active.add_metric([topic], count)
            live.add_metric([], local.workers)
            for (name, topic, outcome), value in sorted(local.counts.items()):
                if name == "claims":
                    claims.add_metric([topic], value)
                elif name == "heads":
                    heads.add_metric([topic], value)
                else:
                    renewals.add_metric([topic, outcome], value)
        yield from (active, live, claims, heads, renewals)


class WorkersCollector(Collector):
    """``later_workers``: this process's worker tasks, all of them (active)
    and those running a handler now (busy)."""

    def __init__(self) -> None:
        self.count: Callable[[], tuple[int, int]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "later_workers", "Worker tasks of this process: active, and busy running a handler.",
            labels=["state"],
        )  # fmt: skip
        if self.count is not None:
            active, busy = self.count()
            family.add_metric(["active"], active)
            family.add_metric(["busy"], busy)
        yield family


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
