"""What happens to jobs and servers, told to whoever subscribes in this process.

Metrics, the dashboard's samples and Django signals subscribe here instead
of being threaded through the worker (docs/how-to/events.md). Subscribers run
synchronously where the event happens, so they must be quick; one that raises
is logged. Every emitting site checks ``events.active`` first, so with no
subscriber jobs pay nothing. ``waited`` and ``since_created`` compare this
host's clock with the database's times, so they are approximate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

logger = logging.getLogger(__name__)

# What an attempt's stored outcome was: JobFinished.outcome.
OutcomeKind = Literal["succeeded", "retry", "failed", "snoozed", "cancelled"]


@dataclass(slots=True)
class Event:
    """Base of every event."""


@dataclass(slots=True)
class JobEnqueued(Event):
    """A job was committed (emitted after its transaction committed)."""

    job_id: str
    job_type: str
    stage: str  # enqueued, delayed or waiting
    namespace: str
    queue: str = "default"  # its named queue


@dataclass(slots=True)
class JobDuplicate(Event):
    """An enqueue found its unique key held by another job and wrote
    nothing (emitted at once: the refusal stands whatever the caller's
    transaction does)."""

    job_id: str  # the job that holds the key
    job_type: str
    namespace: str
    queue: str = "default"  # the queue the refused job would have run on


@dataclass(slots=True)
class JobStarted(Event):
    """A worker started a job's handler."""

    job_id: str
    job_type: str
    attempt: int
    waited: float  # seconds from the job's due time to this start
    worker: int
    server_id: str


@dataclass(slots=True)
class JobFinished(Event):
    """An attempt's outcome was stored."""

    job_id: str
    job_type: str
    attempt: int
    outcome: OutcomeKind
    handler_seconds: float  # how long the handler ran
    since_created: float  # seconds from the job's creation to this outcome
    waited: float  # seconds from the job's due time to the handler's start
    worker: int  # the worker of this server that ran it
    server_id: str
    partitioned: bool = False  # a partition job (its topic's lane)
    queue: str = "default"  # the queue of the workers that ran it


@dataclass(slots=True)
class LeaseLost(Event):
    """An attempt stopped counting: its handler was stopped because its lease
    was lost or not confirmed in time, or its outcome was discarded because
    another server had taken the job over."""

    job_id: str
    attempt: int
    why: str
    worker: int
    server_id: str


@dataclass(slots=True)
class ServerStarted(Event):
    """A worker server started, with ``workers`` worker tasks."""

    server_id: str
    namespace: str
    workers: int


@dataclass(slots=True)
class ServerStopped(Event):
    """A worker server stopped, having run ``processed`` jobs."""

    server_id: str
    namespace: str
    processed: int


E = TypeVar("E", bound=Event)

_subscribers: list[tuple[type[Event], Callable[[Event], None]]] = []
# Per event class, the callbacks it goes to: worked out on the first emit of
# that class after a (un)subscribe, so an emit costs one dict lookup.
_routes: dict[type[Event], tuple[Callable[[Event], None], ...]] = {}
# Held to change the subscribers and to work out a route, so a route is never
# stored from a list that changed meanwhile.
_lock = threading.Lock()
# Read by every emitting site before it builds an event.
active = False
# The event classes somebody subscribed to: a site that emits on every job
# checks its own class here, so events nobody wants cost a job nothing.
listening: frozenset[type[Event]] = frozenset()


def subscribe(callback: Callable[[E], None], kind: type[E] = Event) -> Callable[[], None]:  # type: ignore[assignment]
    """Call ``callback(event)`` for every event of ``kind`` (default: all).

    Returns a function that unsubscribes."""
    checked: object = kind  # callers without type checking may pass anything
    if not (isinstance(checked, type) and issubclass(checked, Event)):
        raise TypeError(f"kind must be an event class from later_django.events, got {kind!r}")
    entry = (kind, callback)
    with _lock:
        _subscribers.append(entry)  # type: ignore[arg-type]
        _changed()

    def unsubscribe() -> None:
        with _lock:
            if entry in _subscribers:
                _subscribers.remove(entry)
            _changed()

    return unsubscribe


def _changed() -> None:
    """Recompute what emitting sites read; the caller holds ``_lock``."""
    global active, listening
    _routes.clear()
    active = bool(_subscribers)
    listening = frozenset(
        cls for cls in _event_classes() if any(issubclass(cls, kind) for kind, _ in _subscribers)
    )


def _event_classes() -> list[type[Event]]:
    found, todo = [], [Event]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def emit(event: Event) -> None:
    """Hand ``event`` to its subscribers; a failing one never stops the others."""
    callbacks = _routes.get(type(event))
    if callbacks is None:
        with _lock:
            callbacks = _routes[type(event)] = tuple(
                callback for kind, callback in _subscribers if isinstance(event, kind)
            )
    for callback in callbacks:
        try:
            callback(event)
        except Exception:
            logger.exception(
                "an events subscriber failed on %s",
                type(event).__name__,
                extra={"action": "event_subscriber_error"},
            )
