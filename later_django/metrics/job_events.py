"""The metric families fed by the events hook (``later_django.events``):
transitions, handler and job durations, waits, worker commands, duplicates.

Labels are bounded: the queue, the payload type, a worker's number in its
process, an outcome or a stage; never a job id, an error text or a server id.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.registry import Collector

from later_django import events
from later_django.metrics.families import CounterFamily, HistogramFamily, observe
from later_django.metrics.gauges import (
    HeldCollector,
    LagCollector,
    PartitionCollector,
    QueueCollector,
    WorkersCollector,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

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
# A JobFinished's series: the running and the outcome transitions, handler
# duration, job duration, wait, command.
FinishedSeries = tuple[list[float], list[float], list[float], list[float], list[float], list[float]]


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
            observe(handler, event.handler_seconds)
            observe(duration, since_created if since_created > 0 else 0.0)
            observe(wait, waited if waited > 0 else 0.0)
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
