"""The dashboard's pages of named things, one row each: queues (counts,
pause, servers, limits), topics with their partitions and the retained
log's consumer groups, and recurring schedules.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

from later_django import limits, queue_names, registry
from later_django.conf import conf
from later_django.dashboard.reads.source import LIVE_WITHIN_MS, dialect_cursor, served
from later_django.db.rows.dashboard import QueueStateRow
from later_django.limits import RateLimit
from later_django.partitions.api import partition_stats
from later_django.partitions.reserved import registered_topics
from later_django.queues import declared as declared_queues
from later_django.recurring.api import list_recurring
from later_django.states import Stage
from later_django.types import PartitionStats


# -- queues -------------------------------------------------------------------------------
def queues() -> dict[str, Any]:
    """Every queue (declared, then any other with jobs or a later_queue row):
    its jobs per stage, whether it is paused, the live servers serving it,
    and ``stranded`` when it has ready jobs and no live server. Not cached,
    unlike the overview, so the page a pause redirects to shows the pause."""
    namespace = conf.namespace
    with dialect_cursor() as (dialect, cursor):
        lanes = dialect.reads.lane_counts(cursor, namespace=namespace)
        states = dialect.reads.queue_states(cursor, namespace=namespace)
        servers = dialect.reads.live_servers(cursor, namespace=namespace, within_ms=LIVE_WITHIN_MS)
        now_ms = dialect.clock_now(cursor)
    counts: dict[str, dict[str, int]] = {}
    for count in lanes:
        name = queue_names.queue_of_lane(count.lane)
        if name is not None:
            by_stage = counts.setdefault(name, {stage.value: 0 for stage in Stage})
            by_stage[count.stage] = by_stage.get(count.stage, 0) + count.n
    declared = declared_queues()
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
        serving = [s for s in servers if (its_queues := served(s)) is None or name in its_queues]
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
    for name in declared_queues():
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
    with dialect_cursor() as (dialect, cursor):
        servers = dialect.reads.live_servers(
            cursor, namespace=conf.namespace, within_ms=LIVE_WITHIN_MS
        )
    return [s.id for s in servers if s.queues is None]


# -- topics, retained log, recurring ----------------------------------------------------
def topics() -> dict[str, Any]:
    """Every registered topic with its depth and its partitions (depth, head
    age, owner, epoch), and every retained-log consumer group's offsets and lag."""
    stats = partition_stats()
    with dialect_cursor() as (dialect, cursor):
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
