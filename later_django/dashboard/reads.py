"""What the dashboard shows, read for its pages and its JSON alike.

Everything here reads counters, small tables or one index range: nothing
grows with the backlog (docs/how-to/dashboard.md has the plans). The overview is
computed at most once a second per cache and served to every viewer from
Django's cache.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields
from typing import Any

from django.core.cache import cache
from django.db import connections
from django.db.backends.utils import CursorWrapper

from later_django import limits, registry
from later_django import queues as later_queues
from later_django.conf import conf
from later_django.dashboard import cursors
from later_django.dashboard.waits import WaitSummary, merged
from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.db.rows import (
    JobPage,
    JobQuery,
    JobSummary,
    LiveServer,
    RunningJob,
    StatReading,
)
from later_django.db.rows.dashboard import QueueStateRow
from later_django.limits import RateLimit
from later_django.maintenance.steps import SAMPLE_INTERVAL_MS
from later_django.partitions.api import partition_stats
from later_django.partitions.reserved import registered_topics
from later_django.recurring.api import list_recurring
from later_django.states import Stage
from later_django.types import PartitionStats

OVERVIEW_CACHE_SECONDS = 1
THROUGHPUT_WINDOW_MS = 60_000
WAITS_WINDOW_MS = 60_000
LIVE_WITHIN_MS = 15_000  # a server whose heartbeat is older is not shown as live
RUNNING_SHOWN = 200  # running jobs listed under their servers, at most
CHILDREN_SHOWN = 25
SAMPLE_RANGES = {"1h": 3600_000, "24h": 24 * 3600_000, "7d": 7 * 24 * 3600_000}
SAMPLE_POINTS = 360  # the graph's points at most; a range with more is thinned


@contextmanager
def _db() -> Iterator[tuple[Dialect, CursorWrapper]]:
    alias = conf.database
    with connections[alias].cursor() as cursor:
        yield dialect_for(alias), cursor


# -- overview ---------------------------------------------------------------------------
def overview() -> dict[str, Any]:
    """Counts, rates, waits, servers and size: one computation a second,
    shared through Django's cache by every viewer."""
    key = f"later:dashboard:overview:{conf.database}:{conf.namespace}"
    found = cache.get(key)
    if found is None:
        found = _overview()
        cache.set(key, found, OVERVIEW_CACHE_SECONDS)
    return found  # type: ignore[no-any-return]


def counts() -> dict[str, int]:
    """Jobs per stage, from the counters: what the job lists' tabs show,
    cached like the overview."""
    key = f"later:dashboard:counts:{conf.database}:{conf.namespace}"
    found = cache.get(key)
    if found is None:
        with _db() as (dialect, cursor):
            found = dialect.reads.stage_counts(cursor, namespace=conf.namespace)
        cache.set(key, found, OVERVIEW_CACHE_SECONDS)
    return found  # type: ignore[no-any-return]


def _overview() -> dict[str, Any]:
    namespace = conf.namespace
    with _db() as (dialect, cursor):
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
        if count.lane == later_queues.PARTITION_LANE:
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
            "queues": _served(server),
            "started_ms": server.started_ms,
            "heartbeat_age_ms": max(0, now_ms - server.heartbeat_ms),
            "running": by_owner.get(server.id, []),
        }
        for server in servers
    ]


def _served(server: LiveServer) -> list[str] | None:
    """The queues ``server`` serves; None for a server of a release before
    queues, which claims from every queue and ignores pause."""
    if server.queues is None:
        return None
    return [name for name in server.queues.split(",") if name]


