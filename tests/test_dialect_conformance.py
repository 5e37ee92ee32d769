"""The storage contract on both databases: every Dialect operation production code calls.

Each test calls the operations themselves on the test database (the
``later_db`` fixture runs it once on SQLite and once on PostgreSQL) and
asserts what they change and return: stages and their counters, the fence
of every write made for a claim, and times read from the database's clock,
never earlier than a row's previous change. A test branches or skips only
on a capability flag of the dialect, never on its vendor.

A new operation gets its tests here: the first tests fail until COVERED
names it, a test calls it, and production code calls it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest
from django.db import DatabaseError, connections, transaction

import later_django
from later_django import objects
from later_django.db import dialect_for
from later_django.db.base import Dialect
from later_django.db.cluster import Cluster
from later_django.db.jobs import JobEngine
from later_django.db.partitions import PartitionStore
from later_django.db.postgresql import PostgresDialect, connect_kwargs
from later_django.db.reads import ReadModels
from later_django.db.retained_log import LogStore
from later_django.db.rows import (
    ClaimRequest,
    Completion,
    DueSchedule,
    ExpiredFence,
    FailureWrite,
    HeadFailure,
    Heartbeat,
    HeldLease,
    JobQuery,
    LeaseRequest,
    LogAcquired,
    LogAdvance,
    LogCommit,
    LogConsumerKey,
    LogConsumerState,
    LogFence,
    LogLag,
    LogLeaseRequest,
    LogPartitionKey,
    LogPrune,
    LogRead,
    LogTopicRow,
    NewLogRecord,
    Orphan,
    OwnerFence,
    PartitionClaimRequest,
    PartitionCompletion,
    PartitionSlot,
    RetryWrite,
    ScheduleAdvance,
    ScheduleInfo,
    ScheduleKey,
    ScheduleWrite,
    StatRow,
    StuckJob,
    TaskAttemptEnd,
)
from later_django.db.schedules import DUE_BATCH, ScheduleStore
from later_django.db.sqlite import SqliteDialect
from later_django.ids import new_job_id
from later_django.states import PARENT_FAILED, Stage
from later_django.types import Claim, ClaimedJob, NewJob, PartitionLane

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env

# The operations of the contract, per store of a dialect ("dialect": its
# own). Production code calls each of them, and a test below calls each.
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
        }
    ),
    "jobs": frozenset(
        {
            # enqueue
            "job_insert_one",
            "job_insert_many",
            "job_insert_continuation",
            "job_settle_child",
            "job_cancel",
            # the worker's hot path (the asyncio pair: supports_async_connection)
            "job_claim",
            "job_complete_many",
            "ajob_claim",
            "ajob_complete_many",
            # the worker's other writes, under the fence of a claim
            "job_renew",
            "job_unclaim",
            "job_claimed_since",
            "job_stage_after",
            "job_retry",
            "job_fail",
            "job_fail_descendants",
            # maintenance
            "job_promote_due",
            "job_stuck",
            "job_orphans",
            "job_resolve_orphan",
            "job_prune",
            "job_next_due_in",
            "counter_compact",
            # tracing
            "job_set_trace",
            "job_trace_context",
            # wake-ups
            "job_ready_exists",
            # an operator's actions
            "job_retry_failed",
            "job_run_now",
            # the Django Tasks backend's results
            "task_result_save",
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
        }
    ),
    "schedules": frozenset(
        {
            "schedule_save",
            "schedule_remove",
            "schedule_list",
            "schedule_due",
            "schedule_advance",
            "job_insert_occurrence",
            "job_cancel_occurrences",
        }
    ),
    "partitions": frozenset(
        {
            "topic_partitions",
            "topic_register",
            "partition_next_sequence",
            "job_insert_partitioned",
            "partition_heads",
            "partition_claim",
            "partition_fence",
            "partition_complete",
            "partition_renew",
            "partition_release",
            "topic_servers",
            "partition_force_fail_head",
            "job_place",
            "partition_truncate_history",
            "partition_stats",
        }
    ),
    "log": frozenset(
        {
            "log_topic_register",
            "log_topic_get",
            "log_topic_retained",
            "log_partition_advance",
            "log_record_insert",
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
    "reads": frozenset(
        {
            "stage_counts",
            "plain_ready",
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
            "job_page",
        }
    ),
}
DIALECTS = (SqliteDialect(), PostgresDialect())
# The classes that make up a store, on every vendor.
STORE_BASES: dict[str, type] = {
    "dialect": Dialect,
    "jobs": JobEngine,
    "cluster": Cluster,
    "schedules": ScheduleStore,
    "partitions": PartitionStore,
    "log": LogStore,
    "reads": ReadModels,
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
    "jobs": frozenset(
        {"job_insert_one", "job_insert_many", "job_claim", "job_complete_many", "counter_compact"}
    ),
}


def store_classes(store: str) -> set[type]:
    """The store's base class and every vendor's class of it."""
    return {STORE_BASES[store]} | {
        type(d if store == "dialect" else getattr(d, store)) for d in DIALECTS
    }


NS = "default"
OWNER = "server-a"
LEASE_MS = 30_000
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
PACKAGE = Path(later_django.__file__).parent


def _public_operations(cls: type) -> set[str]:
    return {
        name
        for name in dir(cls)
        if not name.startswith("_") and inspect.isfunction(getattr(cls, name))
    }


# -- the contract itself (no database) ------------------------------------------------


def test_conformance_covers_every_public_operation():
    """Every public method of each store, on every vendor, is in COVERED
    under that store, and this suite calls each of them through it."""
    source = Path(__file__).read_text()
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
    stores, and no vendor check outside the vendors' own modules."""
    db = PACKAGE / "db"
    for path in db.rglob("*.py"):
        text = path.read_text()
        assert "ignore[attr-defined]" not in text, path
        if path.name not in {"postgresql.py", "sqlite.py", "__init__.py"}:
            assert not re.search(r"isinstance\([^)]*(Postgres|Sqlite)", text), path
            assert ".vendor ==" not in text, path


def test_dialect_capability_flags_match_their_operations():
    """A vendor implements a gated operation exactly when it declares its
    flag: a dialect that breaks this cannot even be defined."""
    for dialect in DIALECTS:
        cls, jobs = type(dialect), type(dialect.jobs)
        assert (cls.change_counter is not Dialect.change_counter) == cls.supports_change_counter
        assert (cls.vacuum is not Dialect.vacuum) == cls.needs_vacuum
        async_pair = {
            name
            for name in ("ajob_claim", "ajob_complete_many")
            if getattr(jobs, name) is not getattr(JobEngine, name)
        }
        assert (async_pair == {"ajob_claim", "ajob_complete_many"}) == cls.supports_async_connection
        assert async_pair in (set(), {"ajob_claim", "ajob_complete_many"})

    with pytest.raises(TypeError, match="change_counter"):

        class NoCounter(SqliteDialect):
            supports_change_counter: ClassVar[bool] = False

    with pytest.raises(TypeError, match="ajob_claim, ajob_complete_many"):

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


# -- helpers ----------------------------------------------------------------------------


@pytest.fixture
def dialect(later_db) -> Dialect:
    return dialect_for(later_db.alias)


@contextmanager
def cursor_of(later_db, *, atomic: bool = False) -> Iterator[Any]:
    if atomic:
        with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as c:
            yield c
        return
    with connections[later_db.alias].cursor() as c:
        yield c


def db_now(later_db) -> int:
    """The database's clock, in epoch ms."""
    return int(later_db.scalar(f"SELECT {dialect_for(later_db.alias).vendor_sql.now}"))


def new_job(**fields: Any) -> NewJob:
    values: dict[str, Any] = {
        "id": new_job_id(),
        "namespace": NS,
        "type_name": "conformance.Job",
        "payload": b"\x81\xa1n\x01",
        "priority": 0,
        "retry_policy": None,
    }
    return NewJob(**{**values, **fields})


def insert(later_db, **fields: Any) -> str:
    job = new_job(**fields)
    dialect_for(later_db.alias).jobs.job_insert_one(connections[later_db.alias], job)
    return job.id


def insert_child(later_db, parent: str, retention_ms: int = DAY_MS) -> tuple[str, str | None]:
    job = new_job(parent_id=parent)
    with cursor_of(later_db) as c:
        stage = dialect_for(later_db.alias).jobs.job_insert_continuation(c, job, retention_ms)
    return job.id, stage


COLUMNS = (
    "stage",
    "attempts",
    "uncounted",
    "lease_owner",
    "lease_expires_ms",
    "changed_ms",
    "history",
    "last_error",
    "run_at_ms",
    "created_ms",
    "started_ms",
    "finished_ms",
    "expires_ms",
    "retry_policy",
    "priority",
    "parent_id",
)


def job_row(later_db, job_id: str) -> dict[str, Any]:
    rows = later_db.rows(f"SELECT {', '.join(COLUMNS)} FROM later_job WHERE id = %s", [job_id])
    assert rows, f"job {job_id} does not exist"
    row = dict(zip(COLUMNS, rows[0], strict=True))
    _assert_history_sane(row)
    return row


def _assert_history_sane(row: dict[str, Any]) -> None:
    """The history ends with the row's stage at its changed_ms, and never goes back."""
    entries = [entry.split("@") for entry in row["history"].split(";") if entry]
    times = [int(at) for _, at in entries]
    assert times == sorted(times), row["history"]
    assert entries[-1] == [row["stage"], str(row["changed_ms"])], row


def stages(later_db, *job_ids: str) -> list[str]:
    return [job_row(later_db, job_id)["stage"] for job_id in job_ids]


def assert_counts(later_db) -> None:
    """The counters say what COUNT(*) says, for every stage of every namespace."""
    dialect = dialect_for(later_db.alias)
    for namespace in (NS, "other"):
        counted = dict.fromkeys(Stage.values, 0)
        for stage, n in later_db.rows(
            "SELECT stage, COUNT(*) FROM later_job WHERE namespace = %s GROUP BY stage",
            [namespace],
        ):
            counted[str(stage)] = int(n)  # type: ignore[call-overload]
        with cursor_of(later_db) as c:
            assert dialect.reads.stage_counts(c, namespace=namespace) == counted


def age(later_db, column: str, job_id: str, by_ms: int) -> None:
    """Move a time of the row ``by_ms`` into the past, as if that much time passed."""
    with cursor_of(later_db) as c:
        c.execute(f"UPDATE later_job SET {column} = {column} - %s WHERE id = %s", [by_ms, job_id])


