"""later_django.testing on both databases: drain() inside a test's
transaction, LATER["RUN_INLINE"], and the pytest fixtures."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

import pytest
from django.conf import settings as django_settings
from django.core.checks import Error
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test import TestCase, override_settings

import later_django as later
from later_django import checks, wakeup
from later_django.db.base import TABLES
from later_django.testing import JobRun, adrain, drain
from tests.helpers import set_later
from tests.jobapp.jobs import (
    Again,
    AsyncWriteNote,
    DefaultPolicy,
    NoRetry,
    NoteThenFail,
    RetryAtOnce,
    Snoozy,
    WriteNote,
)
from tests.jobapp.models import Note

# Each test runs inside a transaction rolled back at its end, as in a
# django.test.TestCase; the few that need real commits say so.
pytestmark = pytest.mark.django_db(databases="__all__")
TRANSACTIONAL = pytest.mark.django_db(transaction=True, databases="__all__")


@dataclass
class Unregistered:
    """A payload type with no handler."""

    n: int = 0


def _notes(alias: str) -> list[str]:
    return sorted(Note.objects.using(alias).values_list("text", flat=True))


def _outcomes(runs: list[JobRun]) -> list[tuple[str, int, str]]:
    return [(run.type_name.rsplit(".", 1)[1], run.attempt, run.outcome) for run in runs]


def _stage(job_id: str) -> str:
    info = later.get_job(job_id)
    assert info is not None
    return info.stage


# -- drain() in a django.test.TestCase, as a user writes it ---------------------------


class DrainTestCase(TestCase):
    """drain() inside TestCase's transaction, on SQLite ("default")."""

    databases = "__all__"
    alias = "default"

    def setUp(self) -> None:
        if self.alias not in django_settings.DATABASES:
            self.skipTest("no PostgreSQL server could be started")
        self.enterContext(
            override_settings(LATER={**django_settings.LATER, "DATABASE": self.alias})
        )
        with connections[self.alias].cursor() as cursor:
            for table in TABLES:  # rows committed by earlier transactional tests
                cursor.execute(f"DELETE FROM {table}")

    def test_drain_runs_job_and_continuation_and_the_test_sees_their_writes(self) -> None:
        """A job and its continuation run in the test's transaction; the test
        sees their rows and their stored success."""
        with transaction.atomic(using=self.alias):
            parent = later.enqueue(WriteNote(text="parent"))
            child = later.enqueue_continue(parent, WriteNote(text="child"))
        self.assertEqual(_stage(child), "waiting")

        runs = drain()

        self.assertEqual(
            [(r.job_id, r.outcome) for r in runs], [(parent, "succeeded"), (child, "succeeded")]
        )
        self.assertEqual(_notes(self.alias), ["child", "parent"])
        self.assertEqual((_stage(parent), _stage(child)), ("success", "success"))
        self.assertEqual(drain(), [])

    async def test_adrain_runs_an_async_handler_in_the_test_transaction(self) -> None:
        """adrain() from an async test: the async handler's ORM calls and its
        aenqueue() use the test's connection, so the test sees both notes."""
        job_id = await later.aenqueue(AsyncWriteNote(text="async"))

        runs = await adrain()

        self.assertEqual([r.outcome for r in runs], ["succeeded", "succeeded"])
        self.assertEqual(runs[0].job_id, job_id)
        notes = [
            n
            async for n in Note.objects.using(self.alias)
            .order_by("text")
            .values_list("text", flat=True)
        ]
        self.assertEqual(notes, ["async", "async (after)"])

    def test_drain_runs_sync_and_async_django_tasks_in_the_test_transaction(self) -> None:
        """Django @task functions, sync and async, run under drain() and their
        results are written in the test's transaction (the async one's
        through the thread-sensitive sync_to_async, back in this thread)."""
        from tests.jobapp import tasks

        added = tasks.add.enqueue(2, 3)
        doubled = tasks.on_the_loop.enqueue(4)

        runs = drain()

        self.assertEqual(sorted(r.outcome for r in runs), ["succeeded", "succeeded"])
        self.assertEqual(tasks.add.get_result(added.id).return_value, 5)
        self.assertEqual(tasks.on_the_loop.get_result(doubled.id).return_value["doubled"], 8)


class DrainPostgresTestCase(DrainTestCase):
    """The same tests on PostgreSQL ("pg")."""

    alias = "pg"


