"""The events hook: who subscribes gets what happened, and nobody pays when nobody listens."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import later_django as later
from later_django import events
from tests.helpers import await_record, await_stage, await_until, in_thread, serve, set_later
from tests.jobapp.jobs import AsyncHold, Flaky, Noop, NoRetry
from tests.worker.test_job_leases import _take_over


@pytest.fixture
def seen() -> Iterator[list[events.Event]]:
    got: list[events.Event] = []
    unsubscribe = events.subscribe(got.append)
    try:
        yield got
    finally:
        unsubscribe()
    assert not events.active, "every test subscriber unsubscribed"


# -- the hook itself (no database) ------------------------------------------------
def test_subscribers_get_the_events_of_their_kind_only():
    everything: list[events.Event] = []
    finished: list[events.Event] = []
    assert not events.active
    stop_finished = events.subscribe(finished.append, events.JobFinished)
    assert events.active
    # Sites that emit on every job build only events somebody listens to.
    assert events.listening == {events.JobFinished}
    stop_all = events.subscribe(everything.append)
    assert events.JobStarted in events.listening and events.ServerStopped in events.listening
    started = events.JobStarted("j1", "T", 1, waited=0.0, worker=0, server_id="s")
    done = events.JobFinished(
        "j1",
        "T",
        1,
        outcome="succeeded",
        handler_seconds=0.1,
        since_created=0.2,
        waited=0.05,
        worker=0,
        server_id="s",
    )
    events.emit(started)
    events.emit(done)
    stop_finished()
    events.emit(done)
    stop_all()
    assert not events.active, "no subscriber left: emitting sites build nothing"
    assert events.listening == frozenset()
    events.emit(started)
    assert everything == [started, done, done]
    assert finished == [done]


def test_a_failing_subscriber_does_not_stop_the_others(caplog):
    def broken(event: events.Event) -> None:
        raise RuntimeError("subscriber bug")

    got: list[events.Event] = []
    stops = [events.subscribe(broken), events.subscribe(got.append)]
    event = events.ServerStarted("s", "default", 2)
    try:
        events.emit(event)
    finally:
        for stop in stops:
            stop()
    assert got == [event]
    assert "an events subscriber failed on ServerStarted" in caplog.text


def test_subscribe_refuses_what_is_not_an_event_class():
    with pytest.raises(TypeError, match="kind must be an event class"):
        events.subscribe(print, str)  # type: ignore[arg-type]
    assert not events.active


# -- from a running server ----------------------------------------------------------
def test_a_server_reports_starts_outcomes_and_its_own_life(later_db, record, seen, settings):
    set_later(settings, MAINTENANCE_INTERVAL=timedelta(milliseconds=100))
    ok = later.enqueue(Noop(n=1))
    flaky = later.enqueue(Flaky(succeed_on=2))
    refused = later.enqueue(NoRetry())

    async def body(server: Any) -> str:
        for job_id in (ok, flaky):
            await await_stage(job_id, "success")
        await await_stage(refused, "failed")
        return str(server.server_id)

    server_id = serve(body, workers=2)
    enqueued = [e.job_id for e in seen if isinstance(e, events.JobEnqueued)]
    assert enqueued == [ok, flaky, refused]
    seen[:] = [e for e in seen if not isinstance(e, events.JobEnqueued)]
    kinds = [type(event).__name__ for event in seen]
    assert kinds[0] == "ServerStarted" and kinds[-1] == "ServerStopped"
    started = [e for e in seen if isinstance(e, events.JobStarted)]
    finished = [e for e in seen if isinstance(e, events.JobFinished)]
    assert sorted((e.job_id, e.attempt) for e in started) == sorted(
        [(ok, 1), (flaky, 1), (flaky, 2), (refused, 1)]
    )
    assert sorted((e.job_id, e.attempt, e.outcome) for e in finished) == sorted(
        [(ok, 1, "succeeded"), (flaky, 1, "retry"), (flaky, 2, "succeeded"), (refused, 1, "failed")]
    )
    assert all(e.server_id == server_id for e in started + finished)
    assert all(e.job_type.startswith("tests.jobapp.jobs.") for e in started + finished)
    assert all(e.handler_seconds >= 0 for e in finished)
    # Each attempt starts before its outcome is stored.
    for event in finished:
        start = next(e for e in started if (e.job_id, e.attempt) == (event.job_id, event.attempt))
        assert seen.index(start) < seen.index(event)
    stopped = seen[-1]
    assert isinstance(stopped, events.ServerStopped) and stopped.processed == 4


def test_a_lost_lease_is_reported(later_db, record, seen, settings):
    set_later(settings, LEASE_DURATION=timedelta(seconds=90))
    job_id = later.enqueue(AsyncHold(seconds=60, then=60))

    async def body(server: Any) -> None:
        await await_record(record, "hold-start", job_id)
        await in_thread(_take_over, later_db.alias, job_id, 1)
        assert await server.leases.renew() == [(job_id, 1)]

        async def reported() -> bool:
            return any(isinstance(e, events.LeaseLost) for e in seen)

        await await_until(reported, 10, "the lost lease to be reported")

    serve(body, workers=1)
    lost = [e for e in seen if isinstance(e, events.LeaseLost)]
    assert (lost[0].job_id, lost[0].attempt) == (job_id, 1)
    assert "another server recovered it" in lost[0].why


def test_nothing_is_built_when_nobody_listens(later_db, record, monkeypatch):
    """An event nobody subscribed to is never even constructed, also while a
    server runs (its dashboard figures listen to JobStarted and JobFinished
    only): a handler's enqueue pays nothing for the events hook."""
    built: list[str] = []
    for name in ("JobEnqueued", "ServerStarted", "ServerStopped"):
        original = getattr(events, name)

        def spy(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            built.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(events, name, spy)
    job_id = later.enqueue(Noop(n=1))

    async def body(server: Any) -> None:
        await await_stage(job_id, "success")
        assert events.JobEnqueued not in events.listening
        chained = await in_thread(later.enqueue_continue, job_id, Noop(n=2))
        await await_stage(chained, "success")

    serve(body, workers=1)
    assert built == []


# -- from enqueue --------------------------------------------------------------------
def test_enqueues_are_told_when_they_commit_never_when_rolled_back(later_db, seen):
    from django.db import transaction

    with transaction.atomic(using=later_db.alias):
        kept = later.enqueue(Noop(n=1))
        assert seen == [], "nothing is told before the commit"
    delayed = later.enqueue_delayed(Noop(n=2), timedelta(hours=1))
    child = later.enqueue_continue(kept, Noop(n=3))
    bulk = later.enqueue_many([Noop(n=4), Noop(n=5)])
    try:
        with transaction.atomic(using=later_db.alias):
            later.enqueue(Noop(n=6))
            later.enqueue_many([Noop(n=7)])
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    told = [(e.job_id, e.stage) for e in seen if isinstance(e, events.JobEnqueued)]
    assert told == [
        (kept, "enqueued"),
        (delayed, "delayed"),
        (child, "waiting"),
        (bulk[0], "enqueued"),
        (bulk[1], "enqueued"),
    ]
    assert {e.job_type for e in seen} == {"tests.jobapp.jobs.Noop"}
    assert {e.namespace for e in seen} == {"default"}
