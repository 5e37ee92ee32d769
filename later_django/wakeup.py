"""In-process wake-ups: a commit that makes jobs ready wakes local workers at once.

Databases that cannot notify other processes are polled; this module lets a
worker running in the enqueuing process skip the poll interval.
"""

from __future__ import annotations

from collections.abc import Callable

# Each is called with how many jobs became ready (None: unknown).
_listeners: set[Callable[[int | None], None]] = set()


def add_listener(listener: Callable[[int | None], None]) -> None:
    _listeners.add(listener)


def remove_listener(listener: Callable[[int | None], None]) -> None:
    _listeners.discard(listener)


def has_listeners() -> bool:
    return bool(_listeners)


def wake(count: int | None = None) -> None:
    """Tell local workers that ``count`` jobs became ready (None: unknown)."""
    for listener in list(_listeners):
        listener(count)


# Partition pollers listen apart: a partition job is no work for a plain
# worker, and a plain one none for a poller.
_partition_listeners: set[Callable[[], None]] = set()


def add_partition_listener(listener: Callable[[], None]) -> None:
    _partition_listeners.add(listener)


def remove_partition_listener(listener: Callable[[], None]) -> None:
    _partition_listeners.discard(listener)


def wake_partitions() -> None:
    """Tell local partition pollers that a partition job became ready."""
    for listener in list(_partition_listeners):
        listener()
