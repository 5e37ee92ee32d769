"""Appending records: offsets reserved from a partition's counter and the
records stored, in one transaction (the caller's, when one is open).

The counter row an append raises stays locked until its transaction ends,
so offsets are gapless (a rollback gives them back) and commit in order: a
reader never sees an offset while an earlier one is still to come.
"""

from __future__ import annotations

from collections.abc import Iterable

from later_django.conf import conf
from later_django.db import dialect_for
from later_django.db.rows import LogAppend
from later_django.partitions import partition_for_key
from later_django.retained_log.connection import session
from later_django.retained_log.records import key_bytes, value_bytes
from later_django.retained_log.topics import partitions_of

# A stale partition count (a topic re-created under the same name by a
# test's cleanup) is read again once; a second miss means it is gone.
ATTEMPTS = 2


def append(topic: str, *, key: str | bytes, value: bytes) -> tuple[int, int]:
    """Append one record to ``topic``; return its (partition, offset).

    The partition is ``partition_for_key(key, partitions)``. Inside
    ``transaction.atomic()`` on the LATER database the record commits or
    rolls back with the caller's writes; a rolled-back record leaves no gap.
    """
    return append_many(topic, [(key, value)])[0]


def append_many(topic: str, records: Iterable[tuple[str | bytes, bytes]]) -> list[tuple[int, int]]:
    """Append every ``(key, value)`` in one transaction, all or none; return
    their (partition, offset) in order. Records of one partition take
    consecutive offsets in the order given.

    Partitions are locked in ascending order, so two calls that share
    partitions cannot deadlock each other.
    """
    pairs = [
        (key_bytes(key, f"records[{i}] key"), value_bytes(value, f"records[{i}] value"))
        for i, (key, value) in enumerate(_pairs(records))
    ]
    if not pairs:
        return []
    for attempt in range(ATTEMPTS):
        partitions = partitions_of(topic, fresh=attempt > 0)
        placed = _write(topic, partitions, pairs)
        if placed is not None:
            return placed
    raise AssertionError("unreachable: partitions_of raises when the topic is gone")


def _pairs(records: Iterable[object]) -> list[tuple[object, object]]:
    pairs: list[tuple[object, object]] = []
    for i, pair in enumerate(records):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise TypeError(f"records[{i}] must be a (key, value) tuple, got {pair!r:.60}")
        pairs.append((pair[0], pair[1]))
    return pairs


def _write(
    topic: str, partitions: int, pairs: list[tuple[bytes, bytes]]
) -> list[tuple[int, int]] | None:
    """Reserve offsets and store the records; None, writing nothing, when
    the topic is not stored with ``partitions`` partitions."""
    by_partition: dict[int, list[int]] = {}
    for index, (key, _) in enumerate(pairs):
        by_partition.setdefault(partition_for_key(key, partitions), []).append(index)
    order = sorted(by_partition)
    groups = [(partition, [pairs[i] for i in by_partition[partition]]) for partition in order]
    # A transaction of its own only where the append takes several
    # statements; one statement is atomic by itself.
    one = dialect_for(conf.database).log.log_append_is_one_statement(len(pairs))
    with session(atomic=not one) as s:
        append = LogAppend(namespace=s.namespace, topic=topic, partitions=partitions, groups=groups)
        firsts = s.dialect.log.log_append(s.cursor, append, prepare=conf.prepared_statements)
    if firsts is None:
        return None
    placed: list[tuple[int, int]] = [(0, 0)] * len(pairs)
    for partition in order:
        for offset, index in enumerate(by_partition[partition], start=firsts[partition]):
            placed[index] = (partition, offset)
    return placed
