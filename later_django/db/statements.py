"""later's SQL templates rendered for one vendor, and the base of every store
that runs them. Runs no statement itself."""

from __future__ import annotations

from dataclasses import dataclass

from later_django.db.sql import STAMP, compose, fill


@dataclass(frozen=True, slots=True, kw_only=True)
class Walks:
    """A vendor's walks of a job's descendants by both links, parent_id and
    later_fan_in (db/sql/fan_in.py): each vendor writes the recursion its
    own way. Several stores run them (db/descendants.py)."""

    # Fail the waiting descendants of a job.
    fail: str
    # Make the descendants that failed because a job failed wait for it again.
    revive: str
    # revive's form for those without a unique key only.
    revive_keyless: str


@dataclass(frozen=True, slots=True)
class VendorSql:
    """A vendor's SQL fragments: what the vendor markers of db/sql/ become;
    and its walks of a job's descendants, the statements several stores
    share that only the vendor can write."""

    # The database's clock as epoch milliseconds, one value for the whole
    # statement ({now}).
    now: str
    walks: Walks
    # The larger of two values ({greatest}).
    greatest: str = "GREATEST"
    # Appended to SELECTs that pick rows to change, where the vendor locks
    # rows ({skip_locked}).
    skip_locked: str = ""
    # Appended to a read that must wait for a concurrent write of the row
    # ({share_lock}).
    share_lock: str = ""
    # Appended to a read whose rows must stay as read until the transaction
    # ends ({for_update}).
    for_update: str = ""


class Statements:
    """Renders templates for one vendor: each once, on first use."""

    def __init__(self, vendor: VendorSql) -> None:
        self._parts = {
            "now": vendor.now,
            "greatest": vendor.greatest,
            "skip_locked": vendor.skip_locked,
            "share_lock": vendor.share_lock,
            "for_update": vendor.for_update,
        }
        self._rendered: dict[str, str] = {}
        # The vendor's walks of a job's descendants (templates, rendered as
        # any other).
        self.walks = vendor.walks

    def __call__(self, template: str, **per_call: str) -> str:
        """``template`` with the vendor's fragments, then the ``per_call``
        parts (the sizes of a batch: see db/sql/__init__.py) written in."""
        sql = self._rendered.get(template)
        if sql is None:
            sql = self._rendered[template] = fill(fill(template, {"stamp": STAMP}), self._parts)
        return compose(sql, **per_call) if per_call else sql


def ids(count: int) -> str:
    """The {ids} of ``count`` ids."""
    return ", ".join(["%s"] * count)


def pairs(count: int) -> str:
    """The {pairs} of ``count`` (id, attempt) pairs."""
    return ", ".join(["(%s, %s)"] * count)


class Operations:
    """A store of one concern: its operations, over one vendor's statements.

    Each operation runs on a cursor of the LATER database, and the caller
    owns the transaction."""

    def __init__(self, sql: Statements) -> None:
        self._sql = sql
