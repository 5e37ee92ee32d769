"""Registering retained-log topics, and looking up their partition counts.

A topic's partition count never changes once stored (a record's partition
is a hash of its key modulo the count), so each process keeps the counts it
has read. Writes never trust that cache: an append's counter statement only
matches the topic as stored with the count the partition was computed from.
"""

from __future__ import annotations

import datetime as dt
import threading

from later_django.conf import conf
from later_django.db.rows import LogTopicRow
from later_django.retained_log.connection import session
from later_django.retained_log.records import MAX_PARTITIONS, check_count, check_topic_name

_known: dict[tuple[str, str, str], int] = {}
_lock = threading.Lock()


def register_topic(name: str, *, partitions: int, retention: dt.timedelta | None = None) -> None:
    """Register the retained-log topic ``name`` with ``partitions`` partitions.

    Idempotent: registering it again with the same count only updates its
    retention (``None`` keeps records forever; a timedelta lets maintenance
    delete older records). A different partition count raises ValueError
    and changes nothing.
    """
    check_topic_name(name)
    check_count(partitions, "partitions", low=1, high=MAX_PARTITIONS)
    row = LogTopicRow(name=name, partitions=partitions, retention_ms=_retention_ms(retention))
    with session(atomic=True) as s:
        if s.dialect.log.log_topic_register(s.cursor, row, s.namespace):
            _remember(s.namespace, name, partitions)
            return
        stored = s.dialect.log.log_topic_get(s.cursor, namespace=s.namespace, name=name)
    count = stored.partitions if stored is not None else "another count"
    raise ValueError(
        f"retained-log topic {name!r} is registered with {count} partitions, not "
        f"{partitions}; a record's partition is its key's hash modulo the count, so "
        f"it cannot change: keep partitions={count}, or register a new topic name"
    )


def _retention_ms(retention: object) -> int | None:
    if retention is None:
        return None
    if not isinstance(retention, dt.timedelta) or retention <= dt.timedelta(0):
        raise ValueError(
            f"retention is {retention!r}; pass a positive timedelta, or None to keep "
            "records forever"
        )
    return int(retention.total_seconds() * 1000)


def partitions_of(name: str, *, fresh: bool = False) -> int:
    """The partition count of the registered topic ``name``; ValueError
    when it is not registered. ``fresh`` reads it again from the database."""
    check_topic_name(name)
    namespace = conf.namespace
    cache_key = (conf.database, namespace, name)
    if not fresh:
        with _lock:
            known = _known.get(cache_key)
        if known is not None:
            return known
    with session() as s:
        stored = s.dialect.log.log_topic_get(s.cursor, namespace=namespace, name=name)
    if stored is None:
        with _lock:
            _known.pop(cache_key, None)
        raise ValueError(
            f"retained-log topic {name!r} is not registered in namespace {namespace!r}; "
            f"call retained_log.register_topic({name!r}, partitions=...) first"
        )
    _remember(namespace, name, stored.partitions)
    return stored.partitions


def check_partition(name: str, partition: object) -> int:
    """``partition`` if the topic has it, else ValueError/TypeError."""
    count = partitions_of(name)
    partition = check_count(partition, "partition", low=0)
    if partition >= count:
        count = partitions_of(name, fresh=True)
    if partition >= count:
        raise ValueError(
            f"partition is {partition}, but topic {name!r} has {count} partitions "
            f"(0 to {count - 1})"
        )
    return partition


def _remember(namespace: str, name: str, partitions: int) -> None:
    with _lock:
        _known[(conf.database, namespace, name)] = partitions
