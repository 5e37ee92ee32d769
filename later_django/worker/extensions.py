"""Parts that run along with a worker server without the server knowing them:
the Prometheus feed, the dashboard's figures.

A server offers them ``ServerFacts`` and runs what each ``Extension``
returns as one of its services; the server imports nothing of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

    from later_django.db.base import Dialect
    from later_django.limits import QueueLimits
    from later_django.types import PartitionLocal

T = TypeVar("T")


class ServerFacts(Protocol):
    """What an extension sees of the server it runs with."""

    @property
    def server_id(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def topics(self) -> bool: ...

    @property
    def limits(self) -> Mapping[str, QueueLimits]:
        """The served queues with limits, and what their claims keep."""

    async def run_db(self, op: Callable[[Dialect, CursorWrapper], T]) -> T:
        """Run ``op(dialect, cursor)`` on the server's service pool."""

    def worker_counts(self) -> tuple[int, int]:
        """(workers, busy workers) now."""

    def partition_local(self) -> PartitionLocal:
        """This server's partition leases, workers and claim counts now."""


class Extension(Protocol):
    """One part that rides along with a server."""

    name: str

    async def run(self) -> None:
        """Loop until cancelled; restarted with a backoff if it raises."""

    async def stop(self) -> None:
        """Called once at shutdown, before the server deregisters."""


ExtensionFactory = Callable[[ServerFacts], Extension]
_factories: list[ExtensionFactory] = []


def register(factory: ExtensionFactory) -> None:
    """Make ``factory(server)`` for every server this process starts from now
    on (once per factory, however often it is registered)."""
    if factory not in _factories:
        _factories.append(factory)


def registered() -> list[ExtensionFactory]:
    return list(_factories)
