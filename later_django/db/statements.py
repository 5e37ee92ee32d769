"""later's SQL statements rendered for one vendor and bound to their named
parameters, and the base of every store that runs them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from later_django.db.sql import PARAMETER, Statement, fill


class Cursor(Protocol):
    def execute(self, sql: str, params: Any = ...) -> Any: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Walks:
    """A vendor's walks of a job's descendants by both links, parent_id and
    later_fan_in (db/sql/descendants.py): each vendor writes the recursion
    its own way. Several stores run them (db/descendants.py)."""

    # Fail the waiting descendants of a job.
    fail: Statement
    # Make the descendants that failed because a job failed wait for it again.
    revive: Statement
    # revive's form for those without a unique key only.
    revive_keyless: Statement


@dataclass(frozen=True, slots=True)
class VendorSql:
    """A vendor's words (what the braces of db/sql/'s statements become) and
    its walks of a job's descendants, the statements several stores share
    that only the vendor can write."""

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
    """One vendor's statements: each rendered once, on first use, and bound
    to its parameters."""

    def __init__(self, vendor: VendorSql) -> None:
        self._parts = {
            "now": vendor.now,
            "greatest": vendor.greatest,
            "skip_locked": vendor.skip_locked,
            "share_lock": vendor.share_lock,
            "for_update": vendor.for_update,
        }
        self._rendered: dict[str, str] = {}
        # Each statement's text and slots, by the statement, or by it and its
        # shape when it has lists or inline numbers (bind).
        self._plans: dict[Any, tuple[str, tuple[tuple[str, bool], ...]]] = {}
        # The vendor's walks of a job's descendants.
        self.walks = vendor.walks

    def __call__(self, text: str) -> str:
        """``text`` with the vendor's words written in, once per text."""
        sql = self._rendered.get(text)
        if sql is None:
            sql = self._rendered[text] = fill(text, self._parts)
        return sql

    def bind(self, statement: Statement, /, **params: Any) -> tuple[str, list[Any]]:
        """``statement``'s text for this vendor, with positional
        placeholders, and the values in their order. The names passed must
        be exactly the statement's: a missing or unknown name raises here,
        naming both lists.

        Positional, not named: sqlite3 finds a named value by a scan of the
        statement's names, so a batch of a thousand rows would cost the
        square of its size (15 times a positional insert of 1,000 log
        records)."""
        if params.keys() != statement.params:
            raise TypeError(mismatch(statement, params))
        sized = statement.lists or statement.inline
        key: Any = (statement, *shape(statement, params)) if sized else statement
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > MAX_PLANS:
                self._plans.clear()
            plan = self._plans[key] = self._plan(statement, params)
        text, slots = plan
        if not sized:  # the common case: one value a slot
            return text, [params[name] for name, _ in slots]
        values: list[Any] = []
        for name, listed in slots:
            if not listed:
                values.append(params[name])
                continue
            for item in params[name]:
                if isinstance(item, tuple):
                    values.extend(item)
                else:
                    values.append(item)
        return text, values

    def _plan(
        self, statement: Statement, params: Mapping[str, Any]
    ) -> tuple[str, tuple[tuple[str, bool], ...]]:
        """The text of ``statement`` at the shape of ``params`` and its
        slots: each placeholder's name, and whether it is a list."""
        slots: list[tuple[str, bool]] = []

        def placeholder(match: re.Match[str]) -> str:
            name = match[1]
            if name in statement.inline:
                return str(int(params[name]))
            if name in statement.lists:
                slots.append((name, True))
                return ", ".join(
                    "(" + ", ".join(["%s"] * len(item)) + ")" if isinstance(item, tuple) else "%s"
                    for item in params[name]
                )
            slots.append((name, False))
            return "%s"

        return PARAMETER.sub(placeholder, self(statement.text)), tuple(slots)

    def many(
        self, statement: Statement, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[str, Sequence[Mapping[str, Any]]]:
        """``statement``'s text and ``rows`` for an executemany: one row of
        named values per run (no lists, nothing inline), each checked."""
        for row in rows:
            if row.keys() != statement.params:
                raise TypeError(mismatch(statement, row))
        return self(statement.text), rows


# Bound texts kept per vendor before the cache starts again: a batch's
# text has one form per size, and sizes are bounded by the callers' chunks.
MAX_PLANS = 1024


def shape(statement: Statement, params: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two bindings of ``statement`` share one text: the inline
    numbers, and each list's length and row width."""
    if not (statement.inline or statement.lists):
        return ()
    lists = []
    for name in statement.lists:
        items = params[name]
        first = items[0] if items else None
        lists.append((len(items), len(first) if isinstance(first, tuple) else 0))
    return (*(params[name] for name in statement.inline), *lists)


def run(cursor: Cursor, sql: Statements, statement: Statement, /, **params: Any) -> None:
    """Execute ``statement`` with its named ``params`` on ``cursor``: for
    code that runs statements outside a store (db/descendants.py)."""
    cursor.execute(*sql.bind(statement, **params))


def mismatch(statement: Statement, params: Mapping[str, Any]) -> str:
    """What is wrong with the names passed to ``statement``."""
    missing = sorted(statement.params - params.keys())
    unknown = sorted(params.keys() - statement.params)
    return (
        f"the statement takes {sorted(statement.params)}; missing {missing}, unknown {unknown}:"
        f"{statement.text}"
    )


class Operations:
    """A store of one concern: its operations, over one vendor's statements.

    Each operation runs on a cursor of the LATER database, and the caller
    owns the transaction."""

    def __init__(self, sql: Statements) -> None:
        self._sql = sql

    def _run(self, cursor: Cursor, statement: Statement, /, **params: Any) -> None:
        """Execute ``statement`` with its named ``params`` on ``cursor``."""
        run(cursor, self._sql, statement, **params)