# -- drain(): what runs and what is reported ------------------------------------------


def test_drain_reports_each_attempt_in_order(later_db):
    """Every due job runs once, in claim order, each reported with its id,
    type, attempt and outcome."""
    first = later.enqueue(WriteNote(text="a"), priority=5)
    second = later.enqueue(WriteNote(text="b"))

    runs = drain()

    assert [(r.job_id, r.type_name, r.attempt, r.outcome, r.error) for r in runs] == [
        (first, "tests.jobapp.jobs.WriteNote", 1, "succeeded", None),
        (second, "tests.jobapp.jobs.WriteNote", 1, "succeeded", None),
    ]
    assert _notes(later_db.alias) == ["a", "b"]


def test_drain_runs_a_snoozed_job_again_once_due_without_counting_the_snooze(later_db):
    """A snooze due at once runs again in the same drain, at the same
    attempt; one due later is left delayed."""
    now = later.enqueue(Snoozy(times=1, delay_ms=0))
    later_on = later.enqueue(Snoozy(times=1, delay_ms=3_600_000))

    runs = drain()

    assert sorted((r.job_id, r.attempt, r.outcome) for r in runs) == sorted(
        [(now, 1, "snoozed"), (later_on, 1, "snoozed"), (now, 1, "succeeded")]
    )
    assert later_db.stage_of(now) == "success"
    assert later_db.stage_of(later_on) == "delayed"


def test_drain_failure_without_retries_fails_the_job_and_its_continuation(later_db):
    """A job with no retry left is failed with its error; its waiting
    continuation is failed with "parent failed" and never runs."""
    parent = later.enqueue(NoRetry())
    child = later.enqueue_continue(parent, WriteNote(text="never"))

    runs = drain()

    assert _outcomes(runs) == [("NoRetry", 1, "failed")]
    assert runs[0].error.startswith("ValueError: refused once and for all\n")
    assert (_stage(parent), _stage(child)) == ("failed", "failed")
    assert later.get_job(child).last_error == "parent failed"
    assert _notes(later_db.alias) == []


def test_drain_leaves_a_retry_due_later_requeued(later_db):
    """A retry due later (the default policy waits about a second) is
    reported as "retry" and left requeued; draining again runs nothing."""
    job_id = later.enqueue(DefaultPolicy())

    runs = drain()

    assert _outcomes(runs) == [("DefaultPolicy", 1, "retry")]
    assert "fails under the default policy" in runs[0].error
    assert _stage(job_id) == "requeued"
    assert drain() == []


def test_drain_runs_retries_that_are_due_at_once(later_db):
    """Retries whose policy waits zero are due at once: the same drain runs
    them until the job succeeds."""
    job_id = later.enqueue(RetryAtOnce(text="third time", succeed_on=3))

    runs = drain()

    assert _outcomes(runs) == [
        ("RetryAtOnce", 1, "retry"),
        ("RetryAtOnce", 2, "retry"),
        ("RetryAtOnce", 3, "succeeded"),
    ]
    assert {r.job_id for r in runs} == {job_id}
    assert Note.objects.using(later_db.alias).get(text="third time").attempt == 3


def test_drain_leaves_delayed_jobs_that_are_not_due(later_db):
    """A job delayed into the future is not run and stays delayed; a job
    made with a time already past is ready and runs."""
    future = later.enqueue_delayed(WriteNote(text="later"), dt.timedelta(hours=1))
    past = later.enqueue_delayed_at(WriteNote(text="past"), dt.datetime(2020, 1, 1, tzinfo=dt.UTC))

    runs = drain()

    assert [r.job_id for r in runs] == [past]
    assert _stage(future) == "delayed"
    assert _notes(later_db.alias) == ["past"]


def test_drain_runs_jobs_that_handlers_enqueue(later_db):
    """A job an async handler enqueues (ctx.aenqueue) runs in the same drain."""
    later.enqueue(AsyncWriteNote(text="x"))

    runs = drain()

    assert _outcomes(runs) == [("AsyncWriteNote", 1, "succeeded"), ("WriteNote", 1, "succeeded")]
    assert _notes(later_db.alias) == ["x", "x (after)"]


