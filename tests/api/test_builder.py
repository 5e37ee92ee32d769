"""JobBuilder: payload and options in, NewJob row out, checked as enqueue checks
it; settings and per-type facts read once per builder. No database."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

import pytest

from later_django import codec, registry
from later_django.builder import JobBuilder
from later_django.exceptions import NotRegistered, PayloadTooLarge
from later_django.ids import new_job_id, new_job_ids
from later_django.options import EnqueueOptions
from later_django.retry import RetryPolicy
from later_django.types import NewJob
from tests.helpers import set_later
from tests.jobapp.jobs import CallablePolicy, Item, Noop, Order, Sleep

ULID = re.compile(r"^[0-9a-hjkmnp-tv-z]{26}$")
PLAIN = EnqueueOptions()


@dataclass
class Unregistered:
    n: int = 0


def test_builder_build_makes_the_row_of_a_plain_job():
    """A plain job: a fresh id, the type's stored name, the encoded payload, priority 0."""
    job = JobBuilder().build(Noop(n=7), PLAIN)
    assert ULID.match(job.id)
    assert job == NewJob(
        id=job.id,
        namespace="default",
        type_name="tests.jobapp.jobs.Noop",
        payload=codec.encode(Noop(n=7)),
        priority=0,
        retry_policy=None,
        parent_id=None,
        run_at_ms=None,
        delay_ms=0,
    )
    assert codec.decode(job.payload, Noop) == Noop(n=7)


def test_builder_build_takes_the_options_and_the_given_id():
    """Priority, delay, time and parent come from the options; the id from the caller."""
    job_id, parent = new_job_id(), new_job_id()
    when = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    builder = JobBuilder()
    delayed = builder.build(
        Noop(), EnqueueOptions(priority=-4, delay=dt.timedelta(seconds=2)), job_id=job_id
    )
    assert (delayed.id, delayed.priority, delayed.delay_ms, delayed.run_at_ms) == (
        job_id,
        -4,
        2000,
        None,
    )
    at = builder.build(Noop(), EnqueueOptions(at=when))
    assert (at.run_at_ms, at.delay_ms) == (int(when.timestamp() * 1000), 0)
    child = builder.build(Noop(), EnqueueOptions(priority=9, after=parent.upper()))
    assert (child.parent_id, child.priority) == (parent, 9)


def test_builder_build_stores_the_handlers_static_retry_policy():
    """A RetryPolicy given to @job is stored as JSON; a callable or none stores NULL."""
    builder = JobBuilder()
    assert (
        builder.build(Sleep(seconds=0), PLAIN).retry_policy
        == RetryPolicy.fixed(3, dt.timedelta(milliseconds=100)).to_json()
    )
    assert builder.build(CallablePolicy(), PLAIN).retry_policy is None
    assert builder.build(Noop(), PLAIN).retry_policy is None


def test_builder_reads_settings_once_when_made(settings):
    """A builder keeps the namespace and size limit it was made with; the next
    builder sees a change."""
    builder = JobBuilder()
    set_later(settings, NAMESPACE="elsewhere", MAX_PAYLOAD_BYTES=10)
    assert builder.build(Order(id=1, note="x" * 20), PLAIN).namespace == "default"
    assert JobBuilder().build(Noop(), PLAIN).namespace == "elsewhere"
    with pytest.raises(PayloadTooLarge):
        JobBuilder().build(Order(id=1, note="x" * 20), PLAIN)