def on_async_connection(later_db, op: Callable[[psycopg.AsyncConnection[Any]], Any]) -> Any:
    """Run ``op`` on an autocommit asyncio connection, as the worker's own session does."""

    async def run() -> Any:
        conn = await psycopg.AsyncConnection.connect(
            autocommit=True, **connect_kwargs(later_db.alias)
        )
        try:
            return await op(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


def claim(
    later_db, *, owner: str = OWNER, limit: int = 1, lease_ms: int = LEASE_MS, namespace: str = NS
) -> list[ClaimedJob]:
    """The worker's claim, through the pair the dialect's capability names."""
    dialect = dialect_for(later_db.alias)
    request = ClaimRequest(namespace=namespace, owner=owner, limit=limit, lease_ms=lease_ms)
    if dialect.supports_async_connection:

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[ClaimedJob]:
            async with conn.cursor() as cursor:
                return await dialect.jobs.ajob_claim(cursor, request)

        return on_async_connection(later_db, op)  # type: ignore[no-any-return]
    with cursor_of(later_db) as c:
        return dialect.jobs.job_claim(c, request)


def complete(
    later_db, jobs: list[tuple[str, int]], *, owner: str = OWNER, retention_ms: int = DAY_MS
) -> Completion:
    """The worker's batch completion, through the pair its capability names."""
    dialect = dialect_for(later_db.alias)
    if dialect.supports_async_connection:
        return on_async_connection(  # type: ignore[no-any-return]
            later_db,
            lambda conn: dialect.jobs.ajob_complete_many(
                conn, owner=owner, jobs=jobs, retention_ms=retention_ms
            ),
        )
    with cursor_of(later_db, atomic=True) as c:
        return dialect.jobs.job_complete_many(c, owner=owner, jobs=jobs, retention_ms=retention_ms)


def claim_one(later_db, job_id: str, **kwargs: Any) -> ClaimedJob:
    claimed = claim(later_db, **kwargs)
    assert [job.id for job in claimed] == [job_id]
    return claimed[0]


def owned(job: ClaimedJob, owner: str = OWNER) -> OwnerFence:
    return OwnerFence(job_id=job.id, attempts=job.attempts, owner=owner)


def commit_elsewhere(later_db) -> None:
    """Commit a write on another connection (another thread's)."""

    def write() -> None:
        try:
            with connections[later_db.alias].cursor() as c:
                dialect_for(later_db.alias).partitions.topic_register(
                    c, namespace=NS, name=new_job_id(), partitions=1
                )
        finally:
            connections.close_all()

    thread = threading.Thread(target=write)
    thread.start()
    thread.join(30)


class Rollback(Exception):
    """Raised inside an atomic block to roll it back."""


# -- the database -----------------------------------------------------------------------


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


# -- enqueue ----------------------------------------------------------------------------


def test_job_insert_one_decides_ready_or_delayed_by_the_database_clock(later_db, dialect):
    """A job is ready unless it is due later than the database's now; its
    times are the database's, taken by the insert."""
    db = connections[later_db.alias]
    before = db_now(later_db)
    ready, delayed = new_job(priority=5, retry_policy='{"max": 2}'), new_job(delay_ms=HOUR_MS)
    past, future = new_job(run_at_ms=before - HOUR_MS), new_job(run_at_ms=before + DAY_MS)
    assert [dialect.jobs.job_insert_one(db, job) for job in (ready, delayed, past, future)] == [
        "enqueued",
        "delayed",
        "enqueued",
        "delayed",
    ]
    after = db_now(later_db)
    rows = {job.id: job_row(later_db, job.id) for job in (ready, delayed, past, future)}
    for row in rows.values():
        assert before <= row["created_ms"] <= after
        assert row["changed_ms"] == row["created_ms"]
        assert row["attempts"] == 0 and row["lease_owner"] is None
        assert row["history"] == f"{row['stage']}@{row['created_ms']};"
    assert rows[ready.id]["run_at_ms"] == rows[ready.id]["created_ms"]
    assert (rows[ready.id]["priority"], rows[ready.id]["retry_policy"]) == (5, '{"max": 2}')
    assert rows[delayed.id]["run_at_ms"] == rows[delayed.id]["created_ms"] + HOUR_MS
    assert rows[past.id]["run_at_ms"] == rows[past.id]["created_ms"], "never due in the past"
    assert rows[future.id]["run_at_ms"] == before + DAY_MS
    assert_counts(later_db)


def test_job_insert_many_writes_every_job_ready_or_none(later_db, dialect):
    """A bulk insert writes every job ready, in more than one batch where the
    database needs batches; an error while the jobs are built writes none."""
    db = connections[later_db.alias]
    jobs = [new_job(payload=bytes([n % 256]) * (n % 7), priority=n % 3) for n in range(1200)]
    before = db_now(later_db)
    with transaction.atomic(using=later_db.alias):
        dialect.jobs.job_insert_many(db, iter(jobs))
    after = db_now(later_db)
    assert later_db.job_count() == len(jobs)
    stored = {
        str(r[0]): r[1:]
        for r in later_db.rows("SELECT id, stage, payload, priority, created_ms FROM later_job")
    }
    for job in jobs[:: len(jobs) // 10]:
        stage, payload, priority, created_ms = stored[job.id]
        assert (stage, bytes(payload), priority) == ("enqueued", job.payload, job.priority)  # type: ignore[call-overload]
        assert before <= created_ms <= after  # type: ignore[operator]
    job_row(later_db, jobs[0].id)
    assert_counts(later_db)

    def broken() -> Iterator[NewJob]:
        yield from (new_job() for _ in range(300))
        raise ValueError("payload 301 cannot be encoded")

    with pytest.raises(ValueError), transaction.atomic(using=later_db.alias):
        dialect.jobs.job_insert_many(db, broken())
    assert later_db.job_count() == len(jobs)
    assert_counts(later_db)


def test_job_insert_continuation_follows_its_parent(later_db, dialect):
    """A child waits for a parent that has not finished, is ready after one
    that succeeded, and fails after one that failed or was cancelled; with
    no parent in the namespace nothing is inserted."""
    running, succeeded, failed = insert(later_db), insert(later_db), insert(later_db)
    cancelled, elsewhere = insert(later_db), insert(later_db, namespace="other")
    first = claim(later_db, limit=3)
    by_id = {job.id: job for job in first}
    assert complete(later_db, [(succeeded, 1)]).done_ids == [succeeded]
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_fail(
            c, owned(by_id[failed]), FailureWrite(error="x", retention_ms=1)
        )
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=cancelled, retention_ms=DAY_MS)
    assert running in by_id

    children = {
        parent: insert_child(later_db, parent, retention_ms=HOUR_MS)
        for parent in (running, succeeded, failed, cancelled)
    }
    assert {parent: stage for parent, (_, stage) in children.items()} == {
        running: "waiting",
        succeeded: "enqueued",
        failed: "failed",
        cancelled: "failed",
    }
    for parent in (failed, cancelled):
        row = job_row(later_db, children[parent][0])
        assert row["last_error"] == PARENT_FAILED
        assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert job_row(later_db, children[running][0])["parent_id"] == running
    before = later_db.job_count()
    assert insert_child(later_db, new_job_id())[1] is None
    assert insert_child(later_db, elsewhere)[1] is None, "another namespace's parent"
    assert later_db.job_count() == before
    assert_counts(later_db)


def test_job_settle_child_releases_or_fails_a_child_its_parent_missed(later_db, dialect):
    """After its commit a waiting child looks at its parent: still running,
    it waits; finished meanwhile, it is released or failed with its own
    descendants."""
    parents = [insert(later_db) for _ in range(3)]
    claim(later_db, limit=3)
    children = [insert_child(later_db, parent)[0] for parent in parents]
    grandchild = insert_child(later_db, children[1])[0]
    # The parents finish without seeing the children (they were uncommitted).
    with cursor_of(later_db) as c:
        for parent, stage in zip(parents[:2], ("success", "cancelled"), strict=True):
            c.execute(
                "UPDATE later_job SET stage = %s, lease_owner = NULL, lease_expires_ms = NULL "
                "WHERE id = %s",
                [stage, parent],
            )
    before = db_now(later_db)
    settled = []
    for child in children:
        with cursor_of(later_db, atomic=True) as c:
            settled.append(dialect.jobs.job_settle_child(c, job_id=child, retention_ms=DAY_MS))
    after = db_now(later_db)
    assert settled == ["released", "failed", "waiting"]
    assert stages(later_db, *children, grandchild) == ["enqueued", "failed", "waiting", "failed"]
    released = job_row(later_db, children[0])
    assert before <= released["run_at_ms"] == released["changed_ms"] <= after
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    with cursor_of(later_db, atomic=True) as c:
        assert (
            dialect.jobs.job_settle_child(c, job_id=children[0], retention_ms=DAY_MS) == "waiting"
        )
    assert_counts(later_db)


def test_job_cancel_cancels_only_jobs_not_started(later_db, dialect):
    """Ready, delayed and waiting jobs are cancelled, with their waiting
    descendants failed; running, finished and other namespaces' are not."""
    ready, delayed, running = insert(later_db), insert(later_db, delay_ms=HOUR_MS), insert(later_db)
    elsewhere = insert(later_db, namespace="other")
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_job SET priority = 100 WHERE id = %s", [running])
    claim_one(later_db, running)
    child = insert_child(later_db, ready)[0]
    grandchild = insert_child(later_db, child)[0]

    def cancel(job_id: str, namespace: str = NS) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.jobs.job_cancel(
                c, namespace=namespace, job_id=job_id, retention_ms=HOUR_MS
            )

    before = db_now(later_db)
    assert [cancel(ready), cancel(delayed)] == [True, True]
    after = db_now(later_db)
    assert [cancel(running), cancel(ready), cancel(elsewhere), cancel(new_job_id())] == [False] * 4
    assert stages(later_db, ready, delayed, running, elsewhere, child, grandchild) == [
        "cancelled",
        "cancelled",
        "running",
        "enqueued",
        "failed",
        "failed",
    ]
    row = job_row(later_db, ready)
    assert before <= row["finished_ms"] == row["changed_ms"] <= after
    assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    assert cancel(child) is False, "a failed job is finished"
    waiting = insert_child(later_db, running)[0]
    assert cancel(waiting) is True
    assert_counts(later_db)


# -- the worker's hot path ---------------------------------------------------------------


def test_claim_takes_the_best_ready_jobs_and_leases_them(later_db, dialect):
    """A claim takes ready jobs of its namespace, highest priority first and
    then oldest, never more than its limit, and leases each to its owner
    until the database's now plus the lease."""
    low, high, mid = insert(later_db), insert(later_db, priority=9), insert(later_db, priority=5)
    newer_low = insert(later_db)
    insert(later_db, delay_ms=HOUR_MS)
    insert(later_db, namespace="other", priority=50)
    insert_child(later_db, low)
    before = db_now(later_db)
    first = claim(later_db, limit=2, owner="server-b", lease_ms=5_000)
    after = db_now(later_db)
    assert [job.id for job in first] == [high, mid]
    assert [job.id for job in claim(later_db, limit=5)] == [low, newer_low]
    assert claim(later_db, limit=5) == []
    job = first[0]
    row = job_row(later_db, high)
    assert isinstance(job, ClaimedJob)
    assert job == ClaimedJob(
        high, "conformance.Job", b"\x81\xa1n\x01", 1, None, row["created_ms"], row["run_at_ms"]
    )
    assert (row["stage"], row["attempts"], row["lease_owner"]) == ("running", 1, "server-b")
    assert before <= row["started_ms"] == row["changed_ms"] <= after
    assert before + 5_000 <= row["lease_expires_ms"] <= after + 5_000
    assert_counts(later_db)


def test_claim_pair_on_a_cursor_runs_everywhere_the_asyncio_pair_where_declared(later_db, dialect):
    """The claim and the batch completion run on a Django cursor on every
    vendor, in the caller's transaction (testing's drain()); their asyncio
    twins only where the dialect declares supports_async_connection."""
    job_id = insert(later_db)
    request = ClaimRequest(namespace=NS, owner=OWNER, limit=5, lease_ms=LEASE_MS)
    with cursor_of(later_db, atomic=True) as c:
        (job,) = dialect.jobs.job_claim(c, request)
        done = dialect.jobs.job_complete_many(
            c, owner=OWNER, jobs=[(job.id, job.attempts)], retention_ms=DAY_MS
        )
    assert (job.id, done.done_ids) == (job_id, [job_id])
    assert stages(later_db, job_id) == ["success"]
    assert_counts(later_db)
    if not dialect.supports_async_connection:
        with cursor_of(later_db) as c:
            with pytest.raises(NotImplementedError):
                asyncio.run(dialect.jobs.ajob_claim(c, request))
            with pytest.raises(NotImplementedError):
                asyncio.run(
                    dialect.jobs.ajob_complete_many(c, owner=OWNER, jobs=[], retention_ms=1)
                )


def test_complete_many_is_fenced_by_owner_and_attempt_per_claim(later_db, dialect):
    """Each claim of a batch succeeds only under its own owner and attempt;
    the waiting children of those that did become ready."""
    a, b, c_ = insert(later_db), insert(later_db), insert(later_db)
    claim(later_db, limit=3)
    child = insert_child(later_db, a)[0]
    assert complete(later_db, []) == Completion(done_ids=[], released=0)
    stranger = complete(later_db, [(a, 1), (b, 1)], owner="server-b")
    assert stranger == Completion(done_ids=[], released=0)
    before = db_now(later_db)
    done = complete(later_db, [(a, 1), (b, 2), (new_job_id(), 1)], retention_ms=HOUR_MS)
    after = db_now(later_db)
    assert done == Completion(done_ids=[a], released=1)
    assert stages(later_db, a, b, c_, child) == ["success", "running", "running", "enqueued"]
    row = job_row(later_db, a)
    assert before <= row["finished_ms"] == row["changed_ms"] <= after
    assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    assert before <= job_row(later_db, child)["run_at_ms"] <= after
    assert complete(later_db, [(a, 1)]).done_ids == [], "finished already"
    assert sorted(complete(later_db, [(b, 1), (c_, 1)]).done_ids) == sorted([b, c_])
    assert_counts(later_db)


# -- the worker's other writes, under the fence of a claim -----------------------------


def test_job_renew_extends_only_the_claims_still_held(later_db, dialect):
    """A renewal returns the claims its owner still holds, at the attempt
    held, and moves their leases to the database's now plus the lease."""
    a, b = insert(later_db), insert(later_db)
    claim(later_db, limit=2, lease_ms=1_000)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_renew(c, owner=OWNER, jobs=[], lease_ms=LEASE_MS) == []
        assert dialect.jobs.job_renew(c, owner="server-b", jobs=[(a, 1)], lease_ms=LEASE_MS) == []
        before = db_now(later_db)
        renewed = dialect.jobs.job_renew(
            c, owner=OWNER, jobs=[(a, 1), (b, 1), (a, 2), (new_job_id(), 1)], lease_ms=LEASE_MS
        )
        after = db_now(later_db)
    assert sorted(renewed) == sorted([Claim(a, 1), Claim(b, 1)])
    assert all(isinstance(held, Claim) for held in renewed)
    for job_id in (a, b):
        row = job_row(later_db, job_id)
        assert before + LEASE_MS <= row["lease_expires_ms"] <= after + LEASE_MS
        assert (row["stage"], row["attempts"]) == ("running", 1)
    assert_counts(later_db)


def test_job_unclaim_gives_a_claim_back_as_if_never_made(later_db, dialect):
    """Only the claim's own owner and attempt give it back: ready again,
    the attempt not counted, while attempts (the fence) keeps growing, so
    the given-back claim's writes never match the next claim."""
    job_id = insert(later_db)
    job = claim_one(later_db, job_id)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_unclaim(c, owned(job, owner="server-b")) is False
        assert (
            dialect.jobs.job_unclaim(c, OwnerFence(job_id=job_id, attempts=2, owner=OWNER)) is False
        )
        assert stages(later_db, job_id) == ["running"]
        assert dialect.jobs.job_unclaim(c, owned(job)) is True
        assert dialect.jobs.job_unclaim(c, owned(job)) is False
    row = job_row(later_db, job_id)
    assert (row["stage"], row["attempts"], row["uncounted"]) == ("enqueued", 1, 1)
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    again = claim_one(later_db, job_id)
    assert (again.attempts, again.attempt) == (2, 1)
    with cursor_of(later_db) as c:
        stale = [(job_id, job.attempts)]
        assert dialect.jobs.job_renew(c, owner=OWNER, jobs=stale, lease_ms=LEASE_MS) == []
        assert dialect.jobs.job_unclaim(c, owned(job)) is False
    assert stages(later_db, job_id) == ["running"]
    assert_counts(later_db)


def test_job_claimed_since_lists_an_owners_recent_running_plain_claims(later_db, dialect):
    """What a claim abandoned mid-statement may have taken: the running
    plain jobs of one owner claimed within the window, by the database's
    clock."""
    old, recent = insert(later_db), insert(later_db)
    first = claim_one(later_db, old)
    age(later_db, "started_ms", old, 60_000)
    second = claim_one(later_db, recent)
    claim(later_db, owner="server-b", limit=5)  # nothing left
    insert_partitioned(later_db)
    claim_head(later_db, OWNER)  # a partition job: not the plain claim's
    with cursor_of(later_db) as c:
        within = dialect.jobs.job_claimed_since(c, namespace=NS, owner=OWNER, within_ms=30_000)
        assert within == [(recent, second.attempts)]
        both = dialect.jobs.job_claimed_since(c, namespace=NS, owner=OWNER, within_ms=120_000)
        assert sorted(both) == sorted([(old, first.attempts), (recent, second.attempts)])
        assert (
            dialect.jobs.job_claimed_since(c, namespace=NS, owner="server-b", within_ms=120_000)
            == []
        )
        assert (
            dialect.jobs.job_claimed_since(c, namespace="other", owner=OWNER, within_ms=120_000)
            == []
        )


def test_job_stage_after_tells_where_a_claim_left_its_job(later_db, dialect):
    """None while the claim runs or once a later claim took the job; else
    the stage its outcome stored."""
    job_id = insert(later_db)
    first = claim_one(later_db, job_id)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_stage_after(c, (job_id, first.attempts)) is None  # running
    with cursor_of(later_db, atomic=True) as c:
        retry = RetryWrite(delay_ms=0, error="x", retry_policy=None)
        assert dialect.jobs.job_retry(c, owned(first), retry)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_stage_after(c, (job_id, first.attempts)) == "requeued"
        dialect.jobs.job_promote_due(c, namespace=NS, limit=10)
    second = claim_one(later_db, job_id)
    assert complete(later_db, [(job_id, second.attempts)]).done_ids == [job_id]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_stage_after(c, (job_id, first.attempts)) is None  # taken again
        assert dialect.jobs.job_stage_after(c, (job_id, second.attempts)) == "success"
        assert dialect.jobs.job_stage_after(c, ("0" * 26, 1)) is None


def test_job_retry_requeues_under_the_owner_or_expiry_fence(later_db, dialect):
    """A retry needs the claim's owner and attempt, or (the rescuer) a lease
    expired long enough; it is due its delay after the database's now."""
    job_id = insert(later_db, retry_policy='{"old": 1}')
    job = claim_one(later_db, job_id)
    retry = RetryWrite(delay_ms=HOUR_MS, error="boom", retry_policy='{"new": 2}')

    def write(fence: OwnerFence | ExpiredFence, write: RetryWrite = retry) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.jobs.job_retry(c, fence, write)

    stale = OwnerFence(job_id=job_id, attempts=2, owner=OWNER)
    assert [write(owned(job, owner="server-b")), write(stale)] == [False, False]
    before = db_now(later_db)
    assert write(owned(job)) is True
    after = db_now(later_db)
    assert write(owned(job)) is False, "no longer running"
    row = job_row(later_db, job_id)
    assert (row["stage"], row["last_error"], row["retry_policy"]) == (
        "requeued",
        "boom",
        '{"new": 2}',
    )
    assert (row["lease_owner"], row["lease_expires_ms"]) == (None, None)
    assert before + HOUR_MS <= row["run_at_ms"] <= after + HOUR_MS
    assert before <= row["changed_ms"] <= after

    # The rescuer: a lease renewed meanwhile is left alone.
    age(later_db, "run_at_ms", job_id, 2 * HOUR_MS)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 1
    again = claim_one(later_db, job_id)
    assert again.attempts == 2
    rescue = ExpiredFence(job_id=job_id, attempts=2, expired_for_ms=10_000)
    keep = RetryWrite(delay_ms=0, error="lease expired")
    assert write(rescue, keep) is False
    age(later_db, "lease_expires_ms", job_id, LEASE_MS + 20_000)
    assert write(ExpiredFence(job_id=job_id, attempts=1, expired_for_ms=10_000), keep) is False
    assert write(rescue, keep) is True
    row = job_row(later_db, job_id)
    assert (row["stage"], row["retry_policy"]) == ("requeued", '{"new": 2}'), "policy kept"
    assert_counts(later_db)


def test_job_fail_descendants_fails_every_waiting_generation_and_nothing_else(later_db, dialect):
    """The waiting continuations of a job, and theirs, fail as "parent
    failed"; the job itself and another job's continuation do not change."""
    parent = insert(later_db)
    child, _ = insert_child(later_db, parent)
    grandchild, _ = insert_child(later_db, child)
    other = insert(later_db)
    other_child, _ = insert_child(later_db, other)
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_fail_descendants(c, job_id=parent, retention_ms=DAY_MS)
    assert stages(later_db, parent, child, grandchild, other_child) == [
        "enqueued",
        "failed",
        "failed",
        "waiting",
    ]
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    assert_counts(later_db)


def test_job_fail_fails_the_claim_and_its_waiting_descendants(later_db, dialect):
    """A failure is fenced as a retry is, and fails every waiting descendant
    with "parent failed"."""
    job_id, other = insert(later_db), insert(later_db)
    job, rescued = claim(later_db, limit=2)
    child = insert_child(later_db, job_id)[0]
    grandchild = insert_child(later_db, child)[0]
    failure = FailureWrite(error="boom", retention_ms=HOUR_MS)

    def write(fence: OwnerFence | ExpiredFence) -> bool:
        with cursor_of(later_db, atomic=True) as c:
            return dialect.jobs.job_fail(c, fence, failure)

    assert write(owned(job, owner="server-b")) is False
    assert write(OwnerFence(job_id=job.id, attempts=2, owner=OWNER)) is False
    assert write(ExpiredFence(job_id=rescued.id, attempts=1, expired_for_ms=0)) is False
    assert stages(later_db, job_id, child, grandchild) == ["running", "waiting", "waiting"]
    before = db_now(later_db)
    assert write(owned(job)) is True
    after = db_now(later_db)
    assert stages(later_db, job_id, child, grandchild) == ["failed", "failed", "failed"]
    row = job_row(later_db, job_id)
    assert (row["last_error"], row["lease_owner"], row["lease_expires_ms"]) == ("boom", None, None)
    assert before <= row["finished_ms"] == row["changed_ms"] <= after
    assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    age(later_db, "lease_expires_ms", rescued.id, LEASE_MS + 1)
    assert write(ExpiredFence(job_id=rescued.id, attempts=1, expired_for_ms=0)) is True
    assert stages(later_db, other) == ["failed"]
    assert_counts(later_db)


# -- maintenance --------------------------------------------------------------------------


def test_job_promote_due_makes_due_jobs_ready(later_db, dialect):
    """Delayed and requeued jobs whose time came become ready, at most
    ``limit`` a call; those not due yet wait."""
    due = [insert(later_db, delay_ms=HOUR_MS) for _ in range(3)]
    later_one = insert(later_db, delay_ms=HOUR_MS)
    requeued = insert(later_db)
    job = claim_one(later_db, requeued)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry(c, owned(job), RetryWrite(delay_ms=HOUR_MS, error="x"))
    for job_id in (*due, requeued):
        age(later_db, "run_at_ms", job_id, 2 * HOUR_MS)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_promote_due(c, namespace="other", limit=10) == 0
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=2) == 2
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 2
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 0
    assert stages(later_db, *due, requeued, later_one) == ["enqueued"] * 4 + ["delayed"]
    assert_counts(later_db)


