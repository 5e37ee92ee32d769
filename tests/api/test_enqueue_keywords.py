"""enqueue()'s keywords (priority, delay, at, after) on every call that
takes them, on both databases: what they store, what conflicts, and that a
call that raises writes nothing."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import transaction

import later_django as later
from later_django import registry
from later_django.exceptions import JobNotFound
from tests.jobapp.jobs import Noop, Urgent

HOUR = dt.timedelta(hours=1)


class Rollback(Exception):
    pass


def priority_of(later_db, job_id: str) -> int:
    return int(later_db.scalar("SELECT priority FROM later_job WHERE id = %s", [job_id]))


def test_enqueue_keywords_delay_at_and_after_store_what_the_wrappers_store(later_db):
    """enqueue(delay=), enqueue(at=) and enqueue(after=) are the jobs
    enqueue_delayed, enqueue_delayed_at and enqueue_continue make."""
    parent = later.enqueue(Noop(n=0))
    past = dt.datetime.now(dt.UTC) - HOUR
    jobs = {
        "delay": later.enqueue(Noop(n=1), delay=HOUR),
        "at-future": later.enqueue(Noop(n=2), at=dt.datetime.now(dt.UTC) + HOUR),
        "at-past": later.enqueue(Noop(n=3), at=past),
        "after": later.enqueue(Noop(n=4), after=parent),
        "wrapper-delay": later.enqueue_delayed(Noop(n=5), HOUR),
        "wrapper-after": later.enqueue_continue(parent, Noop(n=6)),
    }
    stages = {name: later_db.stage_of(job_id) for name, job_id in jobs.items()}
    assert stages == {
        "delay": "delayed",
        "at-future": "delayed",
        "at-past": "enqueued",
        "after": "waiting",
        "wrapper-delay": "delayed",
        "wrapper-after": "waiting",
    }
    info = later.get_job(jobs["after"])
    assert info is not None and info.parent_id == parent


def test_conflicting_keywords_raise_type_error_naming_both_and_write_nothing(later_db):
    parent = later.enqueue(Noop(n=0))
    counts = later.stage_counts()
    when = dt.datetime.now(dt.UTC) + HOUR
    calls = [
        (lambda: later.enqueue(Noop(), delay=HOUR, at=when), "delay and at"),
        (lambda: later.enqueue(Noop(), delay=HOUR, after=parent), "after and delay"),
        (lambda: later.enqueue_in(Noop(), at=when, after=parent), "after and at"),
        (lambda: later.enqueue_many([Noop()], delay=HOUR, at=when), "delay and at"),
        (lambda: later.enqueue_to_partition(Noop(), delay=HOUR, at=when), "delay and at"),
    ]
    with transaction.atomic(using=later_db.alias):
        for call, names in calls:
            with pytest.raises(TypeError, match=f"^{names} both say when the job runs"):
                call()
    assert later.stage_counts() == counts


def test_job_priority_is_the_default_an_enqueue_priority_overrides(later_db):
    """@job(priority=7) is its jobs' priority unless the call gives one (0 included)."""
    default = later.enqueue(Urgent(n=1))
    zero = later.enqueue(Urgent(n=2), priority=0)
    lower = later.enqueue_delayed(Urgent(n=3), HOUR, priority=-3)
    [bulk] = later.enqueue_many([Urgent(n=4)])
    plain = later.enqueue(Noop(n=5))
    assert [priority_of(later_db, j) for j in (default, zero, lower, bulk, plain)] == [
        7,
        0,
        -3,
        7,
        0,
    ]


def test_job_priority_out_of_range_is_refused_when_the_handler_registers():
    with pytest.raises(ValueError, match=r"^@job\(\.\.\.\) of .*priority=500"):

        @later.job(priority=500)
        def handler(ctx: later.JobContext, payload: Noop) -> None: ...

    assert registry.handler_for_payload(Noop()).func.__name__ == "run_noop"


def test_enqueue_many_with_a_delay_writes_every_job_delayed_or_none(later_db):
    """Delayed jobs and continuations in bulk: each its own insert, all in
    one transaction; a bad payload part-way writes nothing."""
    ids = later.enqueue_many([Noop(n=i) for i in range(5)], delay=HOUR, priority=2)
    assert [later_db.stage_of(job_id) for job_id in ids] == ["delayed"] * 5
    assert {priority_of(later_db, job_id) for job_id in ids} == {2}
    counts = later.stage_counts()
    with pytest.raises(TypeError, match=r"^payloads\[2\]: "):
        later.enqueue_many([Noop(n=1), Noop(n=2), Noop(n="x"), Noop(n=4)], delay=HOUR)  # type: ignore[arg-type]
    assert later.stage_counts() == counts


def test_enqueue_many_after_a_parent_waits_for_it_and_a_missing_parent_writes_nothing(
    later_db,
):
    parent = later.enqueue(Noop(n=0))
    children = later.enqueue_many([Noop(n=1), Noop(n=2)], after=parent)
    assert [later_db.stage_of(child) for child in children] == ["waiting", "waiting"]
    counts = later.stage_counts()
    missing = "0" * 26
    with pytest.raises(JobNotFound):
        later.enqueue_many([Noop(n=3), Noop(n=4)], after=missing)
    assert later.stage_counts() == counts


def test_enqueue_many_with_a_delay_rolls_back_with_the_callers_transaction(later_db):
    counts = later.stage_counts()
    with pytest.raises(Rollback), transaction.atomic(using=later_db.alias):
        later.enqueue_many([Noop(n=1), Noop(n=2)], delay=HOUR)
        raise Rollback
    assert later.stage_counts() == counts


def test_job_context_passes_every_keyword_on(later_db):
    ctx = later.JobContext(job_id=later.enqueue(Noop(n=0)), attempt=1)
    delayed = ctx.enqueue(Noop(n=1), delay=HOUR, priority=4)
    child = ctx.enqueue(Noop(n=2), after=ctx.job_id)
    assert (later_db.stage_of(delayed), priority_of(later_db, delayed)) == ("delayed", 4)
    assert later_db.stage_of(child) == "waiting"


def test_a_timeout_given_at_enqueue_is_stored_and_none_is_null(later_db):
    """The row keeps an enqueue's own timeout, in every way of enqueueing;
    the handler's @job(timeout=) is read when the job runs, not stored."""
    parent = later.enqueue(Noop(n=0))
    second = dt.timedelta(seconds=1)
    jobs = [
        later.enqueue(Noop(n=1), timeout=second),
        later.enqueue(Noop(n=2), timeout=second, after=parent),
        *later.enqueue_many([Noop(n=3), Noop(n=4)], timeout=second),
    ]
    plain = later.enqueue(Noop(n=5))
    stored = [
        later_db.scalar("SELECT timeout_ms FROM later_job WHERE id = %s", [job_id])
        for job_id in [*jobs, plain]
    ]
    assert stored == [1000, 1000, 1000, 1000, None]
    with pytest.raises(ValueError, match="is not positive"):
        later.enqueue(Noop(n=6), timeout=dt.timedelta(0))


def test_job_timeout_must_be_a_positive_timedelta_when_the_handler_registers():
    with pytest.raises(
        TypeError, match=r"^@job\(\.\.\.\) of .*timeout must be a datetime.timedelta"
    ):

        @later.job(timeout=30)  # type: ignore[arg-type]
        def handler(ctx: later.JobContext, payload: Noop) -> None: ...
