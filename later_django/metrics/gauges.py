"""The gauges read from the database (the namespace's counts, the jobs limits
hold back, retained-log lag, partitions) and those of this process's own
workers and partitions. A worker's metrics service feeds the first kind
(metrics_feed.py); elsewhere a scrape reads them when they are stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from later_django.types import PartitionLocal, PartitionStats

StageCounts = Callable[[], dict[tuple[str, str], int]]


class QueueCollector(Collector):
    """``later_queue_jobs``: jobs per stage in the namespace, from the
    database's counters, read at most once per refresh interval.

    A worker's service feeds it (``set``); elsewhere a scrape reads the
    counters when stale. The same value in every process: aggregate with ``max``."""

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
    queue with limits (never a key as a label). Fed like QueueCollector."""

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
    names, summed over partitions. Fed like QueueCollector."""

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

    Depth, backlog and oldest head's age come from partition_stats() (an
    index probe per partition), fed by the worker's metrics service, the
    same in every such process (aggregate with ``max``); leases held, live
    partition workers and the claimer's counters are this process's own,
    read on scrape."""

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
