"""The dialect's own operations: the whole database, and its clock."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connections, transaction

from later_django import objects
from tests.conformance.helpers import (
    NS,
    assert_counts,
    commit_elsewhere,
    cursor_of,
    db_now,
    insert,
    job_row,
    new_job,
    stages,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


class Rollback(Exception):
    """Raised inside an atomic block to roll it back."""


# -- the database -----------------------------------------------------------------------


def test_installed_objects_are_the_newest_version_even_installed_twice(later_db, dialect):
    """installed_objects() names exactly the objects of the newest frozen
    version, installed again and again; the counters follow the next writes."""
    vendor = connections[later_db.alias].vendor
    for _ in range(2):
        with cursor_of(later_db, atomic=True) as c:
            objects.install(c, vendor)
    with cursor_of(later_db) as c:
        assert dialect.installed_objects(c) == set(objects.expected(vendor))
    insert(later_db)
    assert_counts(later_db)


def test_database_exists_and_misses_no_table(later_db, dialect):
    """A migrated database exists and has every one of later's tables."""
    assert dialect.database_exists(connections[later_db.alias]) is True
    with cursor_of(later_db) as c:
        assert dialect.missing_tables(c) == []


def test_missing_table_error_tells_a_missing_table_from_other_errors(later_db, dialect):
    """An error from a statement on a missing table of later's is one; an
    unknown column or a broken constraint is not."""
    db = connections[later_db.alias]
    with pytest.raises(Rollback), transaction.atomic(using=later_db.alias):
        with db.cursor() as c:
            c.execute("ALTER TABLE later_topic RENAME TO later_topic_away")
        with pytest.raises(DatabaseError) as missing:
            with db.cursor() as c:
                c.execute("SELECT name FROM later_topic")
        assert dialect.missing_table_error(db, missing.value) is True
        raise Rollback
    for sql in (
        "SELECT no_such_column FROM later_topic",
        "INSERT INTO later_topic (name, partitions) VALUES (NULL, 1)",
    ):
        with pytest.raises(DatabaseError) as other:
            with cursor_of(later_db, atomic=True) as c:
                c.execute(sql)
        assert dialect.missing_table_error(db, other.value) is False, sql
    with cursor_of(later_db) as c:
        assert dialect.missing_tables(c) == []


def test_journal_wal_changes_a_database_at_most_once(later_db, dialect):
    """Write-ahead logging is switched on once (by later_migrate, or the
    test settings): asking again changes nothing, and writes go on."""
    with cursor_of(later_db) as c:
        dialect.journal_wal(c)
        assert dialect.journal_wal(c) is False
    insert(later_db)
    assert_counts(later_db)


def test_vacuum_runs_where_the_database_needs_it(later_db, dialect):
    """(needs_vacuum) VACUUM runs and keeps every row; elsewhere it is not
    an operation of the dialect."""
    job_id = insert(later_db)
    with cursor_of(later_db) as c:
        if not dialect.needs_vacuum:
            with pytest.raises(NotImplementedError):
                dialect.vacuum(c)
            return
        assert dialect.vacuum(c) is True
    assert stages(later_db, job_id) == ["enqueued"]
    assert_counts(later_db)


def test_change_counter_moves_when_another_connection_commits(later_db, dialect):
    """(supports_change_counter) The counter stays while only this
    connection writes, and moves once another one committed."""
    with cursor_of(later_db) as c:
        if not dialect.supports_change_counter:
            with pytest.raises(NotImplementedError):
                dialect.change_counter(c)
            return
        before = dialect.change_counter(c)
        dialect.partitions.topic_register(c, namespace=NS, name="own-write", partitions=1)
        assert dialect.change_counter(c) == before
    commit_elsewhere(later_db)
    with cursor_of(later_db) as c:
        assert dialect.change_counter(c) != before


def test_database_size_is_the_whole_database_in_bytes(later_db, dialect):
    with cursor_of(later_db) as c:
        before = dialect.database_size(c)
        dialect.enqueue.insert_many(
            connections[later_db.alias], [new_job(payload=b"x" * 4000) for _ in range(500)]
        )
        after = dialect.database_size(c)
    assert 0 < before < after


# -- the database's clock ---------------------------------------------------------------


def test_the_clock_is_one_value_for_a_whole_statement(later_db, dialect):
    """{now} reads the database's clock once per statement: every column and
    row one write stamps agrees (history's last entry equals changed_ms), and
    the planner may bound an index search with it."""
    rows = 200_000  # some tens of milliseconds of work on either database
    [(first, last)] = later_db.rows(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s) "
        f"SELECT MIN(t), MAX(t) FROM (SELECT {dialect.vendor_sql.now} AS t FROM n) s",
        [rows],
    )
    assert first == last


def test_clock_now_reads_the_database_clock(later_db, dialect):
    """clock_now() is the clock every stored time is on: between two reads
    of the database's clock, never going back, and bracketing a time the
    database stamps between two calls."""
    before = db_now(later_db)
    with cursor_of(later_db) as c:
        first = dialect.clock_now(c)
        job_id = insert(later_db)
        second = dialect.clock_now(c)
    after = db_now(later_db)
    assert type(first) is int and type(second) is int
    assert before <= first <= job_row(later_db, job_id)["created_ms"] <= second <= after


def test_announce_ready_wakes_listeners_of_the_queue_at_commit(later_db, dialect):
    """PostgreSQL NOTIFYs the queue's idle workers, as the counter triggers
    do for jobs that became ready; without LISTEN it does nothing (the
    commit itself is what SQLite's watchers see)."""
    if not dialect.supports_listen:
        with cursor_of(later_db, atomic=True) as c:
            dialect.announce_ready(c, namespace=NS, queue="emails")
        return
    import psycopg

    from later_django.db.postgresql import connect_kwargs
    from later_django.worker.notifier import ready_count

    with psycopg.connect(**connect_kwargs(later_db.alias), autocommit=True) as listener:
        listener.execute("LISTEN later")
        with cursor_of(later_db, atomic=True) as c:
            dialect.announce_ready(c, namespace=NS, queue="emails")
            dialect.announce_ready(c, namespace=NS, queue="default")
        said = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert [ready_count(payload, NS) for payload in said] == [("emails", 255), ("default", 255)]
