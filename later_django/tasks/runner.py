"""How a worker runs a task job: the job is named by its task's import path,
and the handler of that name is made on first use (registry resolver).

An attempt writes its worker id before the task function runs, and its error
or return value after; then the worker stores the job's outcome as for any
job, so retries, leases and recovery are the same as for plain jobs.
"""

from __future__ import annotations

from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from later_django import registry
from later_django.context import JobContext
from later_django.retry import RetryPolicy
from later_django.tasks import compat, results
from later_django.tasks.compat import Task, TaskContext, TaskResult, TaskResultStatus
from later_django.tasks.results import TaskCall


def resolve(name: str) -> registry.Handler | None:
    """The handler of task jobs named ``name``, if it is the path of a task
    whose backend is a LaterBackend."""
    from later_django.tasks.backend import LaterBackend

    task = results.find_task(name)
    if task is None or not isinstance(task.get_backend(), LaterBackend):
        return None
    is_async = iscoroutinefunction(task.func)
    retry = getattr(task, "retry", None)

    def run_sync(ctx: JobContext, call: TaskCall) -> None:
        result = _started(task, ctx, call, results.start_attempt(ctx.job_id, ctx.attempt))
        try:
            value = compat.normalize_json(task.func(*_arguments(task, result, call), **call.kwargs))
        except BaseException as exc:
            _failed(result, results.record_error(ctx.job_id, exc))
            raise
        results.record_return(ctx.job_id, value)
        _succeeded(result, value)

    # An async task's result writes go through sync_to_async's default,
    # thread-sensitive thread, like Django's own async ORM calls: under
    # later_django.testing's drain() that is the test's thread, inside its
    # transaction.
    async def run_async(ctx: JobContext, call: TaskCall) -> None:
        attempt = await sync_to_async(results.start_attempt)(ctx.job_id, ctx.attempt)
        result = _started(task, ctx, call, attempt)
        try:
            raw = await task.func(*_arguments(task, result, call), **call.kwargs)
            value = compat.normalize_json(raw)
        except BaseException as exc:
            error = await sync_to_async(results.record_error)(ctx.job_id, exc)
            _failed(result, error)
            raise
        await sync_to_async(results.record_return)(ctx.job_id, value)
        _succeeded(result, value)

    return registry.Handler(
        name=name,
        payload_type=TaskCall,
        func=run_async if is_async else run_sync,
        is_async=is_async,
        retry=retry if isinstance(retry, RetryPolicy) else None,
    )


def _started(task: Task, ctx: JobContext, call: TaskCall, attempt: results.Attempt) -> TaskResult:
    from later_django.tasks.backend import LaterBackend

    now = timezone.now()
    result = TaskResult(
        task=task,
        id=str(ctx.job_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=attempt.enqueued_at,
        started_at=now,
        last_attempted_at=now,
        finished_at=None,
        args=call.args,
        kwargs=call.kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=attempt.worker_ids,
    )
    compat.task_started.send(sender=LaterBackend, task_result=result)
    return result


def _arguments(task: Task, result: TaskResult, call: TaskCall) -> list[Any]:
    return [TaskContext(task_result=result), *call.args] if task.takes_context else call.args


def _failed(result: TaskResult, error: compat.TaskError) -> None:
    from later_django.tasks.backend import LaterBackend

    result.errors.append(error)
    compat.set_field(result, "status", TaskResultStatus.FAILED)
    compat.set_field(result, "finished_at", timezone.now())
    compat.task_finished.send(sender=LaterBackend, task_result=result)


def _succeeded(result: TaskResult, value: Any) -> None:
    from later_django.tasks.backend import LaterBackend

    compat.set_field(result, "_return_value", value)
    compat.set_field(result, "status", TaskResultStatus.SUCCESSFUL)
    compat.set_field(result, "finished_at", timezone.now())
    compat.task_finished.send(sender=LaterBackend, task_result=result)
