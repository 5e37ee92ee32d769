"""``manage.py later_migrate``: create or update later's tables on its database."""

from __future__ import annotations

import io
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections, transaction

from later_django import objects
from later_django.checks.database import stored_topic_conflicts, topic_conflict
from later_django.conf import conf
from later_django.db import dialect_for
from later_django.partitions.reserved import registered_topics


class Command(BaseCommand):
    help = (
        "Migrate later's tables on LATER['DATABASE'], install its triggers and "
        "register LATER['TOPICS']. Safe to run on every deploy."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = conf.database
        connection = connections[alias]
        actions: list[str] = []
        dialect = dialect_for(alias)
        # Read before migrating: migrate itself reinstalls them afterwards.
        expected = objects.expected(connection.vendor)
        missing = set()
        if "later_job" in connection.introspection.table_names():
            with connection.cursor() as cursor:
                missing = set(expected) - dialect.installed_objects(cursor)

        output = io.StringIO()
        call_command("migrate", "later_django", database=alias, verbosity=1, stdout=output)
        applied = [
            line.strip()
            for line in output.getvalue().splitlines()
            if line.strip().startswith("Applying")
        ]
        actions += [line.removesuffix("... OK").strip() for line in applied]

        with connection.cursor() as cursor:
            if dialect.journal_wal(cursor):
                actions.append("switched SQLite to WAL journal mode")

        with transaction.atomic(using=alias), connection.cursor() as cursor:
            objects.install(cursor, connection.vendor)
            still_missing = set(expected) - dialect.installed_objects(cursor)
        if still_missing:
            raise CommandError(
                f"later's database objects {', '.join(sorted(still_missing))} are missing on "
                f"{alias} after installing them; check the database user's rights to create "
                "triggers and functions"
            )
        actions += [f"installed trigger {name}" for name in sorted(missing)]

        topics = registered_topics()
        conflicts = stored_topic_conflicts(alias, topics)
        if conflicts:
            message = topic_conflict(*conflicts[0])
            raise CommandError(f"{message.msg} {message.hint}")
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            for name, count in sorted(topics.items()):
                if dialect.partitions.topic_register(
                    cursor, namespace=conf.namespace, name=name, partitions=count
                ):
                    actions.append(f"registered topic {name} with {count} partitions")

        if options["verbosity"] < 1:
            return
        database = connection.settings_dict["NAME"]
        if not actions:
            self.stdout.write(f"later: {alias} ({database}) is up to date; nothing to do.")
            return
        self.stdout.write(f"later: migrated {alias} ({database}):")
        for action in actions:
            self.stdout.write(f"  - {action}")
