"""Counters and histograms kept as plain numbers per label tuple and exported
on scrape: cheaper per update than prometheus_client's own, since a worker
updates several per job. The caller holds the lock that guards them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

# From a millisecond's dispatch to a long batch job.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip


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


def observe(series: list[float], value: float) -> None:
    """Add ``value`` to a histogram series: its bucket and its sum."""
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
        observe(self.series(key), value)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        bounds = [*map(str, DURATION_BUCKETS), "+Inf"]
        for key, series in list(self.values.items()):
            cumulative = list(itertools.accumulate(series[:-1]))
            family.add_metric(key, list(zip(bounds, cumulative, strict=True)), series[-1])
        yield family
