"""The leases one server holds: which claims, until when each is confirmed,
their renewal, and the local deadline past which a claim is given up.

A claim is ``(job id, attempt)``, what a lease fences. "Confirmed until" is
on the loop's monotonic clock: when the statement that set the lease was
sent, plus the lease, minus a margin; the database set the expiry no earlier
(docs/explanation/design.md, "Leases").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from later_django.conf import conf
from later_django.threaded_store import ThreadedStore

logger = logging.getLogger(__name__)

Claim = tuple[str, int]  # (job id, attempt)

# A lease counts as confirmed until this long before it expires, as last
# confirmed (a tenth of the lease, at most 2 s); the deadlines are checked
# every half margin, so a handler stops at least half a margin before its
# lease could expire.
LEASE_MARGIN_FRACTION = 0.1
LEASE_MARGIN_MAX = 2.0  # seconds

# Seconds between two looks for cancel() requests of the claims held.
CANCEL_CHECK_INTERVAL = 1.0

LOST = "its lease was lost (another server recovered it)"
EXPIRED = "its lease could not be renewed in time"


class ClaimHolders(Protocol):
    """Whoever holds the claims of a lease book: its server's workers."""

    def given_up(self, claim: Claim, why: str) -> None:
        """Stop the handler of ``claim``, or drop it if it has not started."""

    def cancel_requested(self, claim: Claim) -> None:
        """cancel() asked the job of ``claim`` to stop."""


class LeaseBook:
    """Every claim this server holds a lease on (running, spare, or its
    outcome being stored), and until when each is known to hold."""

    def __init__(
        self,
        *,
        store: ThreadedStore,
        pool: ThreadPoolExecutor,
        owner: str,
        lease_ms: int,
        holders: ClaimHolders,
    ):
        self.store = store
        self.pool = pool
        self.owner = owner
        self.lease_ms = lease_ms
        # Told of each claim given up, and of each cancel() request.
        self.holders = holders
        lease = lease_ms / 1000
        margin = min(lease * LEASE_MARGIN_FRACTION, LEASE_MARGIN_MAX)
        self.confirmed_for = lease - margin
        self.check_interval = margin / 2
        self._until: dict[Claim, float] = {}
        self.namespace = conf.namespace

    def hold(self, claims: Iterable[Claim], sent: float) -> None:
        """Claims whose lease a statement sent at ``sent`` (loop time) set."""
        until = sent + self.confirmed_for
        for claim in claims:
            self._until[claim] = until

    def release(self, claim: Claim) -> None:
        """Forget ``claim``: its outcome is stored, or it was let go."""
        self._until.pop(claim, None)

    def until(self, claim: Claim) -> float | None:
        return self._until.get(claim)

    def confirmed(self, claim: Claim) -> bool:
        until = self._until.get(claim)
        return until is not None and asyncio.get_running_loop().time() < until

    async def renew(self) -> list[Claim]:
        """Extend the lease of every claim held; return the claims lost.

        Fenced by (job id, attempt): a claim is lost once another server
        recovered the job, even if this server claimed it again since."""
        held = list(self._until)
        if not held:
            return []
        sent = asyncio.get_running_loop().time()
        renewed = set(
            await self.store.run(
                self.pool,
                lambda d, c: d.hot.renew(c, owner=self.owner, jobs=held, lease_ms=self.lease_ms),
            )
        )
        until = sent + self.confirmed_for
        lost = []
        for claim in held:
            if claim not in self._until:
                continue  # its outcome was stored (or it was let go) meanwhile
            if claim in renewed:
                self._until[claim] = max(self._until[claim], until)
            else:
                lost.append(claim)
                self.give_up(claim, LOST)
        return lost

    def give_up_expired(self) -> list[Claim]:
        """Give up every claim whose lease is no longer confirmed; return them.

        Its handler stops before the lease expires, so it never runs beside
        a recovered run."""
        now = asyncio.get_running_loop().time()
        expired = [claim for claim, until in self._until.items() if now >= until]
        for claim in expired:
            self.give_up(claim, EXPIRED)
        return expired

    def give_up(self, claim: Claim, why: str) -> None:
        """Give ``claim`` up now, if held: its handler stops and its lease is
        no longer renewed."""
        if self._until.pop(claim, None) is not None:
            self.holders.given_up(claim, why)

    async def run_renewals(self) -> None:
        interval = self.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew()
            except Exception as exc:  # noqa: BLE001  next renewal retries
                logger.error("could not renew leases: %s", exc, extra={"action": "renew_error"})

    async def run_cancel_checks(self) -> None:
        """Once a second while a claim is held, read which of them cancel()
        asked to stop, and tell the holders. A look at the database,
        not a notification: a request cannot be lost on its way here."""
        while True:
            await asyncio.sleep(CANCEL_CHECK_INTERVAL)
            if not self._until:
                continue
            try:
                asked = await self.store.run(
                    self.pool,
                    lambda d, c: d.hot.cancel_requested(
                        c, namespace=self.namespace, owner=self.owner
                    ),
                )
            except Exception as exc:  # noqa: BLE001  the next look retries
                logger.warning(
                    "could not look for cancel requests: %s", exc, extra={"action": "cancel_error"}
                )
                continue
            for claim in asked:
                if claim in self._until:
                    self.holders.cancel_requested(claim)

    async def run_deadlines(self) -> None:
        # One periodic check rather than a timer per job: a job costs no
        # timer to arm and cancel.
        while True:
            await asyncio.sleep(self.check_interval)
            self.give_up_expired()
