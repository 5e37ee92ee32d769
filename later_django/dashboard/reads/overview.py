"""The dashboard's overview page, computed at most once a second and served
to every viewer from Django's cache, and its queue-length graph from the
per-minute samples. Nothing here grows with the backlog.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.cache import cache
from django.db import connections

from later_django import queue_names
from later_django.conf import conf
from later_django.dashboard.reads.source import (
    CACHE_SECONDS,
    LIVE_WITHIN_MS,
    dialect_cursor,
    served,
)
from later_django.dashboard.waits import WaitSummary, merged
from later_django.db.rows import LiveServer, RunningJob, StatReading
from later_django.maintenance.steps import SAMPLE_INTERVAL_MS
from later_django.states import Stage

THROUGHPUT_WINDOW_MS = 60_000
WAITS_WINDOW_MS = 60_000
RUNNING_SHOWN = 200  # running jobs listed under their servers, at most
SAMPLE_RANGES = {"1h": 3600_000, "24h": 24 * 3600_000, "7d": 7 * 24 * 3600_000}
SAMPLE_POINTS = 360  # the graph's points at most; a range with more is thinned


# -- overview ---------------------------------------------------------------------------
def overview() -> dict[str, Any]:
    """Counts, rates, waits, servers and size: one computation a second,
    shared through Django's cache by every viewer."""
    key = f"later:dashboard:overview:{conf.database}:{conf.namespace}"
    found = cache.get(key)
    if found is None:
        found = _overview()
        cache.set(key, found, CACHE_SECONDS)
    return found  # type: ignore[no-any-return]


def _overview() -> dict[str, Any]:
    namespace = conf.namespace
    with dialect_cursor() as (dialect, cursor):
        lanes = dialect.reads.lane_counts(cursor, namespace=namespace)
        stats = dialect.reads.stats_since(cursor, namespace=namespace, window_ms=WAITS_WINDOW_MS)
        servers = dialect.reads.live_servers(cursor, namespace=namespace, within_ms=LIVE_WITHIN_MS)
        running = dialect.reads.running_jobs(cursor, namespace=namespace, limit=RUNNING_SHOWN)
        size = dialect.database_size(cursor)
        now_ms = dialect.clock_now(cursor)
    counts = {stage.value: 0 for stage in Stage}
    partitioned = {stage.value: 0 for stage in Stage}
    for count in lanes:
        counts[count.stage] = counts.get(count.stage, 0) + count.n
        if count.lane == queue_names.PARTITION_LANE:
            partitioned[count.stage] = partitioned.get(count.stage, 0) + count.n
    return {
        "namespace": namespace,
        "database": conf.database,
        "vendor": connections[conf.database].vendor,
        "now_ms": now_ms,
        "counts": counts,
        "partition_counts": partitioned,
        "throughput": _throughput(stats, now_ms),
        "waits": _waits(stats),
        "servers": _servers(servers, running, now_ms),
        "database_size_bytes": size,
    }


def _throughput(stats: list[StatReading], now_ms: int) -> dict[str, Any]:
    """Stage changes the workers made in the last 60 s: starts and outcomes,
    per second of the window (oldest first)."""
    seconds = THROUGHPUT_WINDOW_MS // 1000
    per_second = [0] * seconds
    totals = {"started": 0, "succeeded": 0, "retried": 0, "failed": 0}
    for reading in stats:
        age = (now_ms - reading.at_ms) // 1000
        if not 0 <= age < seconds:
            continue
        stat = reading.stat
        counted = (stat.started, stat.succeeded, stat.retried, stat.failed)
        per_second[seconds - 1 - age] += sum(counted)
        for name, n in zip(totals, counted, strict=True):
            totals[name] += n
    changes = sum(per_second)
    return {
        "window_seconds": seconds,
        "stage_changes": changes,
        "per_second": round(changes / seconds, 2),
        "series": per_second,
        **totals,
    }


def _waits(stats: list[StatReading]) -> dict[str, Any]:
    """Dispatch waits (due to started) over the last 60 s, plain and
    partitioned apart: a partition job also waits for its turn."""
    rows = [reading.stat for reading in stats]
    regular = merged((r.regular_waits, r.regular_sum_ms, r.regular_max_ms) for r in rows)
    partition = merged((r.partition_waits, r.partition_sum_ms, r.partition_max_ms) for r in rows)
    return {
        "window_seconds": WAITS_WINDOW_MS // 1000,
        "regular": _wait_dict(regular.summary()),
        "partitioned": _wait_dict(partition.summary()),
    }


def _wait_dict(summary: WaitSummary | None) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in asdict(summary).items()}


def _servers(
    servers: list[LiveServer], running: list[RunningJob], now_ms: int
) -> list[dict[str, Any]]:
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for job in running:
        by_owner.setdefault(job.owner, []).append(
            {
                "id": job.id,
                "type": job.type_name,
                "started_ms": job.started_ms,
                "topic": job.topic,
                "partition": job.partition,
            }
        )
    return [
        {
            "id": server.id,
            "hostname": server.hostname,
            "pid": server.pid,
            "version": server.version,
            "workers": server.workers,
            "topics": server.topics,
            "queues": served(server),
            "started_ms": server.started_ms,
            "heartbeat_age_ms": max(0, now_ms - server.heartbeat_ms),
            "running": by_owner.get(server.id, []),
        }
        for server in servers
    ]


# -- queue-length graph ---------------------------------------------------------------
def samples(range_name: str) -> dict[str, Any]:
    """The per-minute backlog samples of the range, at most SAMPLE_POINTS
    points (each the largest of its stretch), thinned by the database."""
    window = SAMPLE_RANGES[range_name]
    step = max(SAMPLE_INTERVAL_MS, -(-window // (SAMPLE_POINTS - 1)))
    with dialect_cursor() as (dialect, cursor):
        points = dialect.reads.samples_since(
            cursor, namespace=conf.namespace, window_ms=window, step_ms=step
        )
    return {
        "range": range_name,
        "columns": ["at_ms", "ready", "scheduled", "running", "waiting", "partitioned"],
        "points": [
            [p.at_ms, p.ready, p.scheduled, p.running, p.waiting, p.partitioned] for p in points
        ],
    }
