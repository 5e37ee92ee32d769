"""Checks of the database later uses: the alias, its vendor and options,
the namespace, and (with the database tag) the topics stored by earlier runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register
from django.db import DatabaseError, connections

from later_django.checks.messages import error
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.partitions.reserved import RECURRING_TOPIC, registered_topics


def check_database(merged: dict[str, Any]) -> list[CheckMessage]:
    messages = check_namespace(merged["NAMESPACE"])
    alias = merged["DATABASE"]
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return [
            *messages,
            error(
                "E004",
                f"LATER['DATABASE'] is {alias!r}, which is not in DATABASES.",
                f"Use one of: {', '.join(sorted(settings.DATABASES))}.",
            ),
        ]
    # The backend's vendor, not its module name: PostGIS is PostgreSQL too.
    try:
        vendor = connections[alias].vendor
    except Exception:  # noqa: BLE001  an ENGINE that does not even import
        vendor = "unknown"
    if vendor not in ("sqlite", "postgresql"):
        engine = settings.DATABASES[alias].get("ENGINE", "")
        messages.append(
            error(
                "E005",
                f"LATER['DATABASE'] {alias!r} uses {engine}; later supports only "
                "PostgreSQL and SQLite.",
                "Point LATER['DATABASE'] at a PostgreSQL or SQLite database.",
            )
        )
    if vendor == "sqlite":
        options = cast("dict[str, Any]", settings.DATABASES[alias].get("OPTIONS") or {})
        if options.get("transaction_mode") != "IMMEDIATE":
            messages.append(
                Warning(
                    f"SQLite database {alias!r} starts transactions in DEFERRED mode; a "
                    "transaction that reads before it writes can fail with 'database is "
                    "locked' when a worker writes concurrently.",
                    hint=f"Set DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE'.",
                    id="later.W002",
                )
            )
    elif merged["VACUUM_INTERVAL"] is not None:
        messages.append(
            Warning(
                "LATER['VACUUM_INTERVAL'] applies to SQLite only and is ignored here.",
                hint="Remove it; PostgreSQL's autovacuum does this work.",
                id="later.W003",
            )
        )
    return messages


def check_namespace(namespace: object) -> list[CheckMessage]:
    if not isinstance(namespace, str) or not 1 <= len(namespace) <= 64:
        return [
            error(
                "E006",
                f"LATER['NAMESPACE'] is {namespace!r}; it must be a string of 1 to 64 characters.",
                "Set LATER['NAMESPACE'] = 'default' or another short name.",
            )
        ]
    return []


@register(Tags.database)
def check_stored_topics(
    databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Compare LATER['TOPICS'] (and RECURRING_SEQUENTIAL_PARTITIONS) with the
    partition counts stored by earlier runs."""
    alias = conf.database
    if not databases or alias not in databases or alias not in settings.DATABASES:
        return []
    return [
        topic_conflict(name, count, stored)
        for name, count, stored in stored_topic_conflicts(alias, registered_topics())
    ]


def topic_conflict(name: str, count: int, stored: int) -> CheckMessage:
    if name == RECURRING_TOPIC:
        return error(
            "E015",
            f"LATER['RECURRING_SEQUENTIAL_PARTITIONS'] is {count} but sequential recurring "
            f"jobs were registered with {stored} partitions; changing it would move "
            "schedules to other partitions and let their occurrences overlap.",
            f"Restore LATER['RECURRING_SEQUENTIAL_PARTITIONS'] = {stored}.",
        )
    return error(
        "E015",
        f"Topic {name!r} has {count} partitions in LATER['TOPICS'] but was "
        f"registered with {stored}; changing it would reorder its jobs.",
        f"Restore LATER['TOPICS'][{name!r}] = {stored}, or use a new topic name.",
    )


def stored_topic_conflicts(alias: str, topics: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, configured, stored) for every topic whose count changed."""
    try:
        with connections[alias].cursor() as cursor:
            stored = dialect_for(alias).partitions.topic_partitions(
                cursor, namespace=conf.namespace
            )
    except DatabaseError:
        return []  # not migrated yet: later_migrate registers the topics
    return [
        (name, count, stored[name])
        for name, count in topics.items()
        if name in stored and stored[name] != count
    ]
