"""Signal handlers: keep later's triggers installed after every migrate."""

from __future__ import annotations

from typing import Any

from django.db import connections

from later_django.conf import conf


def reinstall_triggers(*, using: str, **kwargs: Any) -> None:
    """Install later's database objects again after ``migrate`` on the LATER database.

    SQLite drops a table's triggers when a migration rebuilds the table, which
    would silently stop the stage counters; installing the newest version
    again is idempotent.
    """
    if using != conf.database:
        return
    from later_django import objects

    connection = connections[using]
    if "later_job" not in connection.introspection.table_names():
        return
    with connection.cursor() as cursor:
        objects.install(cursor, connection.vendor)