def test_job_stuck_lists_running_jobs_whose_lease_expired_long_enough(later_db, dialect):
    """Only running jobs whose lease expired at least the grace ago, on the
    database's clock, oldest lease first."""
    a, b, c_ = insert(later_db), insert(later_db), insert(later_db)
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_job SET retry_policy = %s WHERE id = %s", ['{"max": 1}', b])
    claim(later_db, limit=3)
    # b was claimed twice, the first claim given back: one attempt counted.
    later_db.execute("UPDATE later_job SET attempts = 2, uncounted = 1 WHERE id = %s", [b])
    age(later_db, "lease_expires_ms", a, LEASE_MS + 20_000)
    age(later_db, "lease_expires_ms", b, LEASE_MS + 40_000)
    age(later_db, "lease_expires_ms", c_, LEASE_MS - 5_000)
    with cursor_of(later_db) as c:
        stuck = dialect.jobs.job_stuck(c, namespace=NS, expired_for_ms=10_000, limit=10)
        assert dialect.jobs.job_stuck(c, namespace=NS, expired_for_ms=10_000, limit=1) == stuck[:1]
        assert dialect.jobs.job_stuck(c, namespace=NS, expired_for_ms=60_000, limit=10) == []
        assert dialect.jobs.job_stuck(c, namespace="other", expired_for_ms=0, limit=10) == []
    assert stuck == [
        StuckJob(
            id=b, type_name="conformance.Job", attempts=2, retry_policy='{"max": 1}', attempt=1
        ),
        StuckJob(id=a, type_name="conformance.Job", attempts=1, retry_policy=None, attempt=1),
    ]


def test_job_orphans_are_resolved_by_their_parents_end(later_db, dialect):
    """Waiting children of a finished or vanished parent are orphans: a
    succeeded parent's is released, the others' fail with their descendants."""
    parents = [insert(later_db) for _ in range(4)]
    claim(later_db, limit=4)
    children = [insert_child(later_db, parent)[0] for parent in parents]
    grandchild = insert_child(later_db, children[1])[0]
    with cursor_of(later_db) as c:
        c.execute(
            "UPDATE later_job SET stage = 'success', lease_owner = NULL, "
            "lease_expires_ms = NULL WHERE id = %s",
            [parents[0]],
        )
        c.execute("DELETE FROM later_job WHERE id = %s", [parents[1]])
        c.execute(
            "UPDATE later_job SET stage = 'failed', lease_owner = NULL, "
            "lease_expires_ms = NULL WHERE id = %s",
            [parents[2]],
        )
    with cursor_of(later_db) as c:
        orphans = dialect.jobs.job_orphans(c, namespace=NS, limit=10)
        assert dialect.jobs.job_orphans(c, namespace="other", limit=10) == []
        assert len(dialect.jobs.job_orphans(c, namespace=NS, limit=1)) == 1
    assert sorted(orphans, key=lambda o: o.job_id) == sorted(
        [
            Orphan(job_id=children[0], parent_stage="success"),
            Orphan(job_id=children[1], parent_stage=None),
            Orphan(job_id=children[2], parent_stage="failed"),
        ],
        key=lambda o: o.job_id,
    )
    before = db_now(later_db)
    for orphan in orphans:
        with cursor_of(later_db, atomic=True) as c:
            dialect.jobs.job_resolve_orphan(c, orphan, retention_ms=HOUR_MS)
    after = db_now(later_db)
    assert stages(later_db, *children, grandchild) == [
        "enqueued",
        "failed",
        "failed",
        "waiting",
        "failed",
    ]
    assert before <= job_row(later_db, children[0])["run_at_ms"] <= after
    reasons = [job_row(later_db, job_id)["last_error"] for job_id in (*children[1:3], grandchild)]
    assert reasons == ["parent missing", PARENT_FAILED, PARENT_FAILED]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_orphans(c, namespace=NS, limit=10) == []
    assert_counts(later_db)