def test_builder_looks_up_each_payload_type_once(monkeypatch):
    """A batch of thousands of payloads of two types looks up two handlers."""
    looked_up: list[type] = []
    find = registry.handler_for_payload

    def counting(payload):
        looked_up.append(type(payload))
        return find(payload)

    monkeypatch.setattr(registry, "handler_for_payload", counting)
    payloads = [Noop(n=i) if i % 2 else Order(id=i) for i in range(2000)]
    jobs = list(JobBuilder().build_many(payloads, PLAIN, new_job_ids(len(payloads))))
    assert len(jobs) == 2000
    assert sorted(t.__name__ for t in looked_up) == ["Noop", "Order"]


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        (
            "text",
            TypeError,
            "payload must be a dataclass instance, got str; declare the payload type "
            "with @dataclass and register a @job handler for it",
        ),
        (
            Noop,
            TypeError,
            "payload must be a dataclass instance, got type; declare the payload type "
            "with @dataclass and register a @job handler for it",
        ),
        (
            Unregistered(),
            NotRegistered,
            "tests.api.test_builder.Unregistered has no @job handler; define one in a jobs.py "
            "module of an installed app (or import the module defining it)",
        ),
        (Order(id=1, note={1}), TypeError, "payload.note"),
        (Noop(n=1 << 64), TypeError, "payload.n"),
    ],
    ids=["str", "class", "unregistered", "unsupported-value", "huge-int"],
)
def test_builder_build_refuses_a_bad_payload(payload, error, message):
    """The errors and messages of the enqueue calls, raised before any row exists."""
    with pytest.raises(error) as info:
        JobBuilder().build(payload, PLAIN)
    assert type(info.value) is error
    assert message in str(info.value)


def test_builder_build_refuses_a_value_that_does_not_match_its_annotation():
    """A value the worker could not decode names the payload class."""
    with pytest.raises(TypeError) as info:
        JobBuilder().build(Order(id="one"), PLAIN)  # type: ignore[arg-type]
    assert type(info.value) is TypeError
    assert str(info.value).endswith(" — the value does not match the annotation of Order")
    assert isinstance(info.value.__cause__, codec.PayloadDecodeError)


def test_builder_build_refuses_a_payload_above_the_limit(settings):
    """The limit is inclusive; above it, PayloadTooLarge names the size and the setting."""
    fits = Order(id=1, note="x" * 40)
    size = len(codec.encode(fits))
    set_later(settings, MAX_PAYLOAD_BYTES=size)
    JobBuilder().build(fits, PLAIN)
    with pytest.raises(PayloadTooLarge) as info:
        JobBuilder().build(Order(id=1, note="x" * 41), PLAIN)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        f"payload of tests.jobapp.jobs.Order encodes to {size + 1} bytes, above "
        f"LATER['MAX_PAYLOAD_BYTES']={size}; store large data elsewhere and pass a "
        "reference"
    )


def test_builder_build_many_gives_each_row_the_id_of_its_index():
    """Rows come out in the order of the payloads, with the ids of the same index."""
    payloads = [Noop(n=0), Order(id=1, items=[Item(name="a", qty=2)]), Noop(n=2)]
    ids = new_job_ids(3)
    jobs = list(JobBuilder().build_many(payloads, EnqueueOptions(priority=6), ids))
    assert [job.id for job in jobs] == ids
    assert [job.priority for job in jobs] == [6, 6, 6]
    assert codec.decode(jobs[1].payload, Order) == payloads[1]


def test_builder_build_many_builds_lazily_and_names_the_bad_index():
    """Rows before a bad payload are yielded first; its error keeps its class and
    gets the position in front of its message."""
    payloads = [Noop(n=0), Noop(n=1), Unregistered(), Noop(n=3)]
    rows = JobBuilder().build_many(payloads, PLAIN, new_job_ids(4))
    assert [next(rows).payload, next(rows).payload] == [
        codec.encode(Noop(n=0)),
        codec.encode(Noop(n=1)),
    ]
    with pytest.raises(NotRegistered) as info:
        next(rows)
    assert str(info.value).startswith("payloads[2]: tests.api.test_builder.Unregistered has no")


def test_builder_build_many_needs_an_id_per_payload():
    """Ids and payloads of different lengths are a caller's bug, not a short batch."""
    with pytest.raises(ValueError, match="zip"):
        list(JobBuilder().build_many([Noop(), Noop()], PLAIN, new_job_ids(1)))
