"""The schedule store (``dialect.schedules``): recurring schedules and the
occurrences they enqueue.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from later_django.db import dialect_for
from later_django.db.postgresql import connect_kwargs
from later_django.db.rows import (
    DueSchedule,
    ScheduleAdvance,
    ScheduleInfo,
    ScheduleKey,
    ScheduleWrite,
)
from later_django.db.schedules import DUE_BATCH
from later_django.ids import new_job_id
from later_django.states import PARENT_FAILED
from tests.conformance.helpers import (
    DAY_MS,
    HOUR_MS,
    NS,
    assert_counts,
    claim_one,
    cursor_of,
    db_now,
    insert,
    insert_child,
    job_row,
    new_job,
    stages,
)

# later's SQL on the two databases: Django's version changes nothing here, so
# it runs in the first tox env only (tox.ini), which keeps CI within its time.
pytestmark = pytest.mark.one_env


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


def due_schedules(
    later_db, *, namespace: str = NS, ahead_ms: int = 0, sequential: bool = True
) -> list[DueSchedule]:
    with cursor_of(later_db) as c:
        return dialect_for(later_db.alias).schedules.schedule_due(
            c, namespace=namespace, ahead_ms=ahead_ms, sequential=sequential
        )


def insert_occurrence(later_db, recurring: str, run_at_ms: int, **fields: Any) -> str:
    job = new_job(run_at_ms=run_at_ms, **fields)
    with cursor_of(later_db, atomic=True) as c:
        dialect_for(later_db.alias).schedules.insert_occurrence(c, job, recurring)
    return job.id


# -- schedules --------------------------------------------------------------------------


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


def test_schedule_due_leaves_sequential_schedules_to_servers_that_can_fire_them(later_db, dialect):
    """A reader that cannot enqueue sequential schedules does not get them
    (however overdue, they would fill every read of DUE_BATCH and hold back
    the plain ones); schedule_sequential_due lists them, most overdue first."""
    now = db_now(later_db)
    for n in range(DUE_BATCH + 5):
        write = schedule_write(f"seq-{n:03}", next_run_ms=now - HOUR_MS + n, sequential=True)
        assert save_schedule(later_db, write)
    assert save_schedule(later_db, schedule_write("plain", next_run_ms=now - 60_000))
    able = due_schedules(later_db, sequential=True)
    assert len(able) == DUE_BATCH and all(s.sequential for s in able)
    unable = due_schedules(later_db, sequential=False)
    assert [(s.key.identifier, s.sequential) for s in unable] == [("plain", False)]
    with cursor_of(later_db) as c:
        waiting = dialect.schedules.schedule_sequential_due(c, namespace=NS, ahead_ms=0)
    assert [key.identifier for key in waiting] == [f"seq-{n:03}" for n in range(DUE_BATCH)]
    with cursor_of(later_db) as c:
        assert dialect.schedules.schedule_sequential_due(c, namespace="other", ahead_ms=0) == []


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


# -- their occurrences ------------------------------------------------------------------


def test_insert_occurrence_is_due_at_its_exact_fire_time(later_db, dialect):
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
            dialect.schedules.insert_occurrence(c, past, "nightly"),
            dialect.schedules.insert_occurrence(c, future, "nightly"),
            dialect.schedules.insert_occurrence(c, elsewhere, "hourly"),
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


def test_insert_occurrence_writes_its_queue_and_concurrency_key(later_db, dialect):
    """An occurrence of a type with a queue runs on that queue, one of a
    type with a concurrency key carries the key and its limit, a plain one
    the default queue ('') and neither."""
    now = db_now(later_db)
    plain = new_job(run_at_ms=now)
    queued = new_job(run_at_ms=now)._replace(queue="emails")
    keyed = new_job(run_at_ms=now)._replace(
        queue="emails", concurrency_key="tenant-1", concurrency_limit=2
    )
    with cursor_of(later_db, atomic=True) as c:
        for job in (plain, queued, keyed):
            dialect.schedules.insert_occurrence(c, job, "nightly")
    columns = "queue, concurrency_key, concurrency_limit, topic"
    stored = {
        str(r[0]): tuple(r[1:]) for r in later_db.rows(f"SELECT id, {columns} FROM later_job")
    }
    assert stored == {
        plain.id: ("", None, None, None),
        queued.id: ("emails", None, None, None),
        keyed.id: ("emails", "tenant-1", 2, None),
    }
    assert_counts(later_db)


def test_cancel_occurrences_cancels_only_its_schedules_delayed_ones(later_db, dialect):
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
    # A continuation of an occurrence (and its own) fails with it, as control.cancel's do.
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
            return dialect.schedules.cancel_occurrences(c, key, HOUR_MS)

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
