"""``manage.py later_migrate``: idempotent, restores triggers, guards topic partitions."""

from __future__ import annotations

import ast
from io import StringIO
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

import later_django
import later_django as later
from later_django import objects, schema
from later_django.db import dialect_for
from tests.helpers import set_later
from tests.jobapp.jobs import Noop

DROP_TRIGGER = {"sqlite": "DROP TRIGGER {name}", "postgresql": "DROP TRIGGER {name} ON later_job"}


def later_migrate() -> str:
    out = StringIO()
    call_command("later_migrate", stdout=out)
    return out.getvalue()


def installed(later_db) -> set[str]:
    with connections[later_db.alias].cursor() as cursor:
        return dialect_for(later_db.alias).installed_objects(cursor)


def snapshot(later_db) -> dict[str, object]:
    """Everything later_migrate may change, as plain values."""
    return {
        "topics": later_db.rows("SELECT name, partitions FROM later_topic ORDER BY name"),
        "triggers": installed(later_db),
        "jobs": later_db.rows("SELECT id, stage, history FROM later_job ORDER BY id"),
        "counts": later.stage_counts(),
        "migrations": later_db.rows(
            "SELECT name FROM django_migrations WHERE app = 'later_django' ORDER BY name"
        ),
    }


def e015(later_db) -> list[object]:
    return [m for m in run_checks(databases=[later_db.alias]) if m.id == "later.E015"]


def test_later_migrate_second_run_has_nothing_to_do(later_db, settings):
    """The first run registers the topics; the second prints 'nothing to do' and
    changes nothing."""
    set_later(settings, TOPICS={"orders": 4, "events": 2})
    later.enqueue(Noop())
    first = later_migrate()
    assert "registered topic orders with 4 partitions" in first
    assert "registered topic events with 2 partitions" in first
    before = snapshot(later_db)
    assert before["topics"] == [("events", 2), ("orders", 4)]
    second = later_migrate()
    assert "nothing to do" in second
    assert later_db.alias in second
    assert "registered" not in second
    assert snapshot(later_db) == before


def test_later_migrate_reinstalls_a_missing_trigger(later_db):
    """A dropped counter trigger is installed again, and counting resumes."""
    names = sorted(installed(later_db))
    assert set(names) == objects.expected(later_db.vendor)
    victim = next(name for name in names if "insert" in name)

    def reinstall() -> None:
        with connections[later_db.alias].cursor() as cursor:
            objects.install(cursor, later_db.vendor)

    with connections[later_db.alias].cursor() as cursor:
        cursor.execute(DROP_TRIGGER[later_db.vendor].format(name=victim))
    try:
        assert victim not in installed(later_db)
        output = later_migrate()
        assert f"installed trigger {victim}" in output
        assert installed(later_db) == set(names)
        later.enqueue(Noop())
        assert later.stage_counts()["enqueued"] == 1
        assert "nothing to do" in later_migrate()
    finally:
        reinstall()


def test_later_migrate_refuses_a_changed_partition_count(later_db, settings):
    """Changing a registered topic's partitions is a CommandError and check later.E015;
    nothing is registered meanwhile."""
    base = {**settings.LATER}
    settings.LATER = {**base, "TOPICS": {"orders": 4}}
    later_migrate()
    assert e015(later_db) == []

    settings.LATER = {**base, "TOPICS": {"orders": 8, "events": 2}}
    with pytest.raises(CommandError) as info:
        later_migrate()
    message = str(info.value)
    assert "'orders'" in message and "4" in message and "8" in message
    assert later_db.rows("SELECT name, partitions FROM later_topic") == [("orders", 4)]

    (error,) = e015(later_db)
    assert "'orders'" in error.msg
    assert "8 partitions" in error.msg and "registered with 4" in error.msg
    assert "LATER['TOPICS']['orders'] = 4" in error.hint

    settings.LATER = {**base, "TOPICS": {"orders": 4}}
    assert e015(later_db) == []
    assert "nothing to do" in later_migrate()


def test_checks_skip_stored_topics_unless_the_database_is_checked(later_db, settings):
    """E015 needs database access, so it only runs when the LATER database is checked."""
    set_later(settings, TOPICS={"orders": 4})
    later_migrate()
    set_later(settings, TOPICS={"orders": 5})
    assert [m.id for m in run_checks() if m.id == "later.E015"] == []
    assert len(e015(later_db)) == 1


def test_later_migrate_is_silent_at_verbosity_zero(later_db):
    out = StringIO()
    call_command("later_migrate", stdout=out, verbosity=0)
    assert out.getvalue() == ""
    assert "nothing to do" in later_migrate()


# -- frozen migrations ---------------------------------------------------------------
MIGRATIONS = Path(later_django.__file__).parent / "migrations"


