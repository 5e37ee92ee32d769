"""The storage contract on both databases: every Dialect operation production code calls.

COVERED names the operations of each store of a dialect ("dialect": its
own). The modules of this package test them, one module a store
(test_enqueue.py, test_hot.py, test_control.py, test_upkeep.py,
test_schedules.py, test_partitions.py, test_log.py, test_reads.py,
test_cluster.py, test_limits.py; test_dialect.py the dialect's own;
test_descendants.py the walks of db/descendants.py the stores share, which
are functions, not operations of a store). Each test calls the operations
themselves on the test database (the ``later_db`` fixture runs it once on
SQLite and once on PostgreSQL) and asserts what they change and return:
stages and their counters, the fence of every write made for a claim, and
times read from the database's clock, never earlier than a row's previous
change. A test branches or skips only on a capability flag of the dialect,
never on its vendor.

A new operation gets its tests in its store's module: the first tests here
fail until COVERED names it, a test of this package calls it through its
store, and production code calls it.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import ClassVar

import pytest

import later_django
from later_django.db.base import Dialect
from later_django.db.cluster import Cluster
from later_django.db.control import ControlStore
from later_django.db.enqueue import EnqueueStore
from later_django.db.hot import HotStore
from later_django.db.limits import LimitStore
from later_django.db.partitions import PartitionStore
from later_django.db.postgresql import PostgresDialect
from later_django.db.reads import ReadModels
from later_django.db.retained_log import LogStore
from later_django.db.schedules import ScheduleStore
from later_django.db.sqlite import SqliteDialect
from later_django.db.upkeep import UpkeepStore

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env

# The operations of the contract, per store of a dialect ("dialect": its
# own). Production code calls each of them, and a test of this package
# calls each through its store.
COVERED: dict[str, frozenset[str]] = {
    "dialect": frozenset(
        {
            "installed_objects",
            "database_exists",
            "missing_tables",
            "missing_table_error",
            "journal_wal",
            "vacuum",
            "change_counter",
            "clock_now",
            "database_size",
            "announce_ready",
        }
    ),
    "enqueue": frozenset(
        {
            "insert_one",
            "insert_unique",
            "insert_many",
            "insert_continuation",
            "insert_fan_in",
            # settling a child after its commit
            "settle_child",
            "settle_fan_in",
            # tracing
            "set_trace",
        }
    ),
    "hot": frozenset(
        {
            # claims and completions (the asyncio pair: supports_async_connection)
            "claim",
            "complete_many",
            "aclaim",
            "acomplete_many",
            # the worker's other writes, under the fence of a claim
            "renew",
            "unclaim",
            "claimed_since",
            "stage_after",
            "retry",
            "fail",
            "snooze",
            # cancelling a running job
            "cancel_requested",
            "cancel_running",
            # reads between claims: wake-ups, tracing
            "ready_exists",
            "trace_context",
            # the Django Tasks backend's results
            "task_results_write",
        }
    ),
    "control": frozenset({"cancel", "retry_failed", "run_now"}),
    "upkeep": frozenset(
        {
            "promote_due",
            "next_due_in",
            "stuck",
            "orphans",
            "resolve_orphan",
            "prune",
            "counter_compact",
        }
    ),
    "cluster": frozenset(
        {
            "server_heartbeat",
            "server_remove",
            "server_prune",
            "maintenance_claim",
            "lease_acquire",
            "lease_release",
            "queue_set_paused",
            "queue_paused",
        }
    ),
    "schedules": frozenset(
        {
            "schedule_save",
            "schedule_remove",
            "schedule_list",
            "schedule_due",
            "schedule_sequential_due",
            "schedule_advance",
            "insert_occurrence",
            "cancel_occurrences",
        }
    ),
    "partitions": frozenset(
        {
            "topic_partitions",
            "topic_register",
            "partition_next_sequence",
            "insert_partitioned",
            "partition_heads",
            "partition_claim",
            "partition_fence",
            "partition_complete",
            "partition_complete_many",
            "apartition_heads",
            "apartition_claim",
            "apartition_complete_many",
            "partition_renew",
            "partition_release",
            "topic_servers",
            "partition_force_fail_head",
            "place_of",
            "partition_truncate_history",
            "partition_stats",
        }
    ),
    "log": frozenset(
        {
            "log_topic_register",
            "log_topic_get",
            "log_topic_retained",
            "log_append",
            "log_append_is_one_statement",
            "log_record_read",
            "log_record_prune",
            "log_consumer_acquire",
            "log_consumer_renew",
            "log_consumer_commit",
            "log_consumer_release",
            "log_consumer_state",
            "log_lag",
        }
    ),
    "limits": frozenset({"claim_limited", "aclaim_limited", "keyed_ready_exists", "held"}),
    "reads": frozenset(
        {
            "stage_counts",
            "plain_ready",
            "queue_states",
            "stat_insert",
            "stats_since",
            "sample_take",
            "samples_since",
            "dashboard_prune",
            "lane_counts",
            "live_servers",
            "running_jobs",
            "log_consumers",
            "job_detail",
            "job_children",
            "job_parents",
            "job_page",
            # later_health
            "server_beats",
            "counter_drift",
            "running_unleased",
        }
    ),
}
DIALECTS = (SqliteDialect(), PostgresDialect())
# The classes that make up a store, on every vendor.
STORE_BASES: dict[str, type] = {
    "dialect": Dialect,
    "enqueue": EnqueueStore,
    "hot": HotStore,
    "control": ControlStore,
    "upkeep": UpkeepStore,
    "cluster": Cluster,
    "schedules": ScheduleStore,
    "partitions": PartitionStore,
    "log": LogStore,
    "reads": ReadModels,
    "limits": LimitStore,
}
# What only a vendor can answer: every vendor implements these.
VENDOR_OPERATIONS = {
    "dialect": frozenset(
        {
            "installed_objects",
            "database_exists",
            "missing_tables",
            "missing_table_error",
            "journal_wal",
            "database_size",
        }
    ),
    "enqueue": frozenset({"insert_one", "insert_many"}),
    # The plain claim, bound (claim runs it), and the batch completion.
    "hot": frozenset({"_claim_statement", "complete_many"}),
    "upkeep": frozenset({"counter_compact"}),
    # The claim statement a limited claim runs: the vendor's own claims.
    "limits": frozenset({"_claim_statement"}),
    "partitions": frozenset({"partition_claim", "partition_complete_many"}),
}


def store_classes(store: str) -> set[type]:
    """The store's base class and every vendor's class of it."""
    return {STORE_BASES[store]} | {
        type(d if store == "dialect" else getattr(d, store)) for d in DIALECTS
    }


PACKAGE = Path(later_django.__file__).parent


def _public_operations(cls: type) -> set[str]:
    return {
        name
        for name in dir(cls)
        if not name.startswith("_") and inspect.isfunction(getattr(cls, name))
    }


# -- the contract itself (no database) --------------------------------------------------


def test_conformance_covers_every_public_operation():
    """Every public method of each store, on every vendor, is in COVERED
    under that store, and this suite (every module of this package) calls
    each of them through it."""
    source = "\n".join(path.read_text() for path in sorted(Path(__file__).parent.glob("*.py")))
    for store, names in COVERED.items():
        public = set().union(*map(_public_operations, store_classes(store)))
        assert public == names, store
        via = "." if store == "dialect" else f".{store}."
        assert [name for name in sorted(names) if f"{via}{name}(" not in source] == [], store


def test_conformance_every_operation_has_a_production_caller():
    """No operation is kept for tests alone: code under later_django calls
    each one through its store (a store calling its own operation does not
    count; one store given another counts)."""
    code = "\n".join(
        path.read_text() for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts
    )
    for store, names in COVERED.items():
        via = r"(?<!self)\." if store == "dialect" else rf"\._?{store}\."
        uncalled = [name for name in sorted(names) if not re.search(rf"{via}{name}\(", code)]
        assert uncalled == [], store


def test_store_vendor_operations_are_abstract():
    """A store's base cannot be used as it is where only a vendor can
    answer; every other store is one class for both vendors."""
    for store, base in STORE_BASES.items():
        abstract = getattr(base, "__abstractmethods__", frozenset())
        assert abstract == VENDOR_OPERATIONS.get(store, frozenset()), store
    with pytest.raises(TypeError):
        Dialect()  # type: ignore[abstract]


def test_stores_reach_each_other_only_through_what_they_are_given():
    """No store reaches past its interface: no "type: ignore" between
    stores, no call of another store's private helpers, and no vendor check
    outside the vendors' own modules."""
    db = PACKAGE / "db"
    for path in db.rglob("*.py"):
        text = path.read_text()
        assert "ignore[attr-defined]" not in text, path
        # What stores share is a function (db/descendants.py), never another
        # store's helper: a store given another calls its operations only.
        assert not re.search(r"self\._[a-z]+\._", text), path
        if path.name not in {"postgresql.py", "sqlite.py", "__init__.py"}:
            assert not re.search(r"isinstance\([^)]*(Postgres|Sqlite)", text), path
            assert ".vendor ==" not in text, path


