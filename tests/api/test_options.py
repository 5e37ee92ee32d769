"""EnqueueOptions: every enqueue argument checked once, when the options are
made; and every enqueue call, JobContext's included, makes one options object
and takes the one path. No database: nothing here may write."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import importlib
import re

import pytest

import later_django as later
from later_django.ids import new_job_id
from later_django.options import LATEST_RUN_AT_MS, UNSET, EnqueueOptions
from tests.jobapp.jobs import Noop

# The module, not the function of the same name that later_django exports.
enqueue_module = importlib.import_module("later_django.enqueue")

DELAY = dt.timedelta(seconds=90)
WHEN = dt.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
WHEN_MS = 1893553445678


def test_options_default_to_a_plain_job():
    """No argument: the type's priority, due at once, no parent."""
    options = EnqueueOptions()
    assert (options.priority, options.delay, options.at, options.after) == (
        None,
        UNSET,
        UNSET,
        UNSET,
    )
    assert (options.delay_ms, options.run_at_ms, options.parent_id) == (0, None, None)


def test_options_are_frozen_and_slotted():
    """An options object cannot change once checked, and carries no __dict__."""
    options = EnqueueOptions(priority=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.priority = 500  # type: ignore[misc]
    assert not hasattr(options, "__dict__")


def test_options_fill_the_derived_fields_in_a_newjobs_units():
    """delay and when become milliseconds; parent a lowercase job id."""
    parent = new_job_id()
    assert EnqueueOptions(delay=DELAY).delay_ms == 90_000
    assert EnqueueOptions(delay=dt.timedelta(milliseconds=1.9)).delay_ms == 1
    assert EnqueueOptions(at=WHEN).run_at_ms == WHEN_MS
    east = WHEN.astimezone(dt.timezone(dt.timedelta(hours=5)))
    assert EnqueueOptions(at=east).run_at_ms == WHEN_MS
    assert EnqueueOptions(after=parent.upper()).parent_id == parent
    assert EnqueueOptions(priority=-100).priority == -100
    assert EnqueueOptions(priority=100).priority == 100


@pytest.mark.parametrize("priority", [-101, 101, 1000])
def test_options_priority_out_of_range_raises_value_error(priority):
    """The message names the argument, its value and the range."""
    with pytest.raises(ValueError) as info:
        EnqueueOptions(priority=priority)
    assert str(info.value) == (
        f"priority={priority} is out of range; use -100..100 (higher runs first)"
    )


@pytest.mark.parametrize(("priority", "type_name"), [(True, "bool"), (1.5, "float"), ("1", "str")])
def test_options_priority_of_wrong_type_raises_type_error(priority, type_name):
    """A bool is refused too, though it is an int."""
    with pytest.raises(TypeError) as info:
        EnqueueOptions(priority=priority)
    assert str(info.value) == f"priority must be an int, got {type_name}"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"delay": None}, TypeError, "delay must be a datetime.timedelta, got NoneType"),
        ({"delay": 5}, TypeError, "delay must be a datetime.timedelta, got int"),
        (
            {"delay": dt.timedelta(seconds=-1)},
            ValueError,
            "delay=datetime.timedelta(days=-1, seconds=86399) is negative; use a timedelta >= 0",
        ),
        ({"at": None}, TypeError, "at must be a datetime, got NoneType"),
        ({"at": dt.date(2030, 1, 1)}, TypeError, "at must be a datetime, got date"),
        (
            {"at": dt.datetime(2030, 1, 1)},
            ValueError,
            "at=2030-01-01T00:00:00 is a naive datetime; pass an aware one "
            "(e.g. django.utils.timezone.now() + timedelta(...))",
        ),
        ({"after": None}, TypeError, "after must be a job id or a list of job ids, got NoneType"),
        (
            {"after": "nope"},
            ValueError,
            "after='nope' is not a job id: expected 26 characters of Crockford "
            "base32, as returned by enqueue()",
        ),
    ],
    ids=[
        "delay-none",
        "delay-int",
        "delay-negative",
        "at-none",
        "at-date",
        "at-naive",
        "after-none",
        "after-malformed",
    ],
)
def test_options_bad_argument_raises_naming_it(kwargs, error, message):
    """None is a bad value like any other: only leaving an option out means "none"."""
    with pytest.raises(error) as info:
        EnqueueOptions(**kwargs)
    assert type(info.value) is error
    assert str(info.value) == message