# -- queues -------------------------------------------------------------------------------
def queues() -> dict[str, Any]:
    """Every queue: each declared in LATER["QUEUES"], then any other with
    jobs counted or a row in later_queue (declared on another site, or no
    longer). For each, its jobs per stage (from the counters), whether it
    is paused, the live servers serving it, and ``stranded`` when it has
    ready jobs and no live server serves it.

    Not cached, unlike the overview: the page a pause redirects to shows
    the pause. It reads the counters, later_queue and later_server, a few
    rows each whatever the backlog."""
    namespace = conf.namespace
    with _db() as (dialect, cursor):
        lanes = dialect.reads.lane_counts(cursor, namespace=namespace)
        states = dialect.reads.queue_states(cursor, namespace=namespace)
        servers = dialect.reads.live_servers(cursor, namespace=namespace, within_ms=LIVE_WITHIN_MS)
        now_ms = dialect.clock_now(cursor)
    counts: dict[str, dict[str, int]] = {}
    for count in lanes:
        name = later_queues.queue_of_lane(count.lane)
        if name is not None:
            by_stage = counts.setdefault(name, {stage.value: 0 for stage in Stage})
            by_stage[count.stage] = by_stage.get(count.stage, 0) + count.n
    declared = later_queues.declared()
    state_of = {state.name: state for state in states}
    rate_limits = _rate_limits()
    keyed = registry.keyed_queues()
    # A lane whose jobs were all deleted keeps a row of zeros (its counts
    # are sums of changes): no queue is shown for it.
    others = {name for name, by_stage in counts.items() if any(by_stage.values())}
    names = [*declared, *sorted((others | set(state_of)) - set(declared))]
    rows = []
    for name in names:
        by_stage = counts.get(name) or {stage.value: 0 for stage in Stage}
        state = state_of.get(name)
        paused = state is not None and state.paused
        serving = [s for s in servers if (served := _served(s)) is None or name in served]
        ready = by_stage[Stage.ENQUEUED]
        limit_of = rate_limits.get(name)
        rows.append(
            {
                "name": name,
                "declared": name in declared,
                "counts": by_stage,
                "ready": ready,
                "delayed": by_stage[Stage.DELAYED] + by_stage[Stage.REQUEUED],
                "running": by_stage[Stage.RUNNING],
                "failed": by_stage[Stage.FAILED],
                "paused": paused,
                "paused_since_ms": state.changed_ms if state is not None and paused else None,
                "servers": [
                    {
                        "id": s.id,
                        "hostname": s.hostname,
                        "pid": s.pid,
                        "previous_release": s.queues is None,
                    }
                    for s in serving
                ],
                "stranded": ready > 0 and not serving,
                "rate": None if limit_of is None else _rate(limit_of, state, now_ms),
                "keyed": name in keyed,
            }
        )
    return {"now_ms": now_ms, "queues": rows}