def test_job_prune_deletes_finished_jobs_past_their_retention(later_db, dialect):
    """Only finished jobs whose expiry passed go, at most ``limit`` a call,
    and the task results of those that go with them."""
    gone = [insert(later_db) for _ in range(3)]
    kept, running = insert(later_db), insert(later_db)
    claim(later_db, limit=5)
    for job_id in (gone[0], kept):
        with cursor_of(later_db) as c:
            end = TaskAttemptEnd(
                job_id=job_id, attempt=1, earlier_workers="[", errors="[]", return_value="1"
            )
            assert dialect.jobs.task_result_save(c, end)
    ready = insert(later_db)
    assert len(complete(later_db, [(job_id, 1) for job_id in gone], retention_ms=0).done_ids) == 3
    assert complete(later_db, [(kept, 1)], retention_ms=HOUR_MS).done_ids == [kept]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_prune(c, namespace="other", limit=10) == 0
        assert dialect.jobs.job_prune(c, namespace=NS, limit=2) == 2
        assert dialect.jobs.job_prune(c, namespace=NS, limit=10) == 1
        assert dialect.jobs.job_prune(c, namespace=NS, limit=10) == 0
    remaining = {str(r[0]) for r in later_db.rows("SELECT id FROM later_job")}
    assert remaining == {kept, running, ready}
    assert later_db.rows("SELECT job_id FROM later_task_result") == [(kept,)]
    assert_counts(later_db)


def test_task_result_save_stores_an_attempts_end_fenced_by_the_attempt(later_db, dialect):
    """One statement: the worker ids before it plus the lease holder's, the
    errors and the return value; nothing for an attempt the job is past."""
    job_id = insert(later_db)
    claim_one(later_db, job_id)

    def save(attempt: int, earlier: str, errors: str, value: str | None) -> bool:
        with cursor_of(later_db) as c:
            end = TaskAttemptEnd(
                job_id=job_id, attempt=attempt, earlier_workers=earlier, errors=errors,
                return_value=value,
            )  # fmt: skip
            return dialect.jobs.task_result_save(c, end)

    def row() -> tuple[object, ...]:
        sql = "SELECT worker_ids, errors, return_value FROM later_task_result WHERE job_id = %s"
        return later_db.rows(sql, [job_id])[0]

    assert save(1, "[", '[{"e": 1}]', None) is True
    assert row() == (f'["{OWNER}"]', '[{"e": 1}]', None)
    assert save(1, '["a", "b",', "[]", '{"x": 2}') is True  # an upsert
    assert json.loads(str(row()[0])) == ["a", "b", OWNER] and row()[2] == '{"x": 2}'
    assert save(2, "[", "[]", "3") is False, "the job is at attempt 1"
    assert row()[2] == '{"x": 2}'
    assert (
        save(1, "[", "[]", None) is True
        and later_db.scalar("SELECT COUNT(*) FROM later_task_result") == 1
    )


# -- wake-ups and counters -----------------------------------------------------------------


def test_job_ready_exists_sees_only_ready_jobs_of_its_namespace(later_db, dialect):
    def ready() -> bool:
        with cursor_of(later_db) as c:
            return dialect.jobs.job_ready_exists(c, namespace=NS)

    assert ready() is False
    insert(later_db, delay_ms=HOUR_MS)
    insert(later_db, namespace="other")
    assert ready() is False
    job_id = insert(later_db)
    assert ready() is True
    claim_one(later_db, job_id)
    assert ready() is False


def test_stage_counts_has_every_stage_and_counter_compact_keeps_them(later_db, dialect):
    """Counts cover every stage, zero included, and stay exact when the
    counter rows are folded together (into at most one row a stage)."""
    with cursor_of(later_db) as c:
        assert dialect.reads.stage_counts(c, namespace=NS) == dict.fromkeys(Stage.values, 0)
    ids = [insert(later_db) for _ in range(6)] + [insert(later_db, namespace="other")]
    claim(later_db, limit=4)
    complete(later_db, [(ids[0], 1), (ids[1], 1)])
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_cancel(c, namespace=NS, job_id=ids[5], retention_ms=1)
    assert_counts(later_db)
    with cursor_of(later_db, atomic=True) as c:
        c.execute("SELECT COUNT(*) FROM later_stage_count WHERE namespace = %s", [NS])
        rows_before = int(c.fetchone()[0])
        folded = dialect.jobs.counter_compact(c, namespace=NS)
    rows_after = int(
        later_db.scalar(  # type: ignore[arg-type]
            "SELECT COUNT(*) FROM later_stage_count WHERE namespace = %s", [NS]
        )
    )
    # One row per stage and lane at most: folded only beyond that.
    assert folded == (rows_before if rows_before > 2 * len(Stage) else 0)
    assert rows_after <= (len(Stage) if folded else 2 * len(Stage))
    with cursor_of(later_db) as c:
        assert dialect.reads.stage_counts(c, namespace=NS) == {
            **dict.fromkeys(Stage.values, 0),
            "success": 2,
            "running": 2,
            "enqueued": 1,
            "cancelled": 1,
        }
    assert_counts(later_db)


# -- servers, maintenance, topics, leases --------------------------------------------------


def server_row(later_db, server_id: str) -> tuple[Any, ...] | None:
    rows = later_db.rows(
        "SELECT namespace, hostname, pid, workers, started_ms, heartbeat_ms "
        "FROM later_server WHERE id = %s",
        [server_id],
    )
    return rows[0] if rows else None


def test_server_heartbeat_registers_then_refreshes(later_db, dialect):
    """The first heartbeat registers the server; later ones move its
    heartbeat and worker count on, on the database's clock."""
    beat = Heartbeat(server_id="s1", namespace=NS, hostname="host-a", pid=41, workers=4)
    before = db_now(later_db)
    with cursor_of(later_db) as c:
        dialect.cluster.server_heartbeat(c, beat)
    after = db_now(later_db)
    first = server_row(later_db, "s1")
    assert first is not None and first[:4] == (NS, "host-a", 41, 4)
    assert before <= first[4] == first[5] <= after
    age_by = 5_000
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_server SET heartbeat_ms = heartbeat_ms - %s", [age_by])
        dialect.cluster.server_heartbeat(
            c, Heartbeat(server_id="s1", namespace=NS, hostname="renamed", pid=7, workers=9)
        )
    second = server_row(later_db, "s1")
    assert second is not None and second[:5] == (NS, "host-a", 41, 9, first[4])
    assert second[5] >= before


def test_server_prune_and_remove(later_db, dialect):
    """Servers silent longer than the limit are pruned in their namespace;
    a server leaving removes itself."""
    with cursor_of(later_db) as c:
        for server_id, namespace in (("live", NS), ("silent", NS), ("away", "other")):
            beat = Heartbeat(
                server_id=server_id, namespace=namespace, hostname="h", pid=1, workers=1
            )
            dialect.cluster.server_heartbeat(c, beat)
        c.execute(
            "UPDATE later_server SET heartbeat_ms = heartbeat_ms - %s WHERE id <> 'live'",
            [60_000],
        )
        assert dialect.cluster.server_prune(c, namespace=NS, silent_for_ms=30_000) == 1
        assert dialect.cluster.server_prune(c, namespace=NS, silent_for_ms=30_000) == 0
        assert server_row(later_db, "silent") is None
        assert server_row(later_db, "away") is not None
        dialect.cluster.server_remove(c, server_id="live")
        assert server_row(later_db, "live") is None


def test_maintenance_claim_runs_a_step_once_per_interval(later_db, dialect):
    """A step runs once per interval across a namespace, on the database's clock."""

    def claim_step(namespace: str = NS, step: str = "vacuum", interval_ms: int = HOUR_MS) -> bool:
        with cursor_of(later_db) as c:
            return dialect.cluster.maintenance_claim(
                c, namespace=namespace, step=step, interval_ms=interval_ms
            )

    before = db_now(later_db)
    assert claim_step() is True
    after = db_now(later_db)
    assert claim_step() is False
    assert [claim_step(namespace="other"), claim_step(step="other")] == [True, True]
    last_run = later_db.scalar(
        "SELECT last_run_ms FROM later_maintenance WHERE namespace = %s AND step = 'vacuum'",
        [NS],
    )
    assert before <= last_run <= after  # type: ignore[operator]
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_maintenance SET last_run_ms = last_run_ms - %s", [2 * HOUR_MS])
    assert claim_step() is True


def test_topic_register_once_and_partitions(later_db, dialect):
    """A topic is registered once; its partition count is never changed by
    registering it again."""
    with cursor_of(later_db) as c:
        assert dialect.partitions.topic_partitions(c, namespace=NS) == {}
        assert (
            dialect.partitions.topic_register(c, namespace=NS, name="orders", partitions=4) is True
        )
        assert (
            dialect.partitions.topic_register(c, namespace=NS, name="orders", partitions=8) is False
        )
        assert (
            dialect.partitions.topic_register(c, namespace=NS, name="events", partitions=1) is True
        )
        assert dialect.partitions.topic_partitions(c, namespace=NS) == {"orders": 4, "events": 1}
        # Another namespace registers its own.
        assert (
            dialect.partitions.topic_register(c, namespace="other", name="orders", partitions=2)
            is True
        )
        assert dialect.partitions.topic_partitions(c, namespace="other") == {"orders": 2}


def test_lease_acquire_and_release_one_holder_at_a_time(later_db, dialect):
    """One holder at a time, until the database's now plus the lease; the
    holder renews at its epoch, each new holder gets a higher one, and only
    the (owner, epoch) holding it lets it go."""

    def acquire(owner: str, name: str = "sampler") -> int | None:
        request = LeaseRequest(namespace=NS, name=name, owner=owner, ttl_ms=LEASE_MS)
        with cursor_of(later_db, atomic=True) as c:
            return dialect.cluster.lease_acquire(c, request)

    def release(owner: str, epoch: int) -> bool:
        lease = HeldLease(namespace=NS, name="sampler", owner=owner, epoch=epoch)
        with cursor_of(later_db) as c:
            return dialect.cluster.lease_release(c, lease)

    def expires() -> int:
        return int(later_db.scalar("SELECT expires_ms FROM later_lease WHERE name = 'sampler'"))  # type: ignore[arg-type]

    before = db_now(later_db)
    assert acquire("a") == 1
    after = db_now(later_db)
    assert before + LEASE_MS <= expires() <= after + LEASE_MS
    assert acquire("b") is None
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_lease SET expires_ms = expires_ms - %s", [10_000])
    assert acquire("a") == 1, "the holder renews and keeps its epoch"
    assert expires() >= before + LEASE_MS
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_lease SET expires_ms = expires_ms - %s", [2 * LEASE_MS])
    assert acquire("b") == 2
    assert acquire("a") is None
    assert [release("a", 1), release("b", 1)] == [False, False]
    assert release("b", 2) is True
    assert acquire("a") == 3, "released: free at once, still a higher epoch"
    assert acquire("b", name="other") == 1


# -- schedules ------------------------------------------------------------------------------

CRON = "0 3 * * *"
ZONE = "Europe/Paris"
SCHEDULE_COLUMNS = (
    "cron",
    "zone",
    "type_name",
    "payload",
    "priority",
    "retry_policy",
    "next_run_ms",
    "last_job_id",
    "last_run_ms",
    "version",
    "created_ms",
    "changed_ms",
)


def schedule_write(identifier: str = "nightly", **fields: Any) -> ScheduleWrite:
    """A schedule of ``NS`` (or ``namespace``) whose first occurrence is a new job."""
    namespace = fields.pop("namespace", NS)
    values: dict[str, Any] = {
        "key": ScheduleKey(namespace=namespace, identifier=identifier),
        "cron": CRON,
        "zone": ZONE,
        "type_name": "conformance.Job",
        "payload": b"\x81\xa1n\x01",
        "priority": 0,
        "retry_policy": None,
        "first_job_id": new_job_id(),
        "first_run_ms": 1_000 * DAY_MS,
        "next_run_ms": 1_001 * DAY_MS,
    }
    return ScheduleWrite(**{**values, **fields})


