"""Resolve the SQL dialect of a database alias once, then cache it."""

from __future__ import annotations

import functools

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

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


def dialect_of(db: BaseDatabaseWrapper) -> Dialect:
    """Return the dialect of the connection ``db`` (a caller that holds it
    already saves dialect_for's lookup of the thread's connection)."""
    return _dialect_for_vendor(db.vendor)