@pytest.mark.parametrize(
    "kwargs",
    [{"delay": dt.timedelta.max}, {"at": dt.datetime.max.replace(tzinfo=dt.UTC)}],
    ids=["delay", "at"],
)
def test_options_due_beyond_the_last_datetime_raises_value_error(kwargs):
    """A job due after 9999-12-30 could never be read back as a datetime."""
    with pytest.raises(ValueError, match=r"^the job would become due after 9999-12-30"):
        EnqueueOptions(**kwargs)


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        (5, TypeError, "timeout must be a datetime.timedelta, got int"),
        (dt.timedelta(0), ValueError, "timeout=datetime.timedelta(0) is not positive"),
        (dt.timedelta(microseconds=999), ValueError, "is not positive"),
    ],
    ids=["int", "zero", "under-a-millisecond"],
)
def test_options_timeout_is_a_positive_timedelta(timeout, error, message):
    with pytest.raises(error, match=re.escape(message)):
        EnqueueOptions(timeout=timeout)
    assert EnqueueOptions(timeout=dt.timedelta(seconds=1.5)).timeout_ms == 1500


def test_options_due_at_the_last_datetime_is_accepted():
    """The bound itself is allowed."""
    last = dt.datetime.fromtimestamp(LATEST_RUN_AT_MS / 1000, tz=dt.UTC)
    assert EnqueueOptions(at=last).run_at_ms == LATEST_RUN_AT_MS


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"delay": DELAY, "at": WHEN}, ("delay", "at")),
        ({"delay": DELAY, "after": "0" * 26}, ("after", "delay")),
        ({"at": WHEN, "after": "0" * 26}, ("after", "at")),
    ],
    ids=["delay-and-at", "delay-and-after", "at-and-after"],
)
def test_options_refuse_two_ways_of_becoming_due_naming_both(kwargs, names):
    """A job is due after a delay, at a time or after its parent: one of
    them. Two conflicting keywords are a TypeError that names both."""
    with pytest.raises(TypeError) as info:
        EnqueueOptions(**kwargs)
    assert str(info.value).startswith(f"{names[0]} and {names[1]} both say when the job runs")


def test_keyword_options_map_none_to_not_given_and_plain_to_the_shared_object():
    """The keyword API's None means "not given"; no keyword at all is the
    one shared plain options object (a plain enqueue builds none)."""
    from later_django.options import PLAIN, keyword_options

    assert keyword_options(priority=None, delay=None, at=None, after=None) is PLAIN
    options = keyword_options(priority=None, delay=DELAY, at=None, after=None)
    assert options == EnqueueOptions(delay=DELAY)
    with pytest.raises(TypeError, match="^delay and at both"):
        keyword_options(priority=None, delay=DELAY, at=WHEN, after=None)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"delay": -DELAY, "priority": 500}, ValueError, "delay="),
        ({"at": dt.datetime(2030, 1, 1), "priority": 500}, ValueError, "at="),
        ({"after": "nope", "priority": True}, ValueError, "after="),
    ],
    ids=["delay", "at", "after"],
)
def test_options_check_timing_and_parent_before_priority(kwargs, error, message):
    """Two bad arguments raise the error the enqueue calls always raised first."""
    with pytest.raises(error, match=f"^{message}"):
        EnqueueOptions(**kwargs)


# -- every enqueue call goes through enqueue_with / enqueue_many_with --


@pytest.fixture
def taken_path(monkeypatch):
    """Record the options each enqueue call hands to the one path, instead of writing."""
    calls: list[tuple[str, object, EnqueueOptions]] = []

    def enqueue_with(payload, options):
        calls.append(("one", payload, options))
        return "job"

    def enqueue_many_with(payloads, options):
        calls.append(("many", list(payloads), options))
        return ["job"]

    monkeypatch.setattr(enqueue_module, "enqueue_with", enqueue_with)
    monkeypatch.setattr(enqueue_module, "enqueue_many_with", enqueue_many_with)
    return calls


