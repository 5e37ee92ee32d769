"""Are later's tables on its database? The start-up check of ``later_worker``
and the error the public API raises when they are missing.

The SQL lives in the dialects; this module only words the answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from later_django.db import dialect_for
from later_django.db.base import TABLES
from later_django.exceptions import NotMigrated

FIX = "run `python manage.py later_migrate` to create them"


def missing_tables(alias: str) -> list[str]:
    """Return later's tables that do not exist on the database ``alias``.

    Never creates the database: a SQLite file that does not exist is
    reported as missing every table, without opening it. Raises Django's
    DatabaseError when the database cannot be reached.
    """
    dialect = dialect_for(alias)
    db = connections[alias]
    if not dialect.database_exists(db):
        return list(TABLES)
    with db.cursor() as cursor:
        return dialect.missing_tables(cursor)


def unapplied_migrations(alias: str) -> list[str]:
    """later_django's migrations not yet applied on the database ``alias``,
    in the order later_migrate would apply them."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    leaves = loader.graph.leaf_nodes("later_django")
    return [
        name
        for app, name in loader.graph.forwards_plan(leaves[0])
        if app == "later_django" and (app, name) not in loader.applied_migrations
    ]


def unknown_migrations(alias: str) -> list[str]:
    """later_django's migrations applied on the database ``alias`` that this
    code does not have: a later release migrated it (its servers and this
    code's run side by side during a rolling upgrade)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    return sorted(
        name
        for app, name in loader.applied_migrations
        if app == "later_django" and (app, name) not in loader.disk_migrations
    )


def unapplied_migrations_message(alias: str, unapplied: Sequence[str]) -> str:
    return (
        f"LATER['DATABASE'] {describe(alias)} lacks later's migrations "
        f"{', '.join(unapplied)}, which this release's workers need; run "
        "`python manage.py later_migrate` before starting them (workers of the "
        "previous release run on the migrated schema)"
    )


def describe(alias: str) -> str:
    """The alias and its database name, as messages show them."""
    return f"{alias!r} ({connections[alias].settings_dict.get('NAME')})"


def missing_tables_message(alias: str, missing: Sequence[str]) -> str:
    return (
        f"later's tables are missing on LATER['DATABASE'] {describe(alias)}: "
        f"{', '.join(missing)}; {FIX}."
    )


def raise_if_not_migrated(alias: str, exc: BaseException) -> None:
    """Raise NotMigrated from ``exc`` if it failed because later's tables are missing."""
    if dialect_for(alias).missing_table_error(connections[alias], exc):
        first_line = str(exc).strip().split("\n", 1)[0]
        raise NotMigrated(
            f"later's tables are missing on LATER['DATABASE'] {describe(alias)}: "
            f"{first_line}; {FIX}."
        ) from exc