def test_drain_keeps_the_writes_of_an_attempt_that_failed(later_db):
    """What a handler wrote before it raised stays, as under a worker whose
    handler writes in autocommit."""
    later.enqueue(NoteThenFail(text="written"))

    runs = drain()

    assert _outcomes(runs) == [("NoteThenFail", 1, "failed")]
    assert _notes(later_db.alias) == ["written"]


def test_drain_survives_a_database_error_in_a_handler(later_db):
    """A handler's IntegrityError fails its job without breaking the test's
    transaction: later jobs still run and the test can still query."""
    Note.objects.using(later_db.alias).create(text="taken", job_id="-")
    failing = later.enqueue(WriteNote(text="taken"), priority=1)
    later.enqueue(WriteNote(text="free"))

    runs = drain()

    assert [(r.job_id == failing, r.outcome) for r in runs] == [
        (True, "failed"),
        (False, "succeeded"),
    ]
    assert "IntegrityError" in runs[0].error
    assert _notes(later_db.alias) == ["free", "taken"]
    assert _stage(failing) == "failed"


def test_drain_stops_a_queue_that_never_empties(later_db):
    """A job that enqueues itself again stops drain after max_jobs attempts
    with an error saying so."""
    later.enqueue(Again())

    with pytest.raises(RuntimeError, match=r"drain\(\) ran 5 attempts and jobs are still due"):
        drain(max_jobs=5)

    assert later.stage_counts()["success"] == 5


def test_drain_runs_a_django_task_and_stores_its_result(later_db):
    """A Django @task enqueued through the Tasks backend runs under drain()
    in the test's transaction; its result is readable afterwards."""
    from tests.jobapp import tasks

    result = tasks.add.enqueue(2, 3)

    assert _outcomes(drain()) == [("add", 1, "succeeded")]
    result.refresh()
    assert (str(result.status), result.return_value) == ("SUCCESSFUL", 5)


def test_drain_refuses_bad_arguments_and_async_callers(later_db):
    """max_jobs must be a positive int; from async code drain() points to
    adrain() instead of touching the database."""
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_jobs must be an int >= 1"):
            drain(max_jobs=bad)

    async def from_async() -> None:
        drain()

    with pytest.raises(RuntimeError, match=r"await later_django.testing.adrain\(\)"):
        asyncio.run(from_async())


# -- LATER["RUN_INLINE"] -------------------------------------------------------------------


def test_inline_listens_only_while_the_setting_is_on(later_db, settings):
    """Off, no commit listener is installed, so enqueue pays nothing for the mode."""
    assert not wakeup.has_listeners()
    set_later(settings, RUN_INLINE=True)
    assert wakeup.has_listeners()
    set_later(settings, RUN_INLINE=False)
    assert not wakeup.has_listeners()


@TRANSACTIONAL
def test_inline_runs_a_job_when_its_enqueue_commits(later_db, settings):
    """A job runs once the transaction that enqueued it commits, and not
    before; outside a transaction, before enqueue() returns. The row and its
    history are real."""
    set_later(settings, RUN_INLINE=True)
    with transaction.atomic(using=later_db.alias):
        in_block = later.enqueue(WriteNote(text="in block"))
        assert _notes(later_db.alias) == []
        assert _stage(in_block) == "enqueued"
    assert _notes(later_db.alias) == ["in block"]

    at_once = later.enqueue(WriteNote(text="at once"))
    assert _notes(later_db.alias) == ["at once", "in block"]
    info = later.get_job(at_once)
    assert info.stage == "success"
    assert [change.stage for change in info.history] == ["enqueued", "running", "success"]
    assert _stage(in_block) == "success"


@TRANSACTIONAL
def test_inline_runs_nothing_for_a_rolled_back_enqueue(later_db, settings):
    """A rolled-back transaction leaves no job and runs nothing, as with a worker."""
    set_later(settings, RUN_INLINE=True)
    with pytest.raises(ZeroDivisionError), transaction.atomic(using=later_db.alias):
        later.enqueue(WriteNote(text="rolled back"))
        1 / 0  # noqa: B018
    assert later_db.job_count() == 0
    assert _notes(later_db.alias) == []


