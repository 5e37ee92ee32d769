"""Where the dashboard's reads come from: a cursor of the LATER database and
its dialect, and which live servers a page shows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections
from django.db.backends.utils import CursorWrapper

from later_django.conf import conf
from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.db.rows import LiveServer

LIVE_WITHIN_MS = 15_000  # a server whose heartbeat is older is not shown as live
# The overview and the lists' counts are computed at most this often (in
# seconds), and served to every viewer from Django's cache meanwhile.
CACHE_SECONDS = 1


@contextmanager
def dialect_cursor() -> Iterator[tuple[Dialect, CursorWrapper]]:
    """The dialect of the LATER database and a cursor of it."""
    alias = conf.database
    with connections[alias].cursor() as cursor:
        yield dialect_for(alias), cursor


def served(server: LiveServer) -> list[str] | None:
    """The queues ``server`` serves; None for a server of a release before
    queues, which claims from every queue and ignores pause."""
    if server.queues is None:
        return None
    return [name for name in server.queues.split(",") if name]