def _rate(rate: RateLimit, state: QueueStateRow | None, now_ms: int) -> dict[str, Any]:
    """A rate-limited queue's limit and its starts in the row's window, if
    it has not ended (else none counted yet in the current one, which ends
    at the next multiple of the limit's window)."""
    end = state.rate_window_end_ms if state is not None else None
    if state is not None and end is not None and now_ms < end:
        started = state.rate_started or 0
    else:
        started, end = 0, (now_ms // rate.window_ms + 1) * rate.window_ms
    return {
        "limit": str(rate),
        "count": rate.count,
        "window": rate.window_name,
        "started": started,
        "window_ends_ms": end,
    }


def _rate_limits() -> dict[str, RateLimit]:
    """The rate limit of each declared queue that has one. A malformed one
    is check later.E025's to report; the panel shows none for it."""
    found = {}
    for name in later_queues.declared():
        try:
            rate = limits.rate_limit_of(conf.QUEUES, name)
        except (TypeError, ValueError):
            continue
        if rate is not None:
            found[name] = rate
    return found


def previous_release_servers() -> list[str]:
    """The ids of the live servers of a release before queues: they claim
    from every queue and ignore pause."""
    with _db() as (dialect, cursor):
        servers = dialect.reads.live_servers(
            cursor, namespace=conf.namespace, within_ms=LIVE_WITHIN_MS
        )
    return [s.id for s in servers if s.queues is None]


# -- queue-length graph ---------------------------------------------------------------
def samples(range_name: str) -> dict[str, Any]:
    """The per-minute backlog samples of the range, at most SAMPLE_POINTS
    points (each the largest of its stretch), thinned by the database."""
    window = SAMPLE_RANGES[range_name]
    step = max(SAMPLE_INTERVAL_MS, -(-window // (SAMPLE_POINTS - 1)))
    with _db() as (dialect, cursor):
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


# -- jobs -----------------------------------------------------------------------------------
def job_page(query: JobQuery) -> JobPage:
    with _db() as (dialect, cursor):
        return dialect.reads.job_page(cursor, query)


def job_detail(job_id: str) -> dict[str, Any] | None:
    """A job without its payload: times, durations, history, parent (every
    parent of a fan-in job) and up to 25 direct continuations."""
    with _db() as (dialect, cursor):
        detail = dialect.reads.job_detail(cursor, namespace=conf.namespace, job_id=job_id)
        if detail is None:
            return None
        parents = []
        if detail.parent_id is not None:  # only a continuation can be a fan-in job
            parents = dialect.reads.job_parents(cursor, job_id=job_id)
        children = dialect.reads.job_children(cursor, job_id=job_id, limit=CHILDREN_SHOWN + 1)
        now_ms = dialect.clock_now(cursor)
    job = asdict(detail)
    history = parse_history(job.pop("history"))
    job["history"] = [{"stage": stage, "at_ms": at} for stage, at in history]
    job["durations_ms"] = durations(history, job["created_ms"], job["finished_ms"], now_ms)
    # A fan-in job's parents; the one it waits on (or waited on last) is its parent_id.
    job["parents"] = [
        {"id": p.id, "short_id": p.id[-6:], "job": None if p.job is None else summary_dict(p.job)}
        for p in parents
    ]
    job["children"] = [summary_dict(c) for c in children[:CHILDREN_SHOWN]]
    job["more_children"] = len(children) > CHILDREN_SHOWN
    job["now_ms"] = now_ms
    return job


def parse_history(text: str) -> list[tuple[str, int]]:
    changes = []
    for entry in text.split(";"):
        if entry:
            stage, _, at = entry.partition("@")
            changes.append((stage, int(at)))
    return changes


def durations(
    history: list[tuple[str, int]], created_ms: int, finished_ms: int | None, now_ms: int
) -> dict[str, int]:
    """Total time from creation to the finish (or now), split into the time
    spent running handlers (processing), the time it sat failed until an
    operator retried it (failed), and the rest, spent waiting to run: a
    retried job's wait starts at the retry, not at its failure."""
    end = finished_ms if finished_ms is not None else now_ms
    processing = failed = 0
    for (stage, at), following in zip(history, [*history[1:], None], strict=True):
        until = following[1] if following else end
        if stage == Stage.RUNNING:
            processing += until - at
        elif stage == Stage.FAILED:
            failed += until - at
    total = max(0, end - created_ms)
    processing = min(max(0, processing), total)
    failed = min(max(0, failed), total - processing)
    return {
        "total": total,
        "processing": processing,
        "failed": failed,
        "waiting": total - processing - failed,
    }


SUMMARY_FIELDS = tuple(field.name for field in fields(JobSummary))


def summary_dict(job: JobSummary) -> dict[str, Any]:
    """``job`` as JSON: its fields (plain values: no deep copy needed) and
    the last 6 characters of its id, which lists show."""
    out = {name: getattr(job, name) for name in SUMMARY_FIELDS}
    out["short_id"] = job.id[-6:]
    return out


def page_dict(page: JobPage) -> dict[str, Any]:
    return {
        "jobs": [summary_dict(j) for j in page.jobs],
        "next": cursors.encode(page.after),
        "scanned_out": page.scanned_out,
    }


# -- topics, retained log, recurring ----------------------------------------------------
def topics() -> dict[str, Any]:
    """Every registered topic with its depth and its partitions (depth, head
    age, owner, epoch), and every retained-log consumer group's offsets and lag."""
    stats = partition_stats()
    with _db() as (dialect, cursor):
        consumers = dialect.reads.log_consumers(cursor, namespace=conf.namespace)
        now_ms = dialect.clock_now(cursor)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for p in stats:
        entry = asdict(p)
        entry["depth"] = p.depth
        entry["head_age_ms"] = (
            max(0, now_ms - p.head_run_at_ms) if p.head_run_at_ms is not None else None
        )
        entry["lease_live"] = p.owner is not None and p.lease_expires_ms > now_ms
        by_topic.setdefault(p.topic, []).append(entry)
    topics_out = []
    for name, count in sorted(registered_topics().items()):
        parts = by_topic.get(name, [])
        # partition_stats() has every partition of the topics in later_topic;
        # a topic configured here but not registered there yet (later_migrate
        # or a worker registers it) still shows its count of partitions.
        shown = {p["partition"] for p in parts}
        parts = sorted(
            [*parts, *(_empty_partition(name, n) for n in range(count) if n not in shown)],
            key=lambda p: int(p["partition"]),
        )
        topics_out.append(
            {
                "name": name,
                "partitions": count,
                "depth": sum(p["depth"] for p in parts),
                "oldest_head_age_ms": max(
                    (p["head_age_ms"] for p in parts if p["head_age_ms"] is not None), default=None
                ),
                "partition_stats": parts,
            }
        )
    groups = [
        {
            "topic": c.topic,
            "group": c.group,
            "partition": c.partition,
            "committed_offset": c.committed_offset,
            "next_offset": c.next_offset,
            "lag": max(0, c.next_offset - c.committed_offset),
            "member": c.member,
            "epoch": c.epoch,
            "lease_live": c.expires_ms > now_ms,
        }
        for c in consumers
    ]
    return {"now_ms": now_ms, "topics": topics_out, "retained_log": groups}


def _empty_partition(topic: str, partition: int) -> dict[str, Any]:
    """A partition that never had a job, as topics() shows one."""
    entry = asdict(
        PartitionStats(
            topic=topic,
            partition=partition,
            next_sequence=0,
            head_sequence=None,
            head_run_at_ms=None,
            head_stage=None,
            owner=None,
            epoch=0,
            lease_expires_ms=0,
        )
    )
    return {**entry, "depth": 0, "head_age_ms": None, "lease_live": False}


def _ms(moment: dt.datetime) -> int:
    return round(moment.timestamp() * 1000)


def recurring() -> dict[str, Any]:
    return {
        "schedules": [
            {
                "identifier": s.identifier,
                "cron": s.cron,
                "zone": s.zone,
                "type": s.type_name,
                "priority": s.priority,
                "next_run_at": s.next_run_at.isoformat(),
                "next_run_ms": _ms(s.next_run_at),
                "last_job_id": s.last_job_id,
                "last_run_at": s.last_run_at.isoformat() if s.last_run_at else None,
                "last_run_ms": _ms(s.last_run_at) if s.last_run_at else None,
            }
            for s in list_recurring()
        ]
    }
