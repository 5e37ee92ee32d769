"""The @job registry: one handler per payload type, found by type and by name."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pytest
from django.core.exceptions import ImproperlyConfigured

import later_django as later
from later_django import registry
from later_django.exceptions import AlreadyRegistered
from tests.jobapp.jobs import Noop, run_noop


@dataclass
class Greeting:
    name: str


@dataclass
class Farewell:
    name: str


@dataclass
class Unregistered:
    n: int = 0


@pytest.fixture
def cleanup():
    """Unregister every payload type a test registers, even when it fails."""
    types: list[type] = [Greeting, Farewell]
    yield types
    for payload_type in types:
        registry.unregister(payload_type)


def test_job_registers_a_handler_under_the_default_name(cleanup):
    """@job takes the payload type from the annotation; the name is module.QualName."""

    @later.job
    def greet(ctx: later.JobContext, payload: Greeting) -> None:
        pass

    handler = registry.handler_for_payload(Greeting(name="ada"))
    assert handler.func is greet
    assert handler.payload_type is Greeting
    assert handler.name == "tests.api.test_registry.Greeting"
    assert handler.is_async is False
    assert registry.handler_by_name("tests.api.test_registry.Greeting") is handler


def test_job_registers_an_async_handler_with_a_custom_name_and_policy(cleanup):
    """@job(name=..., retry=...) stores that name and policy; async handlers are flagged."""
    policy = later.RetryPolicy.fixed(2, dt.timedelta(seconds=1))

    @later.job(name="greeting.v2", retry=policy)
    async def greet(ctx: later.JobContext, payload: Greeting) -> None:
        pass

    handler = registry.handler_by_name("greeting.v2")
    assert handler is not None and handler.func is greet
    assert handler.is_async is True
    assert handler.static_policy() == policy
    assert registry.handler_by_name("tests.api.test_registry.Greeting") is None


def test_job_stores_the_handler_name_and_policy_with_the_job(later_db, cleanup):
    """An enqueued job carries the registered name and its static retry policy."""
    policy = later.RetryPolicy.no_retries()

    @later.job(name="greeting.v2", retry=policy)
    def greet(ctx: later.JobContext, payload: Greeting) -> None:
        pass

    job_id = later.enqueue(Greeting(name="ada"))
    assert later.get_job(job_id).type_name == "greeting.v2"
    stored = later_db.scalar("SELECT retry_policy FROM later_job WHERE id = %s", [job_id])
    assert later.RetryPolicy.from_json(str(stored)) == policy


def test_job_second_handler_for_a_type_raises_already_registered(cleanup):
    """A second handler for a registered type fails at decoration; the first stays."""
    with pytest.raises(AlreadyRegistered) as info:

        @later.job
        def other_noop(ctx: later.JobContext, payload: Noop) -> None:
            pass

    message = str(info.value)
    assert "tests.jobapp.jobs.Noop" in message
    assert "tests.jobapp.jobs.run_noop" in message
    assert "other_noop" in message
    assert isinstance(info.value, ImproperlyConfigured)
    assert registry.handler_for_payload(Noop()).func is run_noop


def test_job_second_handler_with_a_taken_name_raises_already_registered(cleanup):
    """Two payload types cannot share one stored name."""

    @later.job(name="shared.name")
    def greet(ctx: later.JobContext, payload: Greeting) -> None:
        pass

    with pytest.raises(AlreadyRegistered, match="shared.name"):

        @later.job(name="shared.name")
        def part(ctx: later.JobContext, payload: Farewell) -> None:
            pass

    assert registry.handler_by_name("shared.name").func is greet
    with pytest.raises(later.NotRegistered):
        registry.handler_for_payload(Farewell(name="x"))


def test_job_registering_the_same_function_again_is_allowed(cleanup):
    """Decorating the same function twice (a module reload) is not a conflict."""

    def greet(ctx: later.JobContext, payload: Greeting) -> None:
        pass

    later.job(greet)
    later.job(greet)
    assert registry.handler_for_payload(Greeting(name="x")).func is greet


def test_unregister_removes_the_handler(cleanup):
    """After unregister the type and its name are unknown again."""

    @later.job
    def greet(ctx: later.JobContext, payload: Greeting) -> None:
        pass

    registry.unregister(Greeting)
    assert registry.handler_by_name("tests.api.test_registry.Greeting") is None
    with pytest.raises(later.NotRegistered):
        registry.handler_for_payload(Greeting(name="x"))


def test_registry_any_queue_follows_registrations(cleanup):
    """any_queue() says whether some registered type names a queue, through
    registering, registering the same function again without one, and
    unregistering."""

    def named_queue() -> bool:
        return any(handler.queue is not None for handler in registry.handlers())

    before = named_queue()

    @later.job
    def greet(ctx: later.JobContext, payload: Greeting) -> None:
        pass

    assert registry.any_queue() is named_queue() is before

    def bid(ctx: later.JobContext, payload: Farewell) -> None:
        pass

    later.job(queue="emails")(bid)
    assert registry.any_queue() is named_queue() is True
    later.job(bid)  # a module reload that dropped the queue
    assert registry.any_queue() is named_queue() is before
    later.job(queue="emails")(bid)
    registry.unregister(Farewell)
    assert registry.any_queue() is named_queue() is before


def test_job_refuses_a_handler_with_the_wrong_parameters():
    """A handler must take (ctx, payload); the error names the function."""
    with pytest.raises(TypeError, match=r"lonely must take \(ctx, payload\), got 1"):

        @later.job
        def lonely(payload: Greeting) -> None:
            pass

    assert registry.handler_by_name("tests.api.test_registry.Greeting") is None


def _int_payload(ctx: later.JobContext, payload: int) -> None:
    pass


def _dict_payload(ctx: later.JobContext, payload: dict[str, int]) -> None:
    pass


def _unannotated(ctx, payload):  # type: ignore[no-untyped-def]
    pass


@pytest.mark.parametrize("handler", [_int_payload, _dict_payload, _unannotated])
def test_job_refuses_a_payload_that_is_not_a_dataclass(handler):
    """The payload parameter must be annotated with a dataclass type."""
    with pytest.raises(TypeError, match=r"annotate its payload parameter 'payload'") as info:
        later.job(handler)
    assert handler.__name__ in str(info.value)


def test_job_refuses_a_retry_that_is_not_a_policy(cleanup):
    """retry must be a RetryPolicy or a callable; the error names the handler."""
    with pytest.raises(TypeError, match=r"greet must be a RetryPolicy"):

        @later.job(retry=3)  # type: ignore[call-overload]
        def greet(ctx: later.JobContext, payload: Greeting) -> None:
            pass

    assert registry.handler_by_name("tests.api.test_registry.Greeting") is None


def test_enqueue_of_an_unregistered_type_raises_not_registered(later_db):
    """Every enqueue form refuses a payload type without a handler, writing nothing."""
    parent = later.enqueue(Noop())
    calls = [
        lambda: later.enqueue(Unregistered()),
        lambda: later.enqueue_many([Noop(), Unregistered()]),
        lambda: later.enqueue_delayed(Unregistered(), dt.timedelta(seconds=5)),
        lambda: later.enqueue_continue(parent, Unregistered()),
    ]
    for call in calls:
        with pytest.raises(later.NotRegistered) as info:
            call()
        assert isinstance(info.value, TypeError)
        assert "tests.api.test_registry.Unregistered has no @job handler" in str(info.value)
    assert later_db.job_count() == 1


def test_job_re_registering_a_handler_under_a_taken_name_raises_already_registered(cleanup):
    """Re-decorating a registered function cannot take another type's name."""

    @later.job(name="shared.name")
    def greet(ctx: later.JobContext, payload: Greeting) -> None:
        pass

    def part(ctx: later.JobContext, payload: Farewell) -> None:
        pass

    later.job(part)
    with pytest.raises(AlreadyRegistered, match="shared.name"):
        later.job(name="shared.name")(part)
    assert registry.handler_by_name("shared.name").func is greet
    assert registry.handler_for_payload(Farewell(name="x")).func is part


def test_registry_autodiscover_skips_apps_without_the_module():
    """A module name that no app has imports nothing and raises nothing."""
    registry.autodiscover("no_such_jobs_module")


def test_registry_autodiscover_raises_the_error_inside_an_existing_module():
    """A jobs module that exists but fails to import is not mistaken for a
    missing one: its own error propagates."""
    with pytest.raises(ModuleNotFoundError, match="tests.jobapp.no_such_module"):
        registry.autodiscover("broken_jobs")


@pytest.mark.parametrize("name", ["jobs", "tasks.handlers", "_private"])
def test_registry_is_module_name_accepts_dotted_identifiers(name):
    assert registry.is_module_name(name)


@pytest.mark.parametrize("name", ["", "shop/jobs", ".jobs", "jobs.", "1jobs", None, 5])
def test_registry_is_module_name_refuses_anything_else(name):
    assert not registry.is_module_name(name)
