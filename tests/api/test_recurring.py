"""Recurring jobs: the cron rules, the upsert by identifier, and the scheduler
that enqueues each occurrence exactly once however many servers run."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import signal
import zoneinfo
from collections import Counter
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction

import later_django as later
from later_django.db import dialect_for
from later_django.db.schedules import DUE_BATCH
from later_django.exceptions import NotRegistered
from later_django.recurring import cron as cron_mod
from later_django.recurring import firing
from later_django.recurring.firing import fire_schedules
from tests.helpers import (
    await_until,
    read_records,
    serve,
    set_later,
    wait_until,
)
from tests.jobapp.jobs import Noop

SECOND = 1000
UTC = dt.UTC


def at(*args: int, tz: dt.tzinfo = UTC) -> int:
    return int(dt.datetime(*args, tzinfo=tz).timestamp() * 1000)


# -- the cron rules (no database) -----------------------------------------------------


def test_five_fields_are_minutes_and_six_put_seconds_first():
    every_minute = cron_mod.parse("* * * * *")
    assert every_minute.next_after(at(2026, 1, 1, 0, 0, 30)) == at(2026, 1, 1, 0, 1)
    seconds = cron_mod.parse("15 30 9 * * *")  # 09:30:15 every day
    assert seconds.next_after(at(2026, 1, 1)) == at(2026, 1, 1, 9, 30, 15)
    assert seconds.last_before(at(2026, 1, 2)) == at(2026, 1, 1, 9, 30, 15)
    assert cron_mod.parse("@hourly").next_after(at(2026, 1, 1, 5, 10)) == at(2026, 1, 1, 6)


def test_cron_is_read_in_its_zone_across_a_daylight_saving_change():
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    nine = cron_mod.parse("0 9 * * *", "Europe/Paris")
    assert nine.zone == "Europe/Paris"
    # 29 March 2026: Paris moves from UTC+1 to UTC+2 at 02:00.
    before = nine.next_after(at(2026, 3, 27, 12))
    after = nine.next_after(before)
    assert before == at(2026, 3, 28, 9, tz=paris) == at(2026, 3, 28, 8)
    assert after == at(2026, 3, 29, 9, tz=paris) == at(2026, 3, 29, 7)
    assert cron_mod.parse("0 9 * * *", paris).zone == "Europe/Paris"
    assert cron_mod.parse("0 9 * * *").zone == "UTC"


def test_a_local_time_that_exists_twice_fires_once_unless_the_cron_repeats_hourly():
    # 25 October 2026: Paris goes from UTC+2 back to UTC+1 at 03:00, so
    # 02:30 happens at 00:30 and again at 01:30 UTC.
    daily = cron_mod.parse("30 2 * * *", "Europe/Paris")
    first = daily.next_after(at(2026, 10, 24, 12))
    assert first == at(2026, 10, 25, 0, 30)
    assert daily.next_after(first) == at(2026, 10, 26, 1, 30)
    half_hourly = cron_mod.parse("*/30 * * * *", "Europe/Paris")
    fires = [at(2026, 10, 25, 0)]
    for _ in range(4):
        fires.append(half_hourly.next_after(fires[-1]))
    assert [b - a for a, b in zip(fires, fires[1:], strict=False)] == [30 * 60 * SECOND] * 4
    # A local time that does not exist (clocks go forward) fires right after.
    skipped = cron_mod.parse("30 2 * * *", "Europe/Paris").next_after(at(2026, 3, 28, 12))
    assert skipped == at(2026, 3, 29, 1)  # 03:00 local, UTC+2


@pytest.mark.parametrize(
    ("cron", "tz", "error", "names"),
    [
        ("* * * * * * *", None, ValueError, "7 fields"),
        ("* * * *", None, ValueError, "4 fields"),
        ("61 * * * *", None, ValueError, "not a valid expression"),
        ("0 0 30 2 *", None, ValueError, "never fires"),
        ("* * * * *", "Mars/Olympus", ValueError, "'Mars/Olympus' is not a known time zone"),
        ("* * * * *", 5, TypeError, "tz must be"),
        (None, None, TypeError, "cron must be a str"),
    ],
)
def test_bad_cron_or_zone_is_refused_with_a_message_naming_it(cron, tz, error, names):
    with pytest.raises(error, match=names):
        cron_mod.parse(cron, tz)


def test_due_enqueues_ahead_and_collapses_what_was_missed_beyond_the_grace():
    every_second = cron_mod.parse("* * * * * *")
    now = at(2026, 1, 1, 12)
    # On time: every fire time up to now + ahead, then the next one owed.
    owed = cron_mod.due(
        every_second,
        now - 2 * SECOND,
        now_ms=now,
        ahead_ms=2 * SECOND,
        grace_ms=60 * SECOND,
        limit=100,
    )
    assert owed.fire_ms == tuple(now + i * SECOND for i in range(-2, 3))
    assert owed.next_run_ms == now + 3 * SECOND
    assert owed.skipped == 0
    # After an hour down: what was missed by less than the grace all runs;
    # of the rest, only the latest, once.
    owed = cron_mod.due(
        every_second, now - 3600 * SECOND, now_ms=now, ahead_ms=0, grace_ms=10 * SECOND, limit=100
    )
    assert owed.fire_ms[0] == now - 11 * SECOND
    assert owed.fire_ms[1:] == tuple(now - i * SECOND for i in range(10, -1, -1))
    assert owed.skipped == 100 + 1  # counted up to limit + 1, not an hour's worth
    # A limit leaves the rest owed from where it stopped.
    owed = cron_mod.due(
        every_second, now, now_ms=now, ahead_ms=10 * SECOND, grace_ms=SECOND, limit=3
    )
    assert owed.fire_ms == (now, now + SECOND, now + 2 * SECOND)
    assert owed.next_run_ms == now + 3 * SECOND


# -- registering schedules -----------------------------------------------------------


def schedule_rows(later_db) -> list[tuple[Any, ...]]:
    return later_db.rows(
        "SELECT identifier, cron, zone, payload, priority, next_run_ms, last_job_id "
        "FROM later_schedule ORDER BY identifier"
    )


def occurrences(later_db, identifier: str) -> list[tuple[str, str, int]]:
    """(id, stage, run_at_ms) of every occurrence of ``identifier``, by fire time."""
    return later_db.rows(
        "SELECT id, stage, run_at_ms FROM later_job WHERE recurring = %s ORDER BY run_at_ms, id",
        [identifier],
    )


def test_register_returns_the_first_occurrence_then_updates_in_place(later_db):
    first = later.enqueue_recurring("report", Noop(n=1), "0 3 * * *", tz="Europe/Paris")
    assert first is not None
    info = later.get_job(first)
    assert info.stage == "delayed" and info.recurring == "report"
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    assert info.run_at.astimezone(paris).time() == dt.time(3, 0)
    [schedule] = later.list_recurring()
    assert (schedule.identifier, schedule.cron, schedule.zone) == (
        "report",
        "0 3 * * *",
        "Europe/Paris",
    )
    assert schedule.type_name == "tests.jobapp.jobs.Noop"
    assert schedule.last_job_id == first and schedule.last_run_at == info.run_at
    assert schedule.next_run_at - info.run_at == dt.timedelta(days=1)

    # Same identifier and cron, as on every start-up: payload and priority
    # change in place, nothing is enqueued, the schedule keeps its place.
    [before] = schedule_rows(later_db)
    assert (
        later.enqueue_recurring("report", Noop(n=2), "0  3 * * *", tz="Europe/Paris", priority=5)
        is None
    )
    [after] = schedule_rows(later_db)
    assert after[5:] == before[5:]
    assert (bytes(after[3]), after[4]) != (bytes(before[3]), before[4])
    assert after[4] == 5
    assert [row[0] for row in occurrences(later_db, "report")] == [first]
    assert later_db.job_count() == 1


def test_another_cron_cancels_occurrences_enqueued_ahead_and_starts_afresh(later_db):
    first = later.enqueue_recurring("tick", Noop(n=1), "0 * * * *")
    fresh = later.enqueue_recurring("tick", Noop(n=1), "30 * * * *")
    assert fresh is not None and fresh != first
    assert later.get_job(first).stage == "cancelled"
    info = later.get_job(fresh)
    assert info.stage == "delayed" and info.run_at.minute == 30
    [schedule] = later.list_recurring()
    assert schedule.cron == "30 * * * *" and schedule.last_job_id == fresh
    # Another zone is another schedule too.
    moved = later.enqueue_recurring("tick", Noop(n=1), "30 * * * *", tz="Asia/Kolkata")
    assert moved is not None and later.get_job(fresh).stage == "cancelled"


def test_remove_stops_a_schedule_and_cancels_what_it_enqueued_ahead(later_db):
    first = later.enqueue_recurring("gone", Noop(n=1), "* * * * *")
    keep = later.enqueue_recurring("kept", Noop(n=1), "* * * * *")
    assert later.remove_recurring("gone") is True
    assert later.remove_recurring("gone") is False
    assert later.get_job(first).stage == "cancelled"
    assert later.get_job(keep).stage == "delayed"
    assert [s.identifier for s in later.list_recurring()] == ["kept"]


@pytest.mark.parametrize(
    ("call", "error", "names"),
    [
        (lambda: later.enqueue_recurring("x", Noop(n=1), "* * * * * * *"), ValueError, "7 fields"),
        (lambda: later.enqueue_recurring("x", Noop(n=1), "nope"), ValueError, "1 fields"),
        (
            lambda: later.enqueue_recurring("x", Noop(n=1), "* * * * *", tz="Nowhere/City"),
            ValueError,
            "Nowhere/City",
        ),
        (lambda: later.enqueue_recurring("x", object(), "* * * * *"), TypeError, "dataclass"),
        (lambda: later.enqueue_recurring("", Noop(n=1), "* * * * *"), ValueError, "identifier"),
        (lambda: later.enqueue_recurring(7, Noop(n=1), "* * * * *"), TypeError, "identifier"),
        (
            lambda: later.enqueue_recurring("x", Noop(n=1), "* * * * *", priority=101),
            ValueError,
            "priority",
        ),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(later_db, call, error, names):
    with pytest.raises(error, match=names):
        call()
    assert schedule_rows(later_db) == []
    assert later_db.job_count() == 0


def test_an_unregistered_payload_type_is_refused(later_db):
    from dataclasses import dataclass

    @dataclass
    class Unknown:
        n: int

    with pytest.raises(NotRegistered):
        later.enqueue_recurring("x", Unknown(n=1), "* * * * *")
    assert schedule_rows(later_db) == [] and later_db.job_count() == 0


def test_registering_joins_the_callers_transaction(later_db):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic(using=later_db.alias):
        later.enqueue_recurring("undone", Noop(n=1), "* * * * *")
        raise Rollback
    assert schedule_rows(later_db) == [] and later_db.job_count() == 0


def test_async_twins_and_the_job_context(later_db):
    ctx = later.JobContext(job_id=later.JobId("0" * 26), attempt=1)

    async def scenario() -> None:
        try:
            first = await later.aenqueue_recurring("a", Noop(n=1), "* * * * *")
            assert first is not None
            assert await ctx.aenqueue_recurring("a", Noop(n=2), "* * * * *") is None
            assert await sync_to_async(ctx.enqueue_recurring)("b", Noop(n=1), "* * * * *")
            assert [s.identifier for s in await later.alist_recurring()] == ["a", "b"]
            listed = await sync_to_async(ctx.list_recurring)()
            assert [s.identifier for s in listed] == ["a", "b"]
            assert await ctx.aremove_recurring("a") is True
            assert await sync_to_async(ctx.remove_recurring)("b") is True
            assert await later.aremove_recurring("b") is False
            assert await ctx.alist_recurring() == []
        finally:
            # The async twins ran on asgiref's worker thread: close its connections.
            await sync_to_async(connections.close_all)()

    asyncio.run(scenario())
    assert schedule_rows(later_db) == []


# -- firing --------------------------------------------------------------------------


def fire(later_db, *, ahead_ms: int = 2 * SECOND, grace_ms: int = 60 * SECOND) -> int:
    dialect = dialect_for(later_db.alias)
    with connections[later_db.alias].cursor() as cursor:
        return fire_schedules(
            dialect,
            cursor,
            alias=later_db.alias,
            ahead_ms=ahead_ms,
            grace_ms=grace_ms,
            namespace="default",
        )


def test_firing_enqueues_each_occurrence_at_its_exact_time_once(later_db):
    later.enqueue_recurring("s", Noop(n=1), "* * * * * *")
    # Pretend the schedule was due 5 s ago (and forget its first occurrence):
    # those run now, each on its own second.
    later_db.execute("UPDATE later_schedule SET next_run_ms = next_run_ms - 6000")
    later_db.execute("DELETE FROM later_job")
    before = later_db.now_ms()
    fired = fire(later_db)
    after = later_db.now_ms()
    assert 6 <= fired <= 9
    assert fire(later_db) == 0, "a second pass finds nothing owed"
    rows = occurrences(later_db, "s")
    times = [run_at for _, _, run_at in rows]
    assert len(set(times)) == len(times) == fired
    assert all(t % SECOND == 0 for t in times)
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [SECOND] * (fired - 1)
    # Ready when due at its insert (on the database's clock), else delayed;
    # one due while the pass ran may be either.
    for _, stage, run_at in rows:
        if run_at <= before:
            assert stage == "enqueued"
        elif run_at > after:
            assert stage == "delayed"


def test_firing_after_downtime_runs_the_grace_window_and_one_for_the_rest(later_db, caplog):
    later.enqueue_recurring("s", Noop(n=1), "* * * * * *")
    later_db.execute("UPDATE later_schedule SET next_run_ms = next_run_ms - 3600000")
    fired = fire(later_db, ahead_ms=0, grace_ms=5 * SECOND)
    assert 6 <= fired <= 7
    assert "missed" in caplog.text and "RECURRING_MISSED_GRACE" in caplog.text


def test_two_servers_firing_at_once_enqueue_each_occurrence_once(later_db):
    """Many passes from many threads: the compare-and-swap lets one win each."""
    import threading

    later.enqueue_recurring("race", Noop(n=1), "* * * * * *")
    later_db.execute("UPDATE later_schedule SET next_run_ms = next_run_ms - 20000")
    later_db.execute("DELETE FROM later_job")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def racer() -> None:
        try:
            barrier.wait()
            for _ in range(5):
                try:
                    fire(later_db)
                except Exception as exc:  # SQLite: busy, retried next pass
                    if "locked" not in str(exc):
                        raise
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    times = [run_at for _, _, run_at in occurrences(later_db, "race")]
    assert len(times) == len(set(times)) >= 21
    assert [b - a for a, b in zip(times, times[1:], strict=False)] == [SECOND] * (len(times) - 1)


def test_firing_a_sequential_schedule_without_its_setting_waits_for_it(later_db, settings, caplog):
    """A server lacking RECURRING_SEQUENTIAL_PARTITIONS (a mixed rollout) leaves
    a sequential schedule untouched and says why, once; a server with the
    setting enqueues what the schedule owes."""
    set_later(settings, RECURRING_SEQUENTIAL_PARTITIONS=4)
    first = later.enqueue_recurring_sequential("ledger", Noop(n=1), "* * * * * *")
    # The schedule owes its fire times of the last 3 s and the next 2 s.
    later_db.execute("UPDATE later_schedule SET next_run_ms = next_run_ms - 3000")
    later_db.execute("DELETE FROM later_job")

    def state() -> list[tuple[Any, ...]]:
        return later_db.rows("SELECT next_run_ms, version, last_job_id FROM later_schedule")

    before = state()
    assert before[0][2] == first
    set_later(settings, RECURRING_SEQUENTIAL_PARTITIONS=None)
    with caplog.at_level(logging.INFO, logger="later_django.recurring.firing"):
        assert [fire(later_db) for _ in range(3)] == [0, 0, 0]
    assert state() == before, "nothing advanced"
    assert later_db.job_count() == 0
    waiting = [r for r in caplog.records if getattr(r, "schedule", None) == "ledger"]
    assert len(waiting) == 1, "one line, not one per tick"
    assert getattr(waiting[0], "action", None) == "schedule_error"
    assert "RECURRING_SEQUENTIAL_PARTITIONS" in waiting[0].getMessage()

    set_later(settings, RECURRING_SEQUENTIAL_PARTITIONS=4)
    fired = fire(later_db)
    assert fired >= 4
    rows = occurrences(later_db, "ledger")
    assert len(rows) == fired
    assert rows[0][2] == before[0][0], "the owed occurrence is enqueued, none lost"
    assert {later.get_job(job_id).topic for job_id, _, _ in rows} == {"later:recurring"}
    assert state()[0][2] == rows[-1][0]


def test_waiting_sequential_schedules_never_hold_back_a_plain_one(
    later_db, settings, caplog, monkeypatch
):
    """More sequential schedules than one read takes (DUE_BATCH), all more
    overdue than a plain one: a server without their setting still fires
    the plain schedule, and says which sequential ones wait."""
    # This process's memory of what it said waits (once an hour): afresh.
    monkeypatch.setattr(firing, "_waiting_logged", {})
    set_later(settings, RECURRING_SEQUENTIAL_PARTITIONS=4)
    for n in range(DUE_BATCH + 5):
        later.enqueue_recurring_sequential(f"ledger-{n:03}", Noop(n=n), "* * * * * *")
    later_db.execute("UPDATE later_schedule SET next_run_ms = next_run_ms - 10000")
    later.enqueue_recurring("beat", Noop(n=0), "* * * * * *")
    later_db.execute(
        "UPDATE later_schedule SET next_run_ms = next_run_ms - 3000 WHERE identifier = 'beat'"
    )
    later_db.execute("DELETE FROM later_job")
    set_later(settings, RECURRING_SEQUENTIAL_PARTITIONS=None)
    with caplog.at_level(logging.INFO, logger="later_django.recurring.firing"):
        fired = fire(later_db)
    assert fired >= 3
    assert len(occurrences(later_db, "beat")) == fired
    assert later_db.job_count() == fired, "no sequential occurrence was enqueued"
    waiting = {getattr(r, "schedule", None) for r in caplog.records}
    assert "ledger-000" in waiting and "beat" not in waiting


def test_a_server_runs_a_one_second_schedule_every_second(later_db, record, settings):
    """The maintenance tick is far longer than the cron's period: occurrences
    are enqueued ahead at the first tick and each is promoted when due, so
    one runs every second although no tick comes within the test."""
    set_later(settings, MAINTENANCE_INTERVAL=dt.timedelta(seconds=30))
    later.enqueue_recurring("beat", Noop(n=9), "* * * * * *")

    async def body(server: Any) -> None:
        async def six_ran() -> bool:
            return len(read_records(record, "noop")) >= 6

        await await_until(six_ran, 20, "six occurrences to run")

    serve(body, workers=2)
    later.remove_recurring("beat")
    runs = read_records(record, "noop")
    ids = [r.job_id for r in runs]
    assert len(ids) == len(set(ids)) >= 6
    fire_times = {job_id: run_at for job_id, _, run_at in occurrences(later_db, "beat")}
    for job_id in ids:
        started = later_db.job_field(job_id, "started_ms")
        # Never before its second, both on the database's clock.
        assert started >= fire_times[job_id], (started, fire_times[job_id])


# -- many servers, real processes ---------------------------------------------------
TIMINGS = {"LEASE_DURATION": 2, "STUCK_JOB_GRACE": 0.5, "MAINTENANCE_INTERVAL": 1.0}
HOUR = 3600.0


@pytest.mark.one_env
def test_worker_processes_enqueue_one_occurrence_per_second_through_kills_and_skew(
    later_db, workers
):
    """Three later_worker processes, two with wall clocks an hour ahead and
    behind, over a schedule that fires every second for 20 s; one is killed
    with SIGKILL half-way. Each second gets exactly one occurrence, due on
    its second, and none starts before it."""
    procs = [
        workers.start(timings=TIMINGS, workers=2),
        workers.start(timings=TIMINGS, workers=2, env={"LATER_TEST_CLOCK_SKEW": str(HOUR)}),
        workers.start(timings=TIMINGS, workers=2, env={"LATER_TEST_CLOCK_SKEW": str(-HOUR)}),
    ]
    workers.wait_registered(*procs)
    later.enqueue_recurring("every-second", Noop(n=1), "* * * * * *")

    def succeeded() -> int:
        return int(
            later_db.scalar(  # type: ignore[arg-type]
                "SELECT COUNT(*) FROM later_job WHERE recurring = %s AND stage = 'success'",
                ["every-second"],
            )
        )

    wait_until(lambda: succeeded() >= 8, 30, lambda: f"8 occurrences ran\n{workers.logs()}")
    os.kill(procs[0].pid, signal.SIGKILL)
    assert procs[0].proc.wait(10) == -signal.SIGKILL
    wait_until(lambda: succeeded() >= 20, 40, lambda: f"20 occurrences ran\n{workers.logs()}")
    later.remove_recurring("every-second")
    removed_at = later_db.now_ms()

    def settled() -> bool:
        stages = {stage for _, stage, _ in occurrences(later_db, "every-second")}
        return stages <= {"success", "cancelled"}

    wait_until(settled, 30, lambda: f"every occurrence to finish\n{workers.logs()}")
    rows = occurrences(later_db, "every-second")
    times = [run_at for _, _, run_at in rows]
    duplicates = [t for t, n in Counter(times).items() if n > 1]
    assert duplicates == [], f"fire times enqueued twice: {duplicates}"
    assert all(t % SECOND == 0 for t in times), times
    gaps = [(a, b) for a, b in zip(times, times[1:], strict=False) if b - a != SECOND]
    assert gaps == [], f"missing occurrences between {gaps}"
    ran = [(job_id, run_at) for job_id, stage, run_at in rows if stage == "success"]
    assert len(ran) >= 20
    # Only occurrences enqueued ahead and not due yet were cancelled.
    assert all(run_at > removed_at - SECOND for _, stage, run_at in rows if stage == "cancelled")
    recorded = {r.job_id for r in read_records(workers.record, "noop")}
    for job_id, run_at in ran:
        assert job_id in recorded
        started = later_db.job_field(job_id, "started_ms")
        assert started >= run_at, f"{job_id} started {run_at - started} ms early"
    # The skewed processes took part in running them.
    pids = {r.pid for r in read_records(workers.record, "noop")}
    assert {procs[1].pid, procs[2].pid} & pids, (pids, workers.logs())