def test_migrations_hold_their_own_sql_and_import_no_live_code():
    """A released migration must do the same thing forever: it may import
    Django and the models' field helpers, never the code that runs today."""
    for path in sorted(MIGRATIONS.glob("0*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            node.module if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        live = {name for name in imported if name and name.startswith("later_django")}
        assert live <= {"later_django.models"}, f"{path.name} imports {live}"


def test_the_newest_objects_are_those_of_the_last_objects_migration():
    """objects.NEWEST names the last migration that defines database objects."""
    defining = [
        path.stem for path in sorted(MIGRATIONS.glob("0*.py")) if "OBJECTS = " in path.read_text()
    ]
    assert objects.NEWEST.rsplit(".", 1)[1] == defining[-1]


def test_a_migrated_database_has_exactly_the_newest_objects(later_db):
    assert installed(later_db) == objects.expected(later_db.vendor)
    assert objects.expected(later_db.vendor), "every database has its counters' triggers"


def test_a_changed_recurring_sequential_partition_count_is_refused(later_db, settings):
    """The reserved topic of sequential recurring jobs is registered like a
    topic: changing RECURRING_SEQUENTIAL_PARTITIONS would move schedules to
    other partitions, so it is refused the same way, naming that setting."""
    set_later(settings, RECURRING_SEQUENTIAL_PARTITIONS=4)
    assert "registered topic later:recurring with 4 partitions" in later_migrate()
    set_later(settings, RECURRING_SEQUENTIAL_PARTITIONS=8)
    with pytest.raises(CommandError, match="RECURRING_SEQUENTIAL_PARTITIONS"):
        later_migrate()
    (error,) = e015(later_db)
    assert "RECURRING_SEQUENTIAL_PARTITIONS" in error.msg
    assert "= 4" in error.hint


def test_a_worker_of_this_release_refuses_to_start_before_the_migrations_it_needs(later_db):
    """A deploy that starts workers before later_migrate: the worker stops
    with one line naming the migrations and the fix, instead of failing
    every claim on a column that does not exist yet."""
    from django.db.migrations.executor import MigrationExecutor

    from later_django.management.commands.later_worker import _check_tables

    connection = connections[later_db.alias]
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("later_django")
    MigrationExecutor(connection).migrate([("later_django", "0013_job_control")])
    try:
        unapplied = schema.unapplied_migrations(later_db.alias)
        assert unapplied[0] == "0014_queues" and unapplied == sorted(unapplied)
        with pytest.raises(CommandError, match=r"missing.*later_queue.*later_migrate"):
            _check_tables(later_db.alias)
        # A plain enqueue of this release still works on the older schema.
        job_id = later.enqueue(Noop(n=1))
        assert later_db.stage_of(job_id) == "enqueued"
    finally:
        MigrationExecutor(connection).migrate(latest)
    assert schema.unapplied_migrations(later_db.alias) == []
    _check_tables(later_db.alias)


def test_upgrading_to_partitions_keeps_every_count_and_installs_version_3(later_db, settings):
    """Jobs counted by version 2 of the triggers stay counted exactly after
    migration 0010 (tables remade and triggers replaced in one transaction),
    and the new lane counts partition jobs apart."""
    from datetime import timedelta

    from django.db.migrations.executor import MigrationExecutor

    from later_django.partitions.api import enqueue_to_partition
    from tests.jobapp.jobs import Ordered

    connection = connections[later_db.alias]
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("later_django")
    executor.migrate([("later_django", "0009_retained_log")])
    try:
        ids = [later.enqueue(Noop(n=n)) for n in range(5)]
        later.enqueue_delayed(Noop(n=9), timedelta(hours=1))
        # As cancel() stores it: this release's cancel() also fails the
        # job's fan-in children, through a table 0009 does not have yet.
        cancelled = later_db.execute(
            "UPDATE later_job SET stage = 'cancelled' WHERE id = %s", [ids[0]]
        )
        assert cancelled == 1
    finally:
        # Through 0010 and on to the latest migration, as later_migrate does.
        MigrationExecutor(connection).migrate(latest)
    truth = dict(later_db.rows("SELECT stage, count(*) FROM later_job GROUP BY stage"))
    counts = {stage: n for stage, n in later.stage_counts().items() if n}
    assert counts == truth == {"enqueued": 4, "delayed": 1, "cancelled": 1}
    assert installed(later_db) == objects.expected(later_db.vendor)
    set_later(settings, TOPICS={"ordered": 8})
    enqueue_to_partition(Ordered("k", 0))
    with connections[later_db.alias].cursor() as cursor:
        assert dialect_for(later_db.alias).reads.plain_ready(cursor, namespace="default") == 4
    assert later.stage_counts()["enqueued"] == 5