def save_schedule(later_db, write: ScheduleWrite) -> bool:
    with cursor_of(later_db, atomic=True) as c:
        return dialect_for(later_db.alias).schedules.schedule_save(c, write)


def schedule_row(later_db, key: ScheduleKey) -> dict[str, Any] | None:
    rows = later_db.rows(
        f"SELECT {', '.join(SCHEDULE_COLUMNS)} FROM later_schedule "
        "WHERE namespace = %s AND identifier = %s",
        [key.namespace, key.identifier],
    )
    if not rows:
        return None
    row = dict(zip(SCHEDULE_COLUMNS, rows[0], strict=True))
    row["payload"] = bytes(row["payload"])
    return row


def due_schedules(later_db, *, namespace: str = NS, ahead_ms: int = 0) -> list[DueSchedule]:
    with cursor_of(later_db) as c:
        return dialect_for(later_db.alias).schedules.schedule_due(
            c, namespace=namespace, ahead_ms=ahead_ms
        )


def insert_occurrence(later_db, recurring: str, run_at_ms: int, **fields: Any) -> str:
    job = new_job(run_at_ms=run_at_ms, **fields)
    with cursor_of(later_db, atomic=True) as c:
        dialect_for(later_db.alias).schedules.job_insert_occurrence(c, job, recurring)
    return job.id


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


def test_schedule_save_registers_updates_in_place_or_restarts(later_db, dialect):
    """A new key is registered at its first occurrence. The same cron and
    zone again update the payload and options in place and keep the
    schedule's place; another cron or zone restart it at the caller's first
    occurrence. Every write adds one to the version; namespaces are apart."""
    key = ScheduleKey(namespace=NS, identifier="nightly")
    first = schedule_write(priority=2, retry_policy='{"max": 2}')
    before = db_now(later_db)
    assert save_schedule(later_db, first) is True
    after = db_now(later_db)
    row = schedule_row(later_db, key)
    assert row is not None
    assert before <= row["created_ms"] == row["changed_ms"] <= after
    assert row == {
        "cron": CRON,
        "zone": ZONE,
        "type_name": "conformance.Job",
        "payload": b"\x81\xa1n\x01",
        "priority": 2,
        "retry_policy": '{"max": 2}',
        "next_run_ms": first.next_run_ms,
        "last_job_id": first.first_job_id,
        "last_run_ms": first.first_run_ms,
        "version": 1,
        "created_ms": row["created_ms"],
        "changed_ms": row["created_ms"],
    }
    created = row["created_ms"]

    with cursor_of(later_db) as c:
        c.execute("UPDATE later_schedule SET changed_ms = changed_ms - %s", [HOUR_MS])
    updated = schedule_write(
        type_name="conformance.Other",
        payload=b"\x00new",
        priority=7,
        retry_policy=None,
        first_run_ms=2_000 * DAY_MS,
        next_run_ms=2_001 * DAY_MS,
    )
    before = db_now(later_db)
    assert save_schedule(later_db, updated) is False
    after = db_now(later_db)
    row = schedule_row(later_db, key)
    assert row is not None
    assert before <= row["changed_ms"] <= after
    assert row == {
        "cron": CRON,
        "zone": ZONE,
        "type_name": "conformance.Other",
        "payload": b"\x00new",
        "priority": 7,
        "retry_policy": None,
        "next_run_ms": first.next_run_ms,
        "last_job_id": first.first_job_id,
        "last_run_ms": first.first_run_ms,
        "version": 2,
        "created_ms": created,
        "changed_ms": row["changed_ms"],
    }

    for version, change in ((3, {"cron": "*/5 * * * *"}), (4, {"zone": "UTC"})):
        restart = schedule_write(
            **change, first_run_ms=(3 + version) * DAY_MS, next_run_ms=(4 + version) * DAY_MS
        )
        assert save_schedule(later_db, restart) is True, change
        row = schedule_row(later_db, key)
        assert row is not None
        assert (row["cron"], row["zone"]) == (restart.cron, restart.zone)
        assert (row["next_run_ms"], row["last_job_id"], row["last_run_ms"], row["version"]) == (
            restart.next_run_ms,
            restart.first_job_id,
            restart.first_run_ms,
            version,
        )
        assert row["created_ms"] == created

    kept = schedule_row(later_db, key)
    assert kept is not None
    elsewhere = schedule_write(namespace="other", cron=kept["cron"], zone=kept["zone"])
    assert save_schedule(later_db, elsewhere) is True, "another namespace's schedule is new"
    assert schedule_row(later_db, key) == kept
    other = schedule_row(later_db, elsewhere.key)
    assert other is not None
    assert (other["version"], other["last_job_id"]) == (1, elsewhere.first_job_id)


def test_schedule_remove_removes_only_its_key_once(later_db, dialect):
    for namespace, identifier in ((NS, "a"), (NS, "b"), ("other", "a")):
        assert save_schedule(later_db, schedule_write(identifier, namespace=namespace))

    def remove(identifier: str, namespace: str = NS) -> bool:
        with cursor_of(later_db) as c:
            return dialect.schedules.schedule_remove(
                c, ScheduleKey(namespace=namespace, identifier=identifier)
            )

    assert [remove("a"), remove("a"), remove("missing"), remove("b", namespace="third")] == [
        True,
        False,
        False,
        False,
    ]
    remaining = later_db.rows(
        "SELECT namespace, identifier FROM later_schedule ORDER BY namespace, identifier"
    )
    assert [tuple(r) for r in remaining] == [(NS, "b"), ("other", "a")]


def test_schedule_list_shows_a_namespace_by_identifier_without_payloads(later_db, dialect):
    writes = [
        schedule_write("weekly", cron="0 0 * * 1", zone="UTC", priority=3),
        schedule_write("daily", type_name="conformance.Daily", retry_policy='{"max": 1}'),
        schedule_write("hourly", cron="0 * * * *", next_run_ms=5 * DAY_MS),
    ]
    for write in (*writes, schedule_write("another", namespace="other")):
        assert save_schedule(later_db, write)
    with cursor_of(later_db) as c:
        listed = dialect.schedules.schedule_list(c, namespace=NS)
        assert dialect.schedules.schedule_list(c, namespace="third") == []
        assert [
            info.identifier for info in dialect.schedules.schedule_list(c, namespace="other")
        ] == ["another"]
    expected = [
        ScheduleInfo(
            identifier=write.key.identifier,
            cron=write.cron,
            zone=write.zone,
            type_name=write.type_name,
            priority=write.priority,
            next_run_ms=write.next_run_ms,
            last_job_id=write.first_job_id,
            last_run_ms=write.first_run_ms,
        )
        for write in sorted(writes, key=lambda w: w.key.identifier)
    ]
    assert listed == expected
    assert not any(hasattr(info, "payload") for info in listed)


def test_schedule_due_reads_what_is_owed_soon_most_overdue_first(later_db, dialect):
    """Only schedules of the namespace due by the database's now plus
    ``ahead_ms``, the most overdue first, each at the version it was read at
    and with the database's now of the read."""
    now = db_now(later_db)
    owed = {
        "hour-late": now - HOUR_MS,
        "minute-late": now - 60_000,
        "in-a-minute": now + 60_000,
        "in-an-hour": now + HOUR_MS,
    }
    for identifier, next_run_ms in owed.items():
        assert save_schedule(later_db, schedule_write(identifier, next_run_ms=next_run_ms))
    assert save_schedule(later_db, schedule_write("elsewhere", namespace="other", next_run_ms=0))
    bumped = schedule_write("minute-late", priority=4, payload=b"\x01")
    assert save_schedule(later_db, bumped) is False

    before = db_now(later_db)
    due = due_schedules(later_db, ahead_ms=2 * 60_000)
    after = db_now(later_db)
    assert [s.key.identifier for s in due] == ["hour-late", "minute-late", "in-a-minute"]
    assert len({s.now_ms for s in due}) == 1, "one clock for the whole read"
    assert before <= due[0].now_ms <= after
    assert due[1] == DueSchedule(
        key=ScheduleKey(namespace=NS, identifier="minute-late"),
        cron=CRON,
        zone=ZONE,
        type_name="conformance.Job",
        payload=b"\x01",
        priority=4,
        retry_policy=None,
        next_run_ms=owed["minute-late"],
        version=2,
        now_ms=due[0].now_ms,
    )
    assert type(due[1].payload) is bytes
    assert [s.version for s in due] == [1, 2, 1]
    assert [s.key.identifier for s in due_schedules(later_db)] == ["hour-late", "minute-late"]
    assert len(due_schedules(later_db, ahead_ms=2 * HOUR_MS)) == 4
    [elsewhere] = due_schedules(later_db, namespace="other")
    assert elsewhere.key == ScheduleKey(namespace="other", identifier="elsewhere")

    for n in range(DUE_BATCH + 1):
        assert save_schedule(later_db, schedule_write(f"s{n:03}", namespace="third", next_run_ms=n))
    batch = due_schedules(later_db, namespace="third")
    assert [s.next_run_ms for s in batch] == list(range(DUE_BATCH))


def test_schedule_advance_is_a_compare_and_swap_on_the_version(later_db, dialect):
    """A schedule moves on only from the version it was read at, once; a
    stale read changes nothing. Where rows are locked, a row another
    transaction holds is skipped at once, not waited for."""
    key = ScheduleKey(namespace=NS, identifier="nightly")
    assert save_schedule(later_db, schedule_write(next_run_ms=0))
    assert save_schedule(later_db, schedule_write(namespace="other", next_run_ms=0))
    [stale] = due_schedules(later_db)
    assert save_schedule(later_db, schedule_write(priority=1)) is False, "a write meanwhile"
    [read] = due_schedules(later_db)
    assert (stale.version, read.version) == (1, 2)

    def advance(version: int, key: ScheduleKey = key, next_run_ms: int = DAY_MS) -> bool:
        step = ScheduleAdvance(
            key=key,
            version=version,
            next_run_ms=next_run_ms,
            last_job_id=job_id,
            last_run_ms=next_run_ms - HOUR_MS,
        )
        with cursor_of(later_db, atomic=True) as c:
            return dialect.schedules.schedule_advance(c, step)

    job_id = new_job_id()
    untouched = schedule_row(later_db, key)
    elsewhere = schedule_row(later_db, ScheduleKey(namespace="other", identifier="nightly"))
    assert advance(stale.version) is False
    assert advance(read.version, key=ScheduleKey(namespace="third", identifier="nightly")) is False
    assert schedule_row(later_db, key) == untouched

    with cursor_of(later_db) as c:
        c.execute(
            "UPDATE later_schedule SET changed_ms = changed_ms - %s WHERE namespace = %s",
            [HOUR_MS, NS],
        )
    before = db_now(later_db)
    assert advance(read.version) is True
    after = db_now(later_db)
    assert advance(read.version, next_run_ms=2 * DAY_MS) is False, "moved on already"
    row = schedule_row(later_db, key)
    assert row is not None and untouched is not None
    assert (row["next_run_ms"], row["last_job_id"], row["last_run_ms"], row["version"]) == (
        DAY_MS,
        job_id,
        DAY_MS - HOUR_MS,
        3,
    )
    assert before <= row["changed_ms"] <= after
    assert row["payload"] == untouched["payload"] and row["priority"] == 1
    assert schedule_row(later_db, ScheduleKey(namespace="other", identifier="nightly")) == elsewhere

    if not dialect.vendor_sql.skip_locked:
        return  # the database takes one writer at a time: no row lock to skip
    with psycopg.connect(**connect_kwargs(later_db.alias)) as holder:
        holder.execute(
            "SELECT id FROM later_schedule WHERE namespace = %s AND identifier = %s FOR UPDATE",
            [NS, "nightly"],
        )
        with cursor_of(later_db, atomic=True) as c:
            # Waiting for the lock would raise instead of returning False.
            c.execute("SET LOCAL lock_timeout = '5s'")
            locked = ScheduleAdvance(
                key=key, version=3, next_run_ms=2 * DAY_MS, last_job_id=job_id, last_run_ms=0
            )
            assert dialect.schedules.schedule_advance(c, locked) is False
        holder.rollback()
    assert schedule_row(later_db, key) == row
    assert advance(3, next_run_ms=2 * DAY_MS) is True, "free again"
    assert (schedule_row(later_db, key) or {}).get("version") == 4


