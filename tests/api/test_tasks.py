"""Django's own @task run by later: LaterBackend on SQLite and PostgreSQL,
with django.tasks (Django 6) or the django_tasks backport (Django 5.2)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.db import connections, transaction
from django.utils import timezone

if not getattr(django_settings, "HAS_TASKS_API", False):  # pragma: no cover
    pytest.fail("neither django.tasks nor the django_tasks backport is installed")

from later_django import get_job
from later_django.db import dialect_for
from later_django.tasks import compat
from later_django.tasks.compat import InvalidTask, TaskResultDoesNotExist, TaskResultStatus
from tests.helpers import LaterDb, await_stage, serve, wait_until
from tests.jobapp import tasks


@pytest.fixture
def signals() -> Iterator[list[tuple[str, str, str]]]:
    """(signal, result id, status) of every task signal sent in this process."""
    got: list[tuple[str, str, str]] = []
    receivers = {}
    for name in ("task_enqueued", "task_started", "task_finished"):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            got.append((_name, task_result.id, str(task_result.status)))

        receivers[name] = receiver
        getattr(compat, name).connect(receiver, weak=False)
    yield got
    for name, receiver in receivers.items():
        getattr(compat, name).disconnect(receiver)


def result_rows(later_db: LaterDb) -> int:
    return int(later_db.scalar("SELECT COUNT(*) FROM later_task_result"))  # type: ignore[arg-type]


def run_until(*result_ids: str, stage: str = "success", workers: int = 2) -> None:
    async def body(server: Any) -> None:
        for result_id in result_ids:
            await await_stage(result_id, stage)

    serve(body, workers=workers)


# -- the Django documentation's example, on a real later_worker ---------------------
def test_a_task_is_enqueued_run_by_later_worker_and_its_result_fetched(later_db, workers):
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY and result.backend == "default"
    assert get_job(result.id).type_name == "tests.jobapp.tasks.add"  # its import path
    workers.start(workers=2)

    def finished() -> bool:
        result.refresh()
        return result.is_finished

    wait_until(finished, 30, lambda: f"task {result.id} finished; it is {result.status}")
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.args == [2, 3] and result.kwargs == {}
    assert len(result.worker_ids) == 1 and result.attempts == 1
    fetched = tasks.add.get_result(result.id)
    assert fetched.return_value == 5 and fetched.task.func is tasks.add.func
    assert fetched.enqueued_at <= fetched.started_at <= fetched.finished_at
    assert fetched.last_attempted_at == fetched.started_at


# -- outcomes ------------------------------------------------------------------------
def test_a_failing_task_shows_failed_with_the_exception_class_path_and_traceback(later_db, signals):
    result = tasks.explode.enqueue("boom")
    run_until(result.id, stage="failed")
    failed = tasks.explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.finished_at is not None
    assert [error.exception_class_path for error in failed.errors] == ["builtins.ValueError"]
    assert failed.errors[0].exception_class is ValueError
    assert (
        "Traceback" in failed.errors[0].traceback
        and "ValueError: boom" in failed.errors[0].traceback
    )
    with pytest.raises(ValueError, match="Task failed"):
        failed.return_value  # noqa: B018
    assert [(name, status) for name, rid, status in signals if rid == result.id] == [
        ("task_enqueued", "READY"),
        ("task_started", "RUNNING"),
        ("task_finished", "FAILED"),
    ]


def test_a_task_retried_twice_shows_three_worker_ids_and_attempt_three(later_db):
    result = tasks.succeed_on_third.enqueue("x")
    run_until(result.id)
    done = tasks.succeed_on_third.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.attempts == 3 and len(done.worker_ids) == 3
    # The task saw its real attempt and the worker ids so far, through its context.
    assert done.return_value == {"attempt": 3, "workers": done.worker_ids}
    assert all(worker != "unknown" for worker in done.worker_ids)
    assert [error.exception_class_path for error in done.errors] == ["builtins.RuntimeError"] * 2
    assert get_job(result.id).attempts == 3


def test_an_async_task_runs_on_the_workers_event_loop(later_db):
    result = tasks.on_the_loop.enqueue(21)
    run_until(result.id)
    # serve() runs the server's loop in this (the main) thread; sync handlers
    # would run in the handler pool's threads.
    assert tasks.on_the_loop.get_result(result.id).return_value == {
        "doubled": 42,
        "thread": "MainThread",
    }


# -- the enqueue: transactions, run_after, priority ----------------------------------
def test_a_task_enqueued_in_a_rolled_back_transaction_never_runs(later_db, record, signals):
    with pytest.raises(RuntimeError), transaction.atomic(using=later_db.alias):
        lost = tasks.record_run.enqueue("rolled-back")
        raise RuntimeError("the view failed")
    kept = tasks.record_run.enqueue("committed")
    run_until(kept.id)
    assert [line.split()[1] for line in record.read_text().splitlines()] == ["committed"]
    with pytest.raises(TaskResultDoesNotExist):
        tasks.record_run.get_result(lost.id)
    assert lost.id not in {rid for _, rid, _ in signals}, "no signal for a rolled-back task"


def test_run_after_holds_the_task_until_then(later_db):
    when = timezone.now() + dt.timedelta(seconds=1)
    result = tasks.add.using(run_after=when).enqueue(1, 1)
    assert get_job(result.id).stage == "delayed"
    run_until(result.id)
    assert tasks.add.get_result(result.id).started_at >= when


def test_priorities_order_the_run(later_db, record):
    priorities = [-10, 50, 0, 100, -100, 7]
    ids = [
        tasks.record_run.using(priority=priority).enqueue(str(priority)).id
        for priority in priorities
    ]
    run_until(*ids, workers=1)
    ran = [int(line.split()[1]) for line in record.read_text().splitlines()]
    assert ran == sorted(priorities, reverse=True)
    assert [get_job(i).priority for i in ids] == priorities  # one to one


def test_what_the_backend_refuses_is_refused_before_anything_is_written(later_db):
    with pytest.raises(
        InvalidTask, match=r"queue_name='emails' is not declared in LATER\['QUEUES'\]"
    ):
        tasks.add.using(queue_name="emails").enqueue(1, 2)
    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.add.enqueue(object(), 2)
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101).enqueue(1, 2)
    assert later_db.job_count() == 0


def test_an_unknown_result_id_does_not_exist(later_db):
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("01jzzzzzzzzzzzzzzzzzzzzzzz")


def test_the_backend_says_truthfully_what_it_supports():
    backend = tasks.add.get_backend()
    assert type(backend).__name__ == "LaterBackend"
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority
    assert list(backend.check()) == []


# -- storage -------------------------------------------------------------------------
def test_results_go_with_their_jobs_and_plain_jobs_write_none(later_db, record):
    from later_django import enqueue
    from tests.jobapp.jobs import Noop

    plain = enqueue(Noop(n=1))
    result = tasks.add.enqueue(4, 5)
    run_until(plain, result.id)
    assert later_db.rows("SELECT job_id FROM later_task_result") == [(result.id,)]
    later_db.execute("UPDATE later_job SET expires_ms = 0")
    dialect = dialect_for(later_db.alias)
    with transaction.atomic(using=later_db.alias), connections[later_db.alias].cursor() as cursor:
        assert dialect.upkeep.prune(cursor, namespace="default", limit=10) == 2
    assert result_rows(later_db) == 0


@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
def test_an_attempt_whose_claim_was_taken_over_writes_no_result(later_db, fail):
    """A result is written with its attempt's outcome, under the same fence:
    an attempt whose lease another server took stores neither."""
    from later_django.exceptions import LeaseLost
    from later_django.testing import drain

    result = tasks.lose_own_lease.enqueue(fail)
    with pytest.raises(LeaseLost):
        drain()
    assert result_rows(later_db) == 0
    assert tasks.lose_own_lease.get_result(result.id).status == TaskResultStatus.RUNNING


def test_a_tasks_queue_that_later_does_not_declare_is_a_system_check_error(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": "later_django.tasks.LaterBackend",
            "QUEUES": ["default", "emails"],
        }
    }
    errors = list(compat.task_backends["default"].check())
    assert [error.id for error in errors] == ["later.E027"]
    assert "'emails'" in errors[0].msg and "LATER['QUEUES']" in errors[0].hint
    settings.LATER = {**settings.LATER, "QUEUES": {"default": {}, "emails": {}}}
    assert list(compat.task_backends["default"].check()) == []


def test_aenqueue_and_aget_result_work_from_async_code(later_db):
    async def enqueue_and_read() -> tuple[str, str]:
        result = await tasks.add.aenqueue(20, 22)
        fetched = await tasks.add.aget_result(result.id)
        return result.id, str(fetched.status)

    # As in an async view: the thread-sensitive ORM calls come back to this
    # thread and its connection.
    result_id, status = async_to_sync(enqueue_and_read)()
    assert status == "READY"
    run_until(result_id)
    assert tasks.add.get_result(result_id).return_value == 42
