"""Migration 0019: ``later_server.version``, added as an expansion only (no
table rewrite, a bounded lock on PostgreSQL) so servers of the previous
release keep working on it (docs/how-to/upgrading.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import OperationalError, connections

from later_django.db.postgresql import connect_kwargs

PREVIOUS = "0018_partition_news"


@pytest.fixture
def before_0019(later_db) -> Iterator[str]:
    """The test database migrated back to 0018 for the test, forward after."""
    alias = later_db.alias
    call_command("migrate", "later_django", PREVIOUS, database=alias, verbosity=0)
    try:
        yield alias
    finally:
        call_command("migrate", "later_django", database=alias, verbosity=0)


def table_storage(later_db) -> object:
    """Where later_server's rows are stored: a rewrite of the table moves them."""
    if later_db.vendor == "postgresql":
        return later_db.scalar("SELECT pg_relation_filenode('later_server')")
    return later_db.scalar("SELECT rootpage FROM sqlite_master WHERE name = 'later_server'")


def columns(later_db) -> list[str]:
    with connections[later_db.alias].cursor() as cursor:
        described = connections[later_db.alias].introspection.get_table_description(
            cursor, "later_server"
        )
    return [column.name for column in described]


def test_migration_0019_adds_the_version_without_rewriting_the_table(later_db, before_0019):
    """A server row the previous release wrote (naming no version) is kept
    in place, its version NULL; the table is not rewritten."""
    assert "version" not in columns(later_db)
    now = later_db.now_ms()
    later_db.execute(
        "INSERT INTO later_server (id, namespace, hostname, pid, workers, topics, queues, "
        "started_ms, heartbeat_ms) VALUES ('old-1', 'default', 'h', 1, 2, %s, 'default', %s, %s)",
        [False, now, now],
    )
    stored = table_storage(later_db)
    call_command("migrate", "later_django", database=before_0019, verbosity=0)
    assert "version" in columns(later_db)
    assert table_storage(later_db) == stored, "the table was rewritten"
    assert later_db.rows("SELECT id, version FROM later_server") == [("old-1", None)]


def test_migration_0019_gives_up_on_a_held_table_instead_of_queueing_heartbeats(
    later_db, before_0019
):
    """PostgreSQL: while a transaction holds later_server, the migration
    waits at most its lock_timeout (5 s) for the table, fails, records
    nothing, and succeeds when run again."""
    if later_db.vendor != "postgresql":
        pytest.skip("lock_timeout is PostgreSQL's; SQLite waits on its file lock")
    import psycopg

    with psycopg.connect(**connect_kwargs(before_0019)) as holder:
        holder.execute("SELECT 1 FROM later_server LIMIT 1")  # holds ACCESS SHARE until commit
        started = time.monotonic()
        with pytest.raises(OperationalError, match="lock timeout"):
            call_command("migrate", "later_django", database=before_0019, verbosity=0)
        waited = time.monotonic() - started
        holder.rollback()
    assert 4.5 <= waited < 15, waited
    assert "version" not in columns(later_db)
    applied = later_db.scalar(
        "SELECT COUNT(*) FROM django_migrations WHERE name = '0019_server_version'"
    )
    assert applied == 0
    call_command("migrate", "later_django", database=before_0019, verbosity=0)
    assert "version" in columns(later_db)
