"""The root of every dialect: a vendor's SQL fragments, and the templates of
db/sql/ rendered with them, once each. Runs no statement itself."""

from __future__ import annotations

import abc
from typing import ClassVar

from later_django.db.sql import STAMP


class Statements(abc.ABC):
    """Renders later's SQL templates for one vendor."""

    vendor: ClassVar[str]
    # The database's clock as epoch milliseconds, an SQL expression with one
    # value for the whole statement ({now}).
    now_sql: ClassVar[str]
    # The larger of two values ({greatest}).
    greatest_sql: ClassVar[str] = "GREATEST"
    # Appended to SELECTs that pick rows to change, where the vendor locks
    # rows ({skip_locked}).
    skip_locked: ClassVar[str] = ""
    # Appended to a read that must wait for a concurrent write of the row
    # ({share_lock}).
    share_lock: ClassVar[str] = ""

    def __init__(self) -> None:
        self._rendered: dict[str, str] = {}

    def _sql(self, template: str) -> str:
        """``template`` with this vendor's clock and locking clauses filled in,
        rendered on first use; per-call parts ({ids}, {pairs}, ...) are left."""
        sql = self._rendered.get(template)
        if sql is None:
            sql = self._rendered[template] = (
                template.replace("{stamp}", STAMP)
                .replace("{greatest}", self.greatest_sql)
                .replace("{now}", self.now_sql)
                .replace("{skip_locked}", self.skip_locked)
                .replace("{share_lock}", self.share_lock)
            )
        return sql