def test_job_insert_occurrence_is_due_at_its_exact_fire_time(later_db, dialect):
    """An occurrence keeps its fire time even when that is past (then it is
    ready at once), is delayed when it is still to come, and names its
    schedule; its times are the database's."""
    now = db_now(later_db)
    past = new_job(run_at_ms=now - HOUR_MS, priority=3, retry_policy='{"max": 2}')
    future = new_job(run_at_ms=now + HOUR_MS, type_name="conformance.Other", payload=b"")
    elsewhere = new_job(namespace="other", run_at_ms=now - 1)
    before = db_now(later_db)
    with cursor_of(later_db, atomic=True) as c:
        written = [
            dialect.schedules.job_insert_occurrence(c, past, "nightly"),
            dialect.schedules.job_insert_occurrence(c, future, "nightly"),
            dialect.schedules.job_insert_occurrence(c, elsewhere, "hourly"),
        ]
    after = db_now(later_db)
    assert written == ["enqueued", "delayed", "enqueued"]
    rows = {job.id: job_row(later_db, job.id) for job in (past, future, elsewhere)}
    for row, stage in zip(rows.values(), written, strict=True):
        assert row["stage"] == stage
        assert before <= row["created_ms"] == row["changed_ms"] <= after
        assert row["history"] == f"{stage}@{row['created_ms']};"
        assert (row["attempts"], row["lease_owner"], row["parent_id"]) == (0, None, None)
        assert (row["finished_ms"], row["expires_ms"]) == (None, None)
    assert rows[past.id]["run_at_ms"] == now - HOUR_MS, "not moved to now"
    assert rows[future.id]["run_at_ms"] == now + HOUR_MS
    assert rows[elsewhere.id]["run_at_ms"] == now - 1
    assert (rows[past.id]["priority"], rows[past.id]["retry_policy"]) == (3, '{"max": 2}')
    stored = {
        str(r[0]): (r[1], r[2], r[3], bytes(r[4]))
        for r in later_db.rows("SELECT id, namespace, recurring, type_name, payload FROM later_job")
    }
    assert stored == {
        past.id: (NS, "nightly", "conformance.Job", past.payload),
        future.id: (NS, "nightly", "conformance.Other", b""),
        elsewhere.id: ("other", "hourly", "conformance.Job", elsewhere.payload),
    }
    assert claim_one(later_db, past.id).run_at_ms == now - HOUR_MS
    assert_counts(later_db)


def test_job_cancel_occurrences_cancels_only_its_schedules_delayed_ones(later_db, dialect):
    """Occurrences of the key enqueued ahead (delayed) are cancelled, kept
    for the retention; ready or running ones, other schedules', other
    namespaces' and plain delayed jobs are not."""
    now = db_now(later_db)
    ahead = [insert_occurrence(later_db, "nightly", now + n * HOUR_MS) for n in (1, 2)]
    ready = insert_occurrence(later_db, "nightly", now - HOUR_MS)
    # Due, not promoted yet: it runs, as a ready one does.
    overdue = insert_occurrence(later_db, "nightly", now - HOUR_MS)
    with cursor_of(later_db) as c:
        c.execute(
            "UPDATE later_job SET stage = 'delayed', history = 'delayed@' || changed_ms || ';' "
            "WHERE id = %s",
            [overdue],
        )
    running = insert_occurrence(later_db, "nightly", now - HOUR_MS, priority=9)
    claim_one(later_db, running)
    other_schedule = insert_occurrence(later_db, "hourly", now + HOUR_MS)
    other_namespace = insert_occurrence(later_db, "nightly", now + HOUR_MS, namespace="other")
    plain = insert(later_db, delay_ms=HOUR_MS)
    # A continuation of an occurrence (and its own) fails with it, as job_cancel's do.
    child = insert_child(later_db, ahead[0])[0]
    grandchild = insert_child(later_db, child)[0]
    # A row changed later than this database's now (a writer whose clock ran
    # ahead) is stamped no earlier than that change.
    stamped_ahead = now + DAY_MS
    with cursor_of(later_db) as c:
        c.execute("UPDATE later_job SET changed_ms = %s WHERE id = %s", [stamped_ahead, ahead[1]])

    def cancel(namespace: str = NS, identifier: str = "nightly") -> int:
        key = ScheduleKey(namespace=namespace, identifier=identifier)
        with cursor_of(later_db, atomic=True) as c:
            return dialect.schedules.job_cancel_occurrences(c, key, HOUR_MS)

    before = db_now(later_db)
    assert cancel() == 2
    after = db_now(later_db)
    assert [cancel(), cancel(identifier="missing"), cancel(namespace="third")] == [0, 0, 0]
    assert stages(
        later_db, *ahead, ready, overdue, running, other_schedule, other_namespace, plain
    ) == [
        "cancelled",
        "cancelled",
        "enqueued",
        "delayed",
        "running",
        "delayed",
        "delayed",
        "delayed",
    ]
    row = job_row(later_db, ahead[0])
    assert before <= row["finished_ms"] == row["changed_ms"] <= after
    assert before + HOUR_MS <= row["expires_ms"] <= after + HOUR_MS
    assert row["expires_ms"] == row["finished_ms"] + HOUR_MS
    assert job_row(later_db, ahead[1])["finished_ms"] == stamped_ahead
    assert stages(later_db, child, grandchild) == ["failed", "failed"]
    assert job_row(later_db, grandchild)["last_error"] == PARENT_FAILED
    assert cancel(namespace="other") == 1
    assert stages(later_db, other_namespace) == ["cancelled"]
    assert_counts(later_db)


def test_job_set_trace_marks_only_the_named_jobs_in_batches(later_db, dialect):
    """The enqueuing span's context lands on the jobs named (more of them than
    one statement takes), with no stage change; others stay NULL."""
    from later_django.db.jobs import TRACE_BATCH

    marked = [insert(later_db) for _ in range(TRACE_BATCH + 3)]
    other = insert(later_db)
    context = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_set_trace(c, marked, context)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_trace_context(c, job_id=marked[0]) == context
        assert dialect.jobs.job_trace_context(c, job_id=marked[-1]) == context
        assert dialect.jobs.job_trace_context(c, job_id=other) is None
        assert dialect.jobs.job_trace_context(c, job_id=new_job_id()) is None
    traced = later_db.scalar("SELECT COUNT(*) FROM later_job WHERE trace_context IS NOT NULL")
    assert traced == len(marked)
    assert stages(later_db, marked[0], other) == ["enqueued", "enqueued"]
    assert_counts(later_db)


def test_job_next_due_in_is_the_wait_for_the_first_delayed_or_requeued_job(later_db, dialect):
    """None while no job of the namespace waits for its time; else the first
    delayed or requeued job's run_at minus the database's now (not above
    zero once it is due). Ready jobs and other namespaces do not count."""

    def due_in(namespace: str = NS) -> tuple[int, int | None, int]:
        before = db_now(later_db)
        with cursor_of(later_db) as c:
            value = dialect.jobs.job_next_due_in(c, namespace=namespace)
        return before, value, db_now(later_db)

    def assert_due_in(run_at_ms: int, namespace: str = NS) -> int:
        before, value, after = due_in(namespace)
        assert value is not None and run_at_ms - after <= value <= run_at_ms - before
        return value

    assert due_in()[1] is None
    retried = insert(later_db)
    insert(later_db, namespace="other", delay_ms=60_000)
    assert due_in()[1] is None, "a ready job and another namespace's wait for nothing"
    now = db_now(later_db)
    insert(later_db, run_at_ms=now + 3 * HOUR_MS)
    insert(later_db, run_at_ms=now + 2 * HOUR_MS)
    assert assert_due_in(now + 2 * HOUR_MS) > HOUR_MS
    job = claim_one(later_db, retried)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry(c, owned(job), RetryWrite(delay_ms=HOUR_MS, error="x"))
    assert_due_in(job_row(later_db, retried)["run_at_ms"])
    age(later_db, "run_at_ms", retried, 2 * HOUR_MS)
    assert assert_due_in(job_row(later_db, retried)["run_at_ms"]) < 0, "overdue"
    other_run_at = later_db.scalar(
        "SELECT run_at_ms FROM later_job WHERE namespace = 'other' AND stage = 'delayed'"
    )
    assert 0 < assert_due_in(int(other_run_at), namespace="other") <= 60_000


# -- the database's clock: a stage is never stamped before the previous one ----------------


def test_stage_changes_never_stamp_before_the_previous_change(later_db, dialect):
    """Each stage change is stamped no earlier than the row's previous
    change (a writer whose clock ran ahead, or that waited for the row),
    through every operation that changes a stage."""
    job_id = insert(later_db)
    ahead = db_now(later_db) + HOUR_MS

    def push_ahead(*job_ids: str) -> None:
        with cursor_of(later_db) as c:
            for each in job_ids:
                c.execute("UPDATE later_job SET changed_ms = %s WHERE id = %s", [ahead, each])

    def last_stamp(each: str) -> int:
        row = job_row(later_db, each)
        assert row["changed_ms"] == ahead, row
        return int(row["changed_ms"])

    push_ahead(job_id)
    job = claim_one(later_db, job_id)
    assert last_stamp(job_id) == job_row(later_db, job_id)["started_ms"]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_unclaim(c, owned(job))
    last_stamp(job_id)
    job = claim_one(later_db, job_id)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry(c, owned(job), RetryWrite(delay_ms=0, error="x"))
    last_stamp(job_id)
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_promote_due(c, namespace=NS, limit=10) == 1
    last_stamp(job_id)
    job = claim_one(later_db, job_id)
    child = insert_child(later_db, job_id)[0]
    push_ahead(child)
    assert complete(later_db, [(job_id, job.attempts)]) == Completion(done_ids=[job_id], released=1)
    assert last_stamp(job_id) == job_row(later_db, job_id)["finished_ms"]
    last_stamp(child)

    other = insert(later_db, delay_ms=HOUR_MS)
    push_ahead(other)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_cancel(c, namespace=NS, job_id=other, retention_ms=1)
    last_stamp(other)
    failing = claim_one(later_db, child)
    grandchild = insert_child(later_db, child)[0]
    push_ahead(child, grandchild)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_fail(c, owned(failing), FailureWrite(error="x", retention_ms=1))
    last_stamp(child)
    last_stamp(grandchild)


# -- sequential partition mode ----------------------------------------------------------
ORDERS = PartitionLane(NS, "orders", 3)


def insert_partitioned(later_db, lane: PartitionLane = ORDERS, **fields: Any) -> tuple[str, int]:
    """Insert a job at the next sequence of ``lane``; return (id, sequence)."""
    job = new_job(**fields)
    with cursor_of(later_db, atomic=True) as c:
        dialect = dialect_for(later_db.alias)
        sequence = dialect.partitions.partition_next_sequence(c, lane)
        stage = dialect.partitions.job_insert_partitioned(
            c, job, PartitionSlot(lane, sequence), DAY_MS
        )
    assert stage is not None
    return job.id, sequence


def claim_head(later_db, owner: str, *, partition_lease_ms: int = LEASE_MS, lane=ORDERS):
    with cursor_of(later_db, atomic=True) as c:
        request = PartitionClaimRequest(
            lane=lane,
            owner=owner,
            partition_lease_ms=partition_lease_ms,
            job_lease_ms=LEASE_MS,
            server_ttl_ms=LEASE_MS,
        )
        return dialect_for(later_db.alias).partitions.partition_claim(c, request)


def beat(later_db, server_id: str, *, topics: bool = True) -> None:
    with cursor_of(later_db) as c:
        heartbeat = Heartbeat(
            server_id=server_id, namespace=NS, hostname="h", pid=1, workers=1, topics=topics
        )
        dialect_for(later_db.alias).cluster.server_heartbeat(c, heartbeat)


def test_partition_jobs_get_gapless_sequences_and_stay_out_of_plain_reach(later_db, dialect):
    """Sequences count from 0 per partition; a rolled-back one is reused. A
    partition job is counted in its stage but never claimed, announced as
    ready or counted as plain backlog (the lane rule, docs/design.md)."""
    first, seq0 = insert_partitioned(later_db)
    with pytest.raises(RuntimeError), cursor_of(later_db, atomic=True) as c:
        dialect.partitions.partition_next_sequence(c, ORDERS)
        raise RuntimeError("roll back")
    delayed, seq1 = insert_partitioned(later_db, delay_ms=HOUR_MS)
    _, other_seq = insert_partitioned(later_db, PartitionLane(NS, "orders", 4))
    assert (seq0, seq1, other_seq) == (0, 1, 0)
    assert stages(later_db, first, delayed) == ["enqueued", "delayed"]
    parent = insert(later_db)
    child = new_job(parent_id=parent)
    with cursor_of(later_db, atomic=True) as c:
        sequence = dialect.partitions.partition_next_sequence(c, ORDERS)
        slot = PartitionSlot(ORDERS, sequence)
        assert dialect.partitions.job_insert_partitioned(c, child, slot, DAY_MS) == "waiting"
        missing = new_job(parent_id=new_job_id())
        assert (
            dialect.partitions.job_insert_partitioned(
                c, missing, slot._replace(sequence=99), DAY_MS
            )
            is None
        )
    with cursor_of(later_db) as c:
        assert dialect.reads.plain_ready(c, namespace=NS) == 1  # the parent only
        assert dialect.reads.stage_counts(c, namespace=NS)["enqueued"] == 3
    assert [job.id for job in claim(later_db, limit=10)] == [parent]
    with cursor_of(later_db) as c:
        assert dialect.jobs.job_ready_exists(c, namespace=NS) is False
        assert dialect.reads.plain_ready(c, namespace=NS) == 0
    assert_counts(later_db)