@TRANSACTIONAL
def test_inline_runs_continuations_and_leaves_delayed_jobs(later_db, settings):
    """A continuation runs when its parent succeeds inline; a delayed job
    waits (a later drain() runs it once due)."""
    set_later(settings, RUN_INLINE=True)
    with transaction.atomic(using=later_db.alias):
        parent = later.enqueue(WriteNote(text="parent"))
        child = later.enqueue_continue(parent, WriteNote(text="child"))
        delayed = later.enqueue_delayed(WriteNote(text="delayed"), dt.timedelta(hours=1))

    assert _notes(later_db.alias) == ["child", "parent"]
    assert (_stage(parent), _stage(child), _stage(delayed)) == ("success", "success", "delayed")


@TRANSACTIONAL
def test_inline_stores_a_failure_instead_of_raising(later_db, settings):
    """A failing handler does not raise from enqueue(): its outcome is
    stored by its policy, as a worker stores it."""
    set_later(settings, RUN_INLINE=True)
    failed = later.enqueue(NoRetry())
    requeued = later.enqueue(DefaultPolicy())
    assert (_stage(failed), _stage(requeued)) == ("failed", "requeued")
    assert later.get_job(failed).last_error.startswith("ValueError: refused once and for all")


@TRANSACTIONAL
def test_inline_refuses_what_enqueue_refuses_and_writes_nothing(later_db, settings):
    """Inline mode goes through the real enqueue: every refusal raises the
    same error before anything is written or run."""
    set_later(settings, RUN_INLINE=True, MAX_PAYLOAD_BYTES=64)

    refused = [
        (WriteNote(text={"a"}), TypeError, "set is not a supported payload value"),  # type: ignore[arg-type]
        (WriteNote(text=1), TypeError, "expected str, got int"),  # type: ignore[arg-type]
        (WriteNote(text="x" * 100), later.PayloadTooLarge, "above LATER"),
        (Unregistered(), later.NotRegistered, "has no @job handler"),
        ("not a dataclass", TypeError, "payload must be a dataclass instance"),
    ]
    for payload, error, message in refused:
        with pytest.raises(error, match=message):
            later.enqueue(payload)
        with pytest.raises(error, match=message):
            later.enqueue_many([WriteNote(text="ok"), payload])
    assert later_db.job_count() == 0
    assert _notes(later_db.alias) == []


def test_inline_in_a_test_transaction_runs_when_commits_are_captured(
    later_db, settings, django_capture_on_commit_callbacks
):
    """Inside a test's transaction nothing commits; running the captured
    on-commit callbacks runs the jobs, as Django's own on_commit code."""
    set_later(settings, RUN_INLINE=True)
    later.enqueue(WriteNote(text="captured"))
    assert _notes(later_db.alias) == []

    with django_capture_on_commit_callbacks(using=later_db.alias, execute=True):
        later.enqueue(WriteNote(text="executed"))

    assert _notes(later_db.alias) == ["captured", "executed"]


def test_inline_setting_is_checked_and_stops_later_worker(settings):
    """A RUN_INLINE that is not a bool is later.E023; later_worker refuses
    to start while it is on."""
    set_later(settings, RUN_INLINE="yes")
    assert [m for m in checks.check_settings() if m.id == "later.E023"] == [
        Error(
            "LATER['RUN_INLINE'] is 'yes'; it must be True or False.",
            hint="Set LATER['RUN_INLINE'] = True in test settings to run jobs when their "
            "enqueue commits, or leave the key out.",
            id="later.E023",
        )
    ]
    set_later(settings, RUN_INLINE=True)
    assert [m.id for m in checks.check_settings() if m.level >= Error.level] == []
    with pytest.raises(CommandError, match=r"LATER\['RUN_INLINE'\] is True"):
        call_command("later_worker")


# -- the pytest fixtures (tests/conftest.py enables the plugin) -------------------------


def test_fixture_later_drain_runs_jobs(later_db, later_drain):
    """later_drain is drain(): it runs the test's jobs and reports them."""
    later.enqueue(WriteNote(text="fixture"))
    assert _outcomes(later_drain()) == [("WriteNote", 1, "succeeded")]
    assert _notes(later_db.alias) == ["fixture"]


@TRANSACTIONAL
def test_fixture_later_inline_turns_inline_mode_on(later_db, later_inline):
    """later_inline runs each job when its enqueue commits, for this test only."""
    job_id = later.enqueue(WriteNote(text="inline fixture"))
    assert _stage(job_id) == "success"
    assert _notes(later_db.alias) == ["inline fixture"]
