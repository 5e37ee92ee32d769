"""Leadership through named leases: one server at a time runs what must run once per cluster.

The database is the authority (owner, epoch, expiry on its clock); this
module only remembers, per name, the epoch this server holds and until when
(monotonic clock) that is known to hold.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from django.db.backends.utils import CursorWrapper

from later_django.db.base import Dialect
from later_django.db.rows import HeldLease, LeaseRequest

# A lead is trusted locally this much less than the lease it holds: room for
# the work started under it to stop before another server may take over.
MARGIN_FRACTION = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class Lead:
    """A lease this server holds: its epoch fences the writes made under it."""

    name: str
    epoch: int
    confirmed_until: float  # time.monotonic()


class Leader:
    """Takes and renews named leases for one server (owner) in one namespace.

    Calls come from maintenance threads, each with its own cursor."""

    def __init__(self, *, namespace: str, owner: str, ttl_ms: int) -> None:
        self.namespace = namespace
        self.owner = owner
        self.ttl_ms = ttl_ms
        self._leads: dict[str, Lead] = {}
        self._lock = threading.Lock()

    def lead(self, dialect: Dialect, cursor: CursorWrapper, name: str) -> Lead | None:
        """Take or renew the lease ``name``; return it while this server leads."""
        sent = time.monotonic()
        request = LeaseRequest(
            namespace=self.namespace, name=name, owner=self.owner, ttl_ms=self.ttl_ms
        )
        epoch = dialect.cluster.lease_acquire(cursor, request)
        with self._lock:
            if epoch is None:
                self._leads.pop(name, None)
                return None
            ttl = self.ttl_ms / 1000
            lead = Lead(name=name, epoch=epoch, confirmed_until=sent + ttl * (1 - MARGIN_FRACTION))
            self._leads[name] = lead
            return lead

    def current(self, name: str) -> Lead | None:
        """The lead of ``name`` if it is still known to hold, else None."""
        with self._lock:
            lead = self._leads.get(name)
        if lead is None or time.monotonic() >= lead.confirmed_until:
            return None
        return lead

    def release_all(self, dialect: Dialect, cursor: CursorWrapper) -> int:
        """Let every lease this server holds go now (at shutdown), so another
        server takes over at its next tick instead of after the expiry."""
        with self._lock:
            leads, self._leads = list(self._leads.values()), {}
        released = 0
        for lead in leads:
            held = HeldLease(
                namespace=self.namespace, name=lead.name, owner=self.owner, epoch=lead.epoch
            )
            released += dialect.cluster.lease_release(cursor, held)
        return released