def test_partition_claim_takes_the_ready_head_under_a_fenced_lease(later_db, dialect):
    """The lease goes to one live owner at a time with a higher epoch per new
    holder; only a ready head is claimed; heads and stats follow."""
    head, _ = insert_partitioned(later_db)
    second, _ = insert_partitioned(later_db)
    beat(later_db, "a")  # a live server: its lease is not taken before it expires
    with cursor_of(later_db) as c:
        heads = {
            (h.topic, h.partition): h for h in dialect.partitions.partition_heads(c, namespace=NS)
        }
    assert heads[("orders", 3)].job_id == head and heads[("orders", 3)].stage == "enqueued"
    epoch, job = claim_head(later_db, "a")
    assert job is not None and job.id == head and job.lane == ORDERS._replace(epoch=epoch)
    assert claim_head(later_db, "b") is None  # a's lease is live
    assert claim_head(later_db, "a") == (epoch, None)  # the head runs: nothing to claim
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_fence(c, job.lane, owner="a") is True
        assert dialect.partitions.partition_fence(c, job.lane, owner="b") is False
        assert dialect.partitions.partition_renew(
            c, namespace=NS, owner="a", lease_ms=LEASE_MS
        ) == [ORDERS._replace(epoch=epoch)]
        stats = dialect.partitions.partition_stats(c, namespace=NS)
    assert [(s.partition, s.next_sequence, s.head_sequence, s.owner, s.depth) for s in stats] == [
        (3, 2, 0, "a", 2)
    ]
    stale = job._replace(lane=job.lane._replace(epoch=epoch - 1))
    for done, stored in ((stale, False), (job, True), (job, False)):
        completion = PartitionCompletion(job=done, owner="a", retention_ms=DAY_MS)
        with cursor_of(later_db, atomic=not dialect.partitions.writes_one_statement) as c:
            assert dialect.partitions.partition_complete(c, completion) is stored
    assert stages(later_db, head) == ["success"]
    assert claim_head(later_db, "a")[1].id == second
    with cursor_of(later_db, atomic=True) as c:
        dialect.partitions.partition_release(c, namespace=NS, owner="a")
        assert dialect.partitions.partition_fence(c, job.lane, owner="a") is False
    taken = claim_head(later_db, "b")
    assert taken is not None and taken[0] == epoch + 1 and taken[1] is None


def test_partition_stats_covers_every_partition_of_a_registered_topic(later_db, dialect):
    """One row per partition of each topic registered in the namespace, the
    partitions that never had a job included (sequence 0, no head, no
    lease), and per partition that had a job in a topic no longer registered;
    another namespace's topics are not read."""
    with cursor_of(later_db) as c:
        dialect.partitions.topic_register(c, namespace=NS, name="orders", partitions=4)
        dialect.partitions.topic_register(c, namespace=NS, name="events", partitions=2)
        dialect.partitions.topic_register(c, namespace="other", name="audit", partitions=3)
    insert_partitioned(later_db)
    insert_partitioned(later_db)
    insert_partitioned(later_db, PartitionLane(NS, "legacy", 5))
    beat(later_db, "a")
    epoch, _ = claim_head(later_db, "a")
    with cursor_of(later_db) as c:
        stats = dialect.partitions.partition_stats(c, namespace=NS)
    rows = [
        (s.topic, s.partition, s.next_sequence, s.head_sequence, s.head_stage, s.owner, s.epoch)
        for s in stats
    ]
    assert rows == [
        ("events", 0, 0, None, None, None, 0),
        ("events", 1, 0, None, None, None, 0),
        ("legacy", 5, 1, 0, "enqueued", None, 0),
        ("orders", 0, 0, None, None, None, 0),
        ("orders", 1, 0, None, None, None, 0),
        ("orders", 2, 0, None, None, None, 0),
        ("orders", 3, 2, 0, "running", "a", epoch),
    ]
    assert [s.depth for s in stats] == [0, 0, 1, 0, 0, 0, 2]
    empty = [s for s in stats if s.head_sequence is None]
    assert {(s.head_run_at_ms, s.lease_expires_ms) for s in empty} == {(None, 0)}


def test_topic_servers_are_the_live_servers_that_poll_topics(later_db, dialect):
    for server_id, topics in (("s1", True), ("s2", False), ("s3", True)):
        beat(later_db, server_id, topics=topics)
    with cursor_of(later_db) as c:
        assert dialect.partitions.topic_servers(c, namespace=NS, ttl_ms=LEASE_MS) == ["s1", "s3"]


def test_job_place_tells_a_jobs_topic_and_partition(later_db, dialect):
    partitioned, _ = insert_partitioned(later_db)
    plain = insert(later_db)
    with cursor_of(later_db) as c:
        assert dialect.partitions.job_place(c, namespace=NS, job_id=partitioned) == ("orders", 3)
        assert dialect.partitions.job_place(c, namespace=NS, job_id=plain) == (None, None)
        assert dialect.partitions.job_place(c, namespace="other", job_id=plain) is None
        assert dialect.partitions.job_place(c, namespace=NS, job_id="0" * 26) is None


def head_failure(job_id: str | None) -> HeadFailure:
    return HeadFailure(lane=ORDERS, error="boom", retention_ms=DAY_MS, job_id=job_id)


def test_force_fail_of_a_finished_job_changes_nothing(later_db, dialect):
    """force_fail with the id of a head that finished meanwhile returns None
    and touches no lease, epoch or job: the next head, running now, keeps
    its lease and its success is stored (an operator's stale page)."""
    first, _ = insert_partitioned(later_db)
    second, _ = insert_partitioned(later_db)
    beat(later_db, "a")
    epoch, job = claim_head(later_db, "a")
    done = PartitionCompletion(job=job, owner="a", retention_ms=DAY_MS)
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_complete(c, done) is True
    epoch, running = claim_head(later_db, "a")
    assert running is not None and running.id == second
    lease = later_db.rows(
        "SELECT owner, epoch, lease_expires_ms FROM later_partition WHERE topic = 'orders'"
    )
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_force_fail_head(c, head_failure(first)) is None
    assert (
        later_db.rows(
            "SELECT owner, epoch, lease_expires_ms FROM later_partition WHERE topic = 'orders'"
        )
        == lease
    )
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_fence(c, running.lane, owner="a") is True
        ok = PartitionCompletion(job=running, owner="a", retention_ms=DAY_MS)
        assert dialect.partitions.partition_complete(c, ok) is True
    assert stages(later_db, first, second) == ["success", "success"]


def test_force_fail_and_truncate_act_on_one_partition(later_db, dialect):
    """force_fail fails the head whatever its stage (and its waiting
    children) and moves the epoch on; truncate keeps the newest finished."""
    ids = [insert_partitioned(later_db)[0] for _ in range(4)]
    epoch, job = claim_head(later_db, "a")
    with cursor_of(later_db, atomic=True) as c:
        wrong = HeadFailure(lane=ORDERS, error="boom", retention_ms=DAY_MS, job_id=ids[1])
        assert (
            dialect.partitions.partition_force_fail_head(c, wrong) is None
        )  # ids[1] is not the head
        assert dialect.partitions.partition_fence(c, job.lane, owner="a") is True  # untouched
        failed = dialect.partitions.partition_force_fail_head(c, head_failure(ids[0]))
        assert failed == ids[0]
        assert dialect.partitions.partition_fence(c, job.lane, owner="a") is False
    assert stages(later_db, *ids) == ["failed", "enqueued", "enqueued", "enqueued"]
    for _ in range(2):
        with cursor_of(later_db, atomic=True) as c:
            dialect.partitions.partition_force_fail_head(c, head_failure(None))
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.partitions.partition_truncate_history(c, ORDERS, 1) == 2
        nothing = HeadFailure(lane=PartitionLane(NS, "none", 0), error="x", retention_ms=1)
        assert dialect.partitions.partition_force_fail_head(c, nothing) is None
    assert [row[0] for row in later_db.rows("SELECT id FROM later_job ORDER BY sequence")] == ids[
        2:
    ]
    assert_counts(later_db)


# -- the retained log -----------------------------------------------------------------------


def test_log_topic_register_get_and_retained(later_db, dialect):
    """A topic is stored once per namespace; registering it again with the same
    count updates only its retention, another count changes nothing."""

    def register(name: str, partitions: int, retention_ms: int | None, ns: str = NS) -> bool:
        row = LogTopicRow(name=name, partitions=partitions, retention_ms=retention_ms)
        with cursor_of(later_db) as c:
            return dialect.log.log_topic_register(c, row, ns)

    assert register("events", 4, None) is True
    assert register("events", 4, HOUR_MS) is True
    assert register("events", 8, None) is False
    assert register("events", 2, None, ns="other") is True
    assert register("plain", 1, None) is True
    with cursor_of(later_db) as c:
        stored = dialect.log.log_topic_get(c, namespace=NS, name="events")
        assert stored == LogTopicRow(name="events", partitions=4, retention_ms=HOUR_MS)
        assert dialect.log.log_topic_get(c, namespace=NS, name="nope") is None
        assert dialect.log.log_topic_retained(c, namespace=NS) == [stored]
        assert dialect.log.log_topic_retained(c, namespace="other") == []


def _log_topic(later_db, dialect, partitions: int = 2) -> None:
    row = LogTopicRow(name="events", partitions=partitions, retention_ms=None)
    with cursor_of(later_db) as c:
        assert dialect.log.log_topic_register(c, row, NS)


def _part(partition: int = 0) -> LogPartitionKey:
    return LogPartitionKey(namespace=NS, topic="events", partition=partition)


def _append(later_db, dialect, values: list[bytes], partition: int = 0) -> int:
    """Reserve offsets for ``values`` and store them; return the new end."""
    with cursor_of(later_db, atomic=True) as c:
        advance = LogAdvance(key=_part(partition), count=len(values), partitions=2)
        end = dialect.log.log_partition_advance(c, advance)
        assert end is not None
        records = [
            NewLogRecord(partition, offset, b"k", value)
            for offset, value in enumerate(values, start=end - len(values))
        ]
        dialect.log.log_record_insert(c, namespace=NS, topic="events", records=records)
    return end


def test_log_partition_advance_reserves_offsets_and_records_read_back(later_db, dialect):
    """The counter starts at 0 and grows by each advance's count; it refuses a
    topic stored with another count. Records carry the database's now."""
    with cursor_of(later_db) as c:
        missing = LogAdvance(key=_part(), count=1, partitions=2)
        assert dialect.log.log_partition_advance(c, missing) is None
    _log_topic(later_db, dialect)
    with cursor_of(later_db) as c:
        stale = LogAdvance(key=_part(), count=1, partitions=3)
        assert dialect.log.log_partition_advance(c, stale) is None
    before = db_now(later_db)
    assert _append(later_db, dialect, [b"a", b"b", b"c"]) == 3
    assert _append(later_db, dialect, [b"d", b"e"]) == 5
    assert _append(later_db, dialect, [b"x"], partition=1) == 1
    after = db_now(later_db)
    with cursor_of(later_db) as c:
        rows = dialect.log.log_record_read(c, LogRead(key=_part(), from_offset=1, limit=3))
        other = dialect.log.log_record_read(c, LogRead(key=_part(1), from_offset=0, limit=10))
    assert [(r.offset, r.key, r.value) for r in rows] == [
        (1, b"k", b"b"),
        (2, b"k", b"c"),
        (3, b"k", b"d"),
    ]
    assert all(before <= r.appended_ms <= after for r in rows)
    assert [(r.offset, r.value) for r in other] == [(0, b"x")]


