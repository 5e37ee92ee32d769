"""Resolve the SQL dialect of a database alias once, then cache it."""

from __future__ import annotations

import functools

from django.db import connections

from later_django.db.base import Dialect


@functools.cache
def _dialect_for_vendor(vendor: str) -> Dialect:
    if vendor == "postgresql":
        from later_django.db.postgresql import PostgresDialect

        return PostgresDialect()
    if vendor == "sqlite":
        from later_django.db.sqlite import SqliteDialect

        return SqliteDialect()
    raise NotImplementedError(
        f"later_django supports PostgreSQL and SQLite; LATER['DATABASE'] uses {vendor}"
    )


def dialect_for(alias: str) -> Dialect:
    """Return the dialect of the database ``alias``."""
    return _dialect_for_vendor(connections[alias].vendor)
