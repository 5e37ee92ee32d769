"""Reading records back by offset, and how far each consumer group is behind."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from django.db.backends.utils import CursorWrapper

from later_django.conf import conf
from later_django.db.base import Dialect
from later_django.db.rows import LogPartitionKey, LogRead
from later_django.retained_log.connection import session
from later_django.retained_log.records import (
    MAX_READ_LIMIT,
    Record,
    check_count,
    to_record,
)
from later_django.retained_log.topics import check_partition, partitions_of


def read(topic: str, partition: int, from_offset: int = 0, limit: int = 100) -> list[Record]:
    """Return up to ``limit`` records of ``partition`` from ``from_offset``
    on, in offset order.

    Offsets below the oldest retained record start at that record; an
    offset at or past the end returns ``[]``. Only committed records are
    seen, and never one before an earlier offset is visible.
    """
    check_partition(topic, partition)
    check_count(from_offset, "from_offset", low=0)
    check_count(limit, "limit", low=1, high=MAX_READ_LIMIT)
    with session() as s:
        key = LogPartitionKey(namespace=s.namespace, topic=topic, partition=partition)
        stored = s.dialect.log.log_record_read(
            s.cursor, LogRead(key=key, from_offset=from_offset, limit=limit)
        )
    return [to_record(row, partition) for row in stored]


def lag(topic: str) -> dict[tuple[str, int], int]:
    """Return, for every consumer group that ever took a lease on ``topic``,
    per partition: records appended minus the group's committed offset."""
    partitions_of(topic)
    with session() as s:
        rows = s.dialect.log.log_lag(s.cursor, namespace=s.namespace, topic=topic)
    return {(row.group, row.partition): row.lag for row in rows}


def configured_lag() -> dict[tuple[str, str], int]:
    """Lag summed over partitions, per (topic, group), for the topics and
    groups ``LATER["RETAINED_LOG_LAG"]`` names: what metrics and the
    dashboard report. Reads nothing when the setting is empty."""
    wanted = conf.RETAINED_LOG_LAG
    if not wanted:
        return {}
    with session() as s:
        return lag_totals(s.dialect, s.cursor, namespace=s.namespace, wanted=wanted)


def lag_totals(
    dialect: Dialect,
    cursor: CursorWrapper,
    *,
    namespace: str,
    wanted: Mapping[str, Collection[str] | None],
) -> dict[tuple[str, str], int]:
    """Per (topic, group) of ``wanted`` (topic -> groups, None for all):
    records appended minus committed, summed over the partitions. A topic
    nobody consumes has no entry."""
    totals: dict[tuple[str, str], int] = {}
    for topic, groups in wanted.items():
        for row in dialect.log.log_lag(cursor, namespace=namespace, topic=topic):
            if groups is None or row.group in groups:
                totals[(topic, row.group)] = totals.get((topic, row.group), 0) + row.lag
    return totals
