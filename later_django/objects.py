"""later's database objects (triggers, functions) at their newest version.

Their SQL is frozen in the migration that introduced that version; this
module only knows which migration that is. A new version of any object is a
new migration holding the whole new text, and ``NEWEST`` names it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

NEWEST = "later_django.migrations.0020_sqlite_counts_in_place"


def _newest() -> ModuleType:
    return importlib.import_module(NEWEST)


def expected(vendor: str) -> frozenset[str]:
    """Names of the objects the newest version installs on ``vendor``."""
    names: frozenset[str] = _newest().NAMES.get(vendor, frozenset())
    return names


def install(cursor: Any, vendor: str) -> None:
    """Create or replace every object of the newest version; idempotent."""
    _newest().install(cursor, vendor)