def test_log_record_prune_deletes_the_prefix_older_than_the_cutoff(later_db, dialect):
    _log_topic(later_db, dialect)
    _append(later_db, dialect, [b"%d" % n for n in range(6)])
    _append(later_db, dialect, [b"other"], partition=1)
    with cursor_of(later_db) as c:
        c.execute(
            "UPDATE later_log_record SET appended_ms = appended_ms - %s "
            "WHERE log_offset IN (0, 1, 2, 4)",
            [2 * HOUR_MS],
        )
        prune = LogPrune(key=_part(), older_than_ms=HOUR_MS, limit=2)
        assert dialect.log.log_record_prune(c, prune) == 2  # looks at 2 records only
        again = LogPrune(key=_part(), older_than_ms=HOUR_MS, limit=100)
        assert dialect.log.log_record_prune(c, again) == 1  # 3 is new: 4 waits
        assert dialect.log.log_record_prune(c, again) == 0
        left = dialect.log.log_record_read(c, LogRead(key=_part(), from_offset=0, limit=10))
        other = dialect.log.log_record_read(c, LogRead(key=_part(1), from_offset=0, limit=10))
    assert [r.offset for r in left] == [3, 4, 5]
    assert len(other) == 1


def test_log_consumer_lease_is_fenced_by_epoch_on_the_database_clock(later_db, dialect):
    """One member at a time until the database's now plus the lease; each take
    a higher epoch; renew, commit and release hold only at the holder's epoch;
    a commit stays within committed..end; lag is end minus committed."""
    _log_topic(later_db, dialect)
    _append(later_db, dialect, [b"a", b"b", b"c"])
    key = LogConsumerKey(namespace=NS, topic="events", group="billing", partition=0)

    def acquire(member: str, partition: int = 0) -> LogAcquired | None:
        where = LogConsumerKey(namespace=NS, topic="events", group="billing", partition=partition)
        with cursor_of(later_db) as c:
            return dialect.log.log_consumer_acquire(
                c, LogLeaseRequest(key=where, member=member, ttl_ms=LEASE_MS)
            )

    def expires() -> int:
        return int(later_db.scalar("SELECT expires_ms FROM later_log_consumer WHERE part = 0"))  # type: ignore[arg-type]

    def commit(epoch: int, offset: int) -> bool:
        fence = LogFence(key=key, epoch=epoch)
        with cursor_of(later_db) as c:
            return dialect.log.log_consumer_commit(
                c, LogCommit(fence=fence, next_offset=offset, ttl_ms=LEASE_MS)
            )

    assert acquire("a", partition=2) is None, "the topic has no partition 2"
    before = db_now(later_db)
    assert acquire("a") == LogAcquired(epoch=1, committed_offset=0)
    assert before + LEASE_MS <= expires() <= db_now(later_db) + LEASE_MS
    assert acquire("b") is None
    assert commit(1, 2) is True
    assert commit(1, 1) is False, "behind the committed offset"
    assert commit(1, 4) is False, "past the end"
    with cursor_of(later_db) as c:
        assert dialect.log.log_consumer_state(c, key) == LogConsumerState(
            epoch=1, committed_offset=2, end_offset=3
        )
        c.execute("UPDATE later_log_consumer SET expires_ms = expires_ms - %s", [2 * LEASE_MS])
        assert dialect.log.log_consumer_renew(c, LogFence(key=key, epoch=1), LEASE_MS) is True
        c.execute("UPDATE later_log_consumer SET expires_ms = expires_ms - %s", [2 * LEASE_MS])
    assert acquire("b") == LogAcquired(epoch=2, committed_offset=2)
    assert commit(1, 3) is False, "a superseded holder"
    with cursor_of(later_db) as c:
        assert dialect.log.log_consumer_renew(c, LogFence(key=key, epoch=1), LEASE_MS) is False
        assert dialect.log.log_consumer_release(c, LogFence(key=key, epoch=1)) is False
        assert dialect.log.log_lag(c, namespace=NS, topic="events") == [
            LogLag(group="billing", partition=0, lag=1)
        ]
        assert dialect.log.log_consumer_release(c, LogFence(key=key, epoch=2)) is True
        other = LogConsumerKey(namespace=NS, topic="events", group="other", partition=0)
        assert dialect.log.log_consumer_state(c, other) is None
    assert acquire("a") == LogAcquired(epoch=3, committed_offset=2)


# -- the dashboard ------------------------------------------------------------------------
def stat(started: int = 1, waits: str = '{"5":1}') -> StatRow:
    return StatRow(started, started, 0, 0, waits, 3, 3, "{}", 0, 0)


def test_stat_rows_are_read_by_window_and_pruned_by_age(later_db, dialect):
    with cursor_of(later_db) as c:
        dialect.reads.stat_insert(c, namespace=NS, server_id="s1", row=stat(2))
        dialect.reads.stat_insert(c, namespace="other", server_id="s9", row=stat(7))
        dialect.reads.stat_insert(c, namespace=NS, server_id="s2", row=stat(3))
        c.execute("UPDATE later_dashboard_stat SET at_ms = at_ms - 120000 WHERE server_id = 's2'")
        readings = dialect.reads.stats_since(c, namespace=NS, window_ms=60_000)
        assert [r.stat for r in readings] == [stat(2)]
        assert db_now(later_db) - 5_000 <= readings[0].at_ms <= db_now(later_db)
        assert len(dialect.reads.stats_since(c, namespace=NS, window_ms=180_000)) == 2
        assert (
            dialect.reads.dashboard_prune(
                c, namespace=NS, stats_for_ms=60_000, samples_for_ms=DAY_MS
            )
            == 1
        )
        assert [
            r.stat.started for r in dialect.reads.stats_since(c, namespace=NS, window_ms=DAY_MS)
        ] == [2]
        assert len(dialect.reads.stats_since(c, namespace="other", window_ms=DAY_MS)) == 1


def test_samples_are_taken_from_the_counters_once_a_millisecond_and_thinned(later_db, dialect):
    """A sample is the counters' backlog by kind; a second one in the same
    millisecond is dropped; reads give one point per step, each the largest."""
    insert(later_db)
    insert(later_db)
    insert(later_db, delay_ms=HOUR_MS)
    with cursor_of(later_db) as c:
        assert dialect.reads.sample_take(c, namespace=NS) == 1
        (sample,) = dialect.reads.samples_since(c, namespace=NS, window_ms=60_000, step_ms=60_000)
        assert (sample.ready, sample.scheduled, sample.running, sample.waiting) == (2, 1, 0, 0)
        assert sample.partitioned == 0
        c.execute("UPDATE later_queue_sample SET at_ms = at_ms - 1000, ready = 9")
        assert dialect.reads.sample_take(c, namespace=NS) == 1
        points = dialect.reads.samples_since(c, namespace=NS, window_ms=60_000, step_ms=3_600_000)
        assert len(points) <= 2 and max(p.ready for p in points) == 9
        c.execute("UPDATE later_queue_sample SET at_ms = at_ms - %s", [8 * DAY_MS])
        assert (
            dialect.reads.dashboard_prune(
                c, namespace=NS, stats_for_ms=60_000, samples_for_ms=7 * DAY_MS
            )
            == 2
        )
        assert (
            dialect.reads.samples_since(c, namespace=NS, window_ms=9 * DAY_MS, step_ms=60_000) == []
        )


def test_lane_counts_split_the_counters_by_lane(later_db, dialect):
    insert(later_db)
    with cursor_of(later_db) as c:
        counts = dialect.reads.lane_counts(c, namespace=NS)
    assert [(n.lane, n.stage, n.n) for n in counts if n.n] == [("", "enqueued", 1)]


def test_live_servers_and_their_running_jobs(later_db, dialect):
    job_id = insert(later_db)
    claim_one(later_db, job_id)
    with cursor_of(later_db) as c:
        beat = Heartbeat(server_id=OWNER, namespace=NS, hostname="h", pid=5, workers=3)
        dialect.cluster.server_heartbeat(c, beat)
        dialect.cluster.server_heartbeat(
            c, Heartbeat(server_id="old", namespace=NS, hostname="h", pid=6, workers=1)
        )
        c.execute("UPDATE later_server SET heartbeat_ms = heartbeat_ms - 60000 WHERE id = 'old'")
        (server,) = dialect.reads.live_servers(c, namespace=NS, within_ms=15_000)
        (running,) = dialect.reads.running_jobs(c, namespace=NS, limit=10)
    assert (server.id, server.pid, server.workers, server.topics) == (OWNER, 5, 3, False)
    assert (running.id, running.owner, running.topic) == (job_id, OWNER, None)


def test_database_size_is_the_whole_database_in_bytes(later_db, dialect):
    with cursor_of(later_db) as c:
        before = dialect.database_size(c)
        dialect.jobs.job_insert_many(
            connections[later_db.alias], [new_job(payload=b"x" * 4000) for _ in range(500)]
        )
        after = dialect.database_size(c)
    assert 0 < before < after


def test_job_detail_and_children_never_read_the_payload(later_db, dialect):
    parent = insert(later_db, payload=b"secret")
    children = [insert_child(later_db, parent)[0] for _ in range(3)]
    with cursor_of(later_db) as c:
        detail = dialect.reads.job_detail(c, namespace=NS, job_id=parent)
        assert dialect.reads.job_detail(c, namespace="other", job_id=parent) is None
        listed = dialect.reads.job_children(c, job_id=parent, limit=2)
    assert detail is not None and detail.id == parent and detail.stage == "enqueued"
    assert b"secret" not in repr(detail).encode()
    assert [j.id for j in listed] == sorted(children)[:2]


def test_job_page_reads_a_stage_in_order_page_by_page_with_filters(later_db, dialect):
    """Pages of a list join up, in the list's order; a filter the index
    cannot serve looks at a bounded stretch and says where it stopped."""
    ids = [insert(later_db, priority=i % 2, type_name=f"t{i % 3}") for i in range(7)]
    expected = sorted(ids, key=lambda j: (-(ids.index(j) % 2), j))
    seen, after = [], None
    with cursor_of(later_db) as c:
        while True:
            query = JobQuery(namespace=NS, stage="enqueued", after=after, page_size=3)
            page = dialect.reads.job_page(c, query)
            seen += [j.id for j in page.jobs]
            if page.after is None:
                break
            after = page.after
        assert seen == expected
        narrow = JobQuery(namespace=NS, stage="enqueued", type_name="t0", scan_limit=2, page_size=5)
        first = dialect.reads.job_page(c, narrow)
        assert first.scanned_out and first.after is not None
        assert all(j.type_name == "t0" for j in first.jobs)
        with pytest.raises(ValueError, match="does not belong to this list"):
            dialect.reads.job_page(c, JobQuery(namespace=NS, stage="enqueued", after=("x",)))


def test_job_retry_failed_and_run_now_change_only_the_stage_they_apply_to(later_db, dialect):
    failed = insert(later_db)
    job = claim_one(later_db, failed)
    child, _ = insert_child(later_db, failed)
    delayed = insert(later_db, delay_ms=HOUR_MS)
    with cursor_of(later_db, atomic=True) as c:
        dialect.jobs.job_fail(c, owned(job), FailureWrite(error="boom", retention_ms=DAY_MS))
    assert stages(later_db, failed, child) == ["failed", "failed"]
    with cursor_of(later_db, atomic=True) as c:
        assert dialect.jobs.job_retry_failed(c, namespace=NS, job_id=child) is None  # parent failed
        assert dialect.jobs.job_retry_failed(c, namespace=NS, job_id=failed) == 1
        assert dialect.jobs.job_retry_failed(c, namespace=NS, job_id=failed) is None
        assert dialect.jobs.job_run_now(c, namespace=NS, job_id=delayed) is True
        assert dialect.jobs.job_run_now(c, namespace=NS, job_id=failed) is False
    assert stages(later_db, failed, child, delayed) == ["enqueued", "waiting", "enqueued"]
    assert job_row(later_db, failed)["expires_ms"] is None
    assert_counts(later_db)


def test_log_consumers_show_each_groups_place_and_the_partitions_end(later_db, dialect):
    _log_topic(later_db, dialect)
    _append(later_db, dialect, [b"a", b"b", b"c"])
    key = LogConsumerKey(namespace=NS, topic="events", group="billing", partition=0)
    with cursor_of(later_db) as c:
        assert dialect.reads.log_consumers(c, namespace=NS) == []
        acquired = dialect.log.log_consumer_acquire(
            c, LogLeaseRequest(key=key, member="m1", ttl_ms=LEASE_MS)
        )
        assert acquired is not None
        fence = LogFence(key=key, epoch=acquired.epoch)
        assert dialect.log.log_consumer_commit(
            c, LogCommit(fence=fence, next_offset=1, ttl_ms=LEASE_MS)
        )
        (row,) = dialect.reads.log_consumers(c, namespace=NS)
        assert dialect.reads.log_consumers(c, namespace="other") == []
    assert (row.topic, row.group, row.partition, row.member, row.epoch) == (
        "events",
        "billing",
        0,
        "m1",
        acquired.epoch,
    )
    assert (row.committed_offset, row.next_offset) == (1, 3)
    assert row.expires_ms > db_now(later_db)
