"""Feeds a worker server's metrics: the gauges read from the database on a
service of the server, and the gauges of its own workers and partitions.

A scrape never opens a connection of its own: this feed refreshes the
database figures every METRICS_REFRESH_INTERVAL.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from later_django import queue_names
from later_django.conf import conf
from later_django.retained_log.reads import lag_totals

if TYPE_CHECKING:
    from later_django.metrics.job_events import Metrics
    from later_django.worker.extensions import ServerFacts

logger = logging.getLogger(__name__)


class MetricsFeed:
    """The metrics extension of one worker server."""

    name = "metrics"

    def __init__(self, metrics: Metrics, server: ServerFacts) -> None:
        self.metrics = metrics
        self.server = server
        metrics.workers.count = server.worker_counts
        if server.topics:
            metrics.partitions.local = server.partition_local
        # Fed by run(), not read on scrape.
        metrics.queue.read = None
        metrics.lag.read = None
        metrics.held.read = None

    async def run(self) -> None:
        """Refresh the database gauges: stage counts, retained-log lag, jobs
        limits hold back, and the partition gauges when the server runs topics."""
        interval = conf.seconds("METRICS_REFRESH_INTERVAL")
        lag_wanted = conf.RETAINED_LOG_LAG
        namespace = self.server.namespace
        limited = self.server.limits
        while True:
            lanes = await self._read(
                "later_queue_jobs", lambda d, c: d.reads.lane_counts(c, namespace=namespace)
            )
            if lanes is not None:
                self.metrics.queue.set(queue_names.counts_by_queue(lanes))
            if lag_wanted:
                lag = await self._read(
                    "later_retained_log_consumer_lag",
                    lambda d, c: lag_totals(d, c, namespace=namespace, wanted=lag_wanted),
                )
                if lag is not None:
                    self.metrics.lag.set(lag)
            if limited:
                held = await self._read(
                    "later_queue_limited_jobs",
                    lambda d, c: d.limits.held(c, namespace=namespace, limits=limited),
                )
                if held is not None:
                    self.metrics.held.set(held)
            if self.server.topics:
                stats = await self._read(
                    "the partition gauges",
                    lambda d, c: d.partitions.partition_stats(c, namespace=namespace),
                )
                if stats is not None:
                    self.metrics.partitions.set(stats)
            await asyncio.sleep(interval)

    async def _read(self, what: str, op: Any) -> Any:
        try:
            return await self.server.run_db(op)
        except Exception as exc:  # noqa: BLE001  the gauges keep their last value
            logger.debug("could not refresh %s: %s", what, exc)
            return None

    async def stop(self) -> None:
        pass
