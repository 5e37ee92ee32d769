"""later's tables missing from its database: the worker stops with one line,
and the public API raises NotMigrated naming the fix."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.apps import apps
from django.db import DatabaseError, connections, transaction

import later_django as later
from later_django import schema
from later_django.db.base import TABLES
from later_django.ids import new_job_id
from tests.helpers import PROJECT_DIR, WORKER_ARGS
from tests.jobapp.jobs import Noop

FIX = "python manage.py later_migrate"


@contextmanager
def tables_away(later_db, *tables: str) -> Iterator[None]:
    """Rename ``tables`` for the duration, as if never migrated."""
    with connections[later_db.alias].cursor() as cursor:
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
    try:
        yield
    finally:
        with connections[later_db.alias].cursor() as cursor:
            for table in tables:
                cursor.execute(f"ALTER TABLE {table}_away RENAME TO {table}")


def run_worker(later_db, override: dict[str, object]) -> subprocess.CompletedProcess[str]:
    """``later_worker`` with LATER's database settings changed by ``override``."""
    env = {**later_db.worker_env(), "LATER_TEST_DB_OVERRIDE": json.dumps(override)}
    return subprocess.run(
        WORKER_ARGS,
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_schema_tables_are_the_models_tables():
    """TABLES names every table of later's models, and nothing else (a proxy
    model has no table of its own)."""
    models = apps.get_app_config("later_django").get_models()
    tables = [model._meta.db_table for model in models if not model._meta.proxy]
    assert sorted(TABLES) == sorted(tables)


def test_schema_missing_tables_lists_only_absent_tables(later_db):
    """A migrated database misses nothing; renamed tables are listed, in TABLES order."""
    assert schema.missing_tables(later_db.alias) == []
    with tables_away(later_db, "later_topic", "later_server"):
        assert schema.missing_tables(later_db.alias) == ["later_server", "later_topic"]


def test_schema_api_on_missing_tables_raises_not_migrated(later_db):
    """Every public call that reads or writes the tables raises NotMigrated, a
    LaterError and a DatabaseError, naming the database and the fix, with
    Django's error as its cause."""
    calls = {
        "enqueue": lambda: later.enqueue(Noop()),
        "enqueue_many": lambda: later.enqueue_many([Noop(), Noop()]),
        "enqueue_continue": lambda: later.enqueue_continue(new_job_id(), Noop()),
        "cancel": lambda: later.cancel(new_job_id()),
        "get_job": lambda: later.get_job(new_job_id()),
        "stage_counts": later.stage_counts,
        "enqueue_recurring": lambda: later.enqueue_recurring("r", Noop(), "* * * * *"),
        "remove_recurring": lambda: later.remove_recurring("r"),
        "list_recurring": later.list_recurring,
    }
    with tables_away(later_db, "later_job", "later_stage_count", "later_schedule"):
        for name, call in calls.items():
            with pytest.raises(later.NotMigrated) as raised:
                call()
            error = raised.value
            assert isinstance(error, later.LaterError), name
            assert isinstance(error, DatabaseError), name
            assert f"LATER['DATABASE'] {later_db.alias!r}" in str(error), name
            assert FIX in str(error), name
            assert isinstance(error.__cause__, DatabaseError), name
            assert not isinstance(error.__cause__, later.NotMigrated), name


def test_schema_enqueue_in_a_transaction_on_missing_tables_raises_not_migrated(later_db):
    """Inside the caller's atomic block too (PostgreSQL's transaction is then
    aborted, SQLite's is not: each is told apart its own way)."""
    with tables_away(later_db, "later_job"):
        with pytest.raises(later.NotMigrated, match="later_migrate"):
            with transaction.atomic(using=later_db.alias):
                later.enqueue_in(Noop())


def test_schema_other_database_errors_pass_through(later_db):
    """An error that is not a missing table reaches the caller unchanged."""
    with pytest.raises(DatabaseError) as raised:
        with connections[later_db.alias].cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM later_job")
    error = raised.value
    with pytest.raises(DatabaseError) as again:
        schema.raise_if_not_migrated(later_db.alias, error)
        raise error
    assert again.value is error


def test_schema_worker_on_unmigrated_database_exits_with_one_line(later_db, tmp_path: Path):
    """later_worker exits 1 with one line naming the missing tables and the
    fix; on SQLite it leaves no empty database file behind."""
    never = tmp_path / "never-migrated.sqlite3"
    override: dict[str, object] = (
        {"NAME": str(never)}
        if later_db.vendor == "sqlite"
        # Tables are looked up through the search_path: an empty one finds none.
        else {"OPTIONS": {"options": "-c search_path=later_no_such_schema"}}
    )
    result = run_worker(later_db, override)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: later's tables are missing on LATER['DATABASE']")
    assert ", ".join(TABLES) in lines[0]
    assert FIX in lines[0]
    assert not never.exists(), "no empty SQLite file is created"
    assert later_db.scalar("SELECT COUNT(*) FROM later_server") == 0


def test_schema_worker_on_unreachable_database_exits_with_one_line(later_db, tmp_path: Path):
    """A database that cannot be opened stops later_worker with one line too."""
    override = (
        {"NAME": str(tmp_path)}  # a folder: SQLite cannot open it
        if later_db.vendor == "sqlite"
        else {"NAME": "later_no_such_database"}
    )
    result = run_worker(later_db, override)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("CommandError: cannot reach LATER['DATABASE']")


def test_schema_cancel_in_a_transaction_on_missing_tables_raises_not_migrated(later_db):
    """cancel() inside the caller's block: its own block without a savepoint
    leaves Django refusing queries, yet the error is still told apart."""
    with tables_away(later_db, "later_job"):
        with pytest.raises(later.NotMigrated, match="later_migrate"):
            with transaction.atomic(using=later_db.alias):
                later.cancel(new_job_id())
