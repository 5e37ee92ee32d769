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
