"""How a worker runs a task job: the job is named by its task's import path,
and the handler of that name is made on first use (the backend's resolver,
later_django.tasks.backend.resolve, asks this module for it).

An attempt's end (worker id, error or return value) is written with the
job's outcome, so a result exists exactly when its outcome was stored.
"""

from __future__ import annotations

from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from later_django import registry
from later_django.clock import to_datetime
from later_django.conf import conf
from later_django.context import JobContext
from later_django.ids import id_time_ms
from later_django.retry import RetryPolicy
from later_django.tasks import compat, results
from later_django.tasks.compat import Task, TaskContext, TaskResult, TaskResultStatus
from later_django.tasks.results import TaskCall

T = TypeVar("T")


def handler(task: Task, name: str, sender: type[Any]) -> registry.Handler:
    """The handler of ``task``'s jobs, named ``name``: it runs one attempt.
    ``sender`` is the sender of the attempt's task_started and task_finished."""
    is_async = iscoroutinefunction(task.func)
    retry = getattr(task, "retry", None)

    # An attempt reads what earlier attempts stored only when there were
    # some (or the task takes a context), and writes nothing itself: the
    # first attempt of a task without context costs no statement.
    def run_sync(ctx: JobContext, call: TaskCall) -> None:
        earlier = results.earlier_attempts(ctx.job_id, ctx.attempt)
        holder = results.lease_holder(ctx.job_id) if task.takes_context else None
        result = _started(task, ctx, call, earlier, holder, sender)
        try:
            value = compat.normalize_json(task.func(*_arguments(task, result, call), **call.kwargs))
        except BaseException as exc:
            error = results.error_of(exc)
            results.hand_over(ctx, earlier, error=error)
            _failed(result, error, sender)
            raise
        results.hand_over(ctx, earlier, value=value)
        _succeeded(result, value, sender)

    # An async task's result reads go through sync_to_async's
    # default, thread-sensitive thread, like Django's own async ORM calls:
    # under later_django.testing's drain() that is the test's thread, inside
    # its transaction.
    async def run_async(ctx: JobContext, call: TaskCall) -> None:
        earlier = results.NONE_EARLIER
        if ctx.attempt > 1:
            earlier = await _db(results.earlier_attempts, ctx.job_id, ctx.attempt)
        holder = None
        if task.takes_context:
            holder = await _db(results.lease_holder, ctx.job_id)
        result = _started(task, ctx, call, earlier, holder, sender)
        try:
            raw = await task.func(*_arguments(task, result, call), **call.kwargs)
            value = compat.normalize_json(raw)
        except BaseException as exc:
            error = results.error_of(exc)
            results.hand_over(ctx, earlier, error=error)
            _failed(result, error, sender)
            raise
        results.hand_over(ctx, earlier, value=value)
        _succeeded(result, value, sender)

    return registry.Handler(
        name=name,
        payload_type=TaskCall,
        func=run_async if is_async else run_sync,
        is_async=is_async,
        retry=retry if isinstance(retry, RetryPolicy) else None,
    )


async def _db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` in sync_to_async's thread-sensitive thread and, outside a
    transaction, let that thread's connection go as Django's request cycle
    would (CONN_MAX_AGE): in a worker that thread outlives every job."""

    def call() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connection = connections[conf.database]
            if not connection.in_atomic_block:
                connection.close_if_unusable_or_obsolete()

    return await sync_to_async(call)()


def _started(
    task: Task,
    ctx: JobContext,
    call: TaskCall,
    earlier: results.Earlier,
    holder: str | None,
    sender: type[Any],
) -> TaskResult:
    """The attempt's TaskResult, for its signals and its context: the worker
    ids are the earlier attempts' and, when read, this one's."""
    now = timezone.now()
    workers = [*earlier.worker_ids, holder or results.UNKNOWN_WORKER]
    result = TaskResult(
        task=task,
        id=str(ctx.job_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=to_datetime(id_time_ms(ctx.job_id)),
        started_at=now,
        last_attempted_at=now,
        finished_at=None,
        args=call.args,
        kwargs=call.kwargs,
        backend=task.backend,
        errors=[compat.TaskError(**error) for error in earlier.errors],
        worker_ids=workers,
    )
    compat.task_started.send(sender=sender, task_result=result)
    return result


def _arguments(task: Task, result: TaskResult, call: TaskCall) -> list[Any]:
    return [TaskContext(task_result=result), *call.args] if task.takes_context else call.args


def _failed(result: TaskResult, error: compat.TaskError, sender: type[Any]) -> None:
    result.errors.append(error)
    compat.set_field(result, "status", TaskResultStatus.FAILED)
    compat.set_field(result, "finished_at", timezone.now())
    compat.task_finished.send(sender=sender, task_result=result)


def _succeeded(result: TaskResult, value: Any, sender: type[Any]) -> None:
    compat.set_field(result, "_return_value", value)
    compat.set_field(result, "status", TaskResultStatus.SUCCESSFUL)
    compat.set_field(result, "finished_at", timezone.now())
    compat.task_finished.send(sender=sender, task_result=result)