def test_each_dialect_runs_the_stores_it_declares():
    """A vendor's stores are the classes it names: a store made anew after
    (a base class where the vendor has its own) would silently drop the
    vendor's statements."""
    for dialect in DIALECTS:
        cls = type(dialect)
        assert type(dialect.enqueue) is cls.enqueue_store
        assert type(dialect.hot) is cls.hot_store
        assert type(dialect.upkeep) is cls.upkeep_store
        assert type(dialect.partitions) is cls.partition_store
        assert type(dialect.log) is cls.log_store
        assert type(dialect.limits) is cls.limit_store


def test_dialect_capability_flags_match_their_operations():
    """A vendor implements a gated operation exactly when it declares its
    flag: a dialect that breaks this cannot even be defined."""
    for dialect in DIALECTS:
        cls, hot = type(dialect), type(dialect.hot)
        assert (cls.change_counter is not Dialect.change_counter) == cls.supports_change_counter
        assert (cls.vacuum is not Dialect.vacuum) == cls.needs_vacuum
        async_pair = {
            name
            for name in ("aclaim", "acomplete_many")
            if getattr(hot, name) is not getattr(HotStore, name)
        }
        assert (async_pair == {"aclaim", "acomplete_many"}) == cls.supports_async_connection
        assert async_pair in (set(), {"aclaim", "acomplete_many"})
        limits = type(dialect.limits)
        limited_async = limits.aclaim_limited is not LimitStore.aclaim_limited
        assert limited_async == cls.supports_async_connection
        partitions = type(dialect.partitions)
        lane_async = {
            name
            for name in ("apartition_heads", "apartition_claim", "apartition_complete_many")
            if getattr(partitions, name) is not getattr(PartitionStore, name)
        }
        assert bool(lane_async) == cls.supports_async_connection and len(lane_async) in (0, 3)

    with pytest.raises(TypeError, match="change_counter"):

        class NoCounter(SqliteDialect):
            supports_change_counter: ClassVar[bool] = False

    with pytest.raises(TypeError, match="aclaim, acomplete_many"):

        class NoAsync(SqliteDialect):
            supports_async_connection: ClassVar[bool] = True


def test_dialect_operations_take_grouped_arguments_and_return_no_bare_tuples():
    """Past three values an operation takes a params object (db.rows), and
    it never answers with a bare tuple."""
    for store, names in COVERED.items():
        for name, cls in ((n, c) for n in sorted(names) for c in store_classes(store)):
            signature = inspect.signature(getattr(cls, name))
            params = list(signature.parameters)[2:]  # self, then the cursor or connection
            assert len(params) <= 3, (cls.__name__, name, params)
            returns = str(inspect.get_annotations(getattr(cls, name))["return"])
            assert not re.search(r"(?<![A-Za-z])tuple\[", returns), (cls.__name__, name, returns)


def test_storage_reads_no_settings():
    """db/ reads no LATER setting: what one decides reaches it as a value
    (``prepare``), so a changed setting is never read stale from db/."""
    for path in (PACKAGE / "db").rglob("*.py"):
        text = path.read_text()
        assert not re.search(
            r"later_django\.conf\b|from later_django import [^\n]*\bconf\b", text
        ), path