PARENT = new_job_id()
ctx = later.JobContext(job_id=new_job_id(), attempt=1)
CALLS = [
    # (name, call, expected path, expected options)
    ("enqueue", lambda p: later.enqueue(p), "one", EnqueueOptions()),
    (
        "enqueue/delay",
        lambda p: later.enqueue(p, delay=DELAY, priority=2),
        "one",
        EnqueueOptions(priority=2, delay=DELAY),
    ),
    ("enqueue/at", lambda p: later.enqueue(p, at=WHEN), "one", EnqueueOptions(at=WHEN)),
    (
        "enqueue/after",
        lambda p: later.enqueue(p, after=PARENT),
        "one",
        EnqueueOptions(after=PARENT),
    ),
    (
        "enqueue_many/delay",
        lambda p: later.enqueue_many([p], delay=DELAY),
        "many",
        EnqueueOptions(delay=DELAY),
    ),
    (
        "ctx.enqueue/after",
        lambda p: ctx.enqueue(p, after=PARENT, priority=1),
        "one",
        EnqueueOptions(priority=1, after=PARENT),
    ),
    (
        "ctx.aenqueue/at",
        lambda p: asyncio.run(ctx.aenqueue(p, at=WHEN)),
        "one",
        EnqueueOptions(at=WHEN),
    ),
    ("enqueue/priority", lambda p: later.enqueue(p, priority=3), "one", EnqueueOptions(priority=3)),
    (
        "enqueue_many",
        lambda p: later.enqueue_many([p], priority=-2),
        "many",
        EnqueueOptions(priority=-2),
    ),
    (
        "enqueue_delayed",
        lambda p: later.enqueue_delayed(p, DELAY, priority=1),
        "one",
        EnqueueOptions(priority=1, delay=DELAY),
    ),
    (
        "enqueue_delayed_at",
        lambda p: later.enqueue_delayed_at(p, WHEN),
        "one",
        EnqueueOptions(at=WHEN),
    ),
    (
        "enqueue_continue",
        lambda p: later.enqueue_continue(PARENT, p, priority=5),
        "one",
        EnqueueOptions(priority=5, after=PARENT),
    ),
    (
        "aenqueue",
        lambda p: asyncio.run(later.aenqueue(p, priority=4)),
        "one",
        EnqueueOptions(priority=4),
    ),
    (
        "aenqueue_delayed_at",
        lambda p: asyncio.run(later.aenqueue_delayed_at(p, WHEN, priority=2)),
        "one",
        EnqueueOptions(priority=2, at=WHEN),
    ),
    ("ctx.enqueue", lambda p: ctx.enqueue(p, priority=7), "one", EnqueueOptions(priority=7)),
    ("ctx.enqueue_many", lambda p: ctx.enqueue_many([p]), "many", EnqueueOptions()),
    (
        "ctx.enqueue_delayed",
        lambda p: ctx.enqueue_delayed(p, DELAY),
        "one",
        EnqueueOptions(delay=DELAY),
    ),
    (
        "ctx.enqueue_delayed_at",
        lambda p: ctx.enqueue_delayed_at(p, WHEN, priority=-1),
        "one",
        EnqueueOptions(priority=-1, at=WHEN),
    ),
    (
        "ctx.enqueue_continue",
        lambda p: ctx.enqueue_continue(PARENT, p),
        "one",
        EnqueueOptions(after=PARENT),
    ),
    (
        "ctx.aenqueue_continue",
        lambda p: asyncio.run(ctx.aenqueue_continue(PARENT, p, priority=9)),
        "one",
        EnqueueOptions(priority=9, after=PARENT),
    ),
    (
        "ctx.aenqueue_many",
        lambda p: asyncio.run(ctx.aenqueue_many([p], priority=8)),
        "many",
        EnqueueOptions(priority=8),
    ),
]


@pytest.mark.parametrize(
    ("call", "path", "expected"), [c[1:] for c in CALLS], ids=[c[0] for c in CALLS]
)
def test_enqueue_calls_make_one_options_object_and_take_the_one_path(
    taken_path, call, path, expected
):
    """Public calls and JobContext's differ only in the options they make."""
    payload = Noop(n=1)
    call(payload)
    [(taken, arrived, options)] = taken_path
    assert taken == path
    assert arrived in (payload, [payload])
    assert options == expected
    assert (options.delay_ms, options.run_at_ms, options.parent_id) == (
        expected.delay_ms,
        expected.run_at_ms,
        expected.parent_id,
    )
