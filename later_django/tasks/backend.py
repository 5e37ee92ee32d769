"""``LaterBackend``: Django's Tasks API on later's jobs.

    TASKS = {"default": {"BACKEND": "later_django.tasks.LaterBackend"}}

A task enqueue is a job enqueue (the caller's transaction, ``run_after``,
``priority``, the later queue ``queue_name`` names), run by ``later_worker``
with later's retries and leases. The job is named by the task's import path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from django.core import checks
from django.db import transaction
from django.utils import timezone

from later_django import queues, registry
from later_django.builder import JobBuilder
from later_django.conf import conf
from later_django.job_writes import insert_built
from later_django.options import EnqueueOptions
from later_django.retry import RetryPolicy
from later_django.tasks import compat, results, runner
from later_django.tasks.compat import InvalidTask, Task, TaskResult, TaskResultStatus
from later_django.tasks.results import TaskCall


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LaterTask(Task):  # type: ignore[misc]
    """A Task that also carries later's retry policy: ``@task(retry=...)``
    with a RetryPolicy (Django passes extra ``@task`` arguments to the
    backend's task class). Without one, LATER's default policy applies."""

    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise TypeError(
                f"@task(retry=...) of {self.func.__qualname__} must be a later_django "
                f"RetryPolicy, got {type(self.retry).__name__}; e.g. "
                "retry=RetryPolicy.exponential(3)"
            )
        Task.__post_init__(self)  # the slotted class is a new class: no bare super()


class LaterBackend(compat.BaseTaskBackend):  # type: ignore[misc]
    """The backend of Django's Tasks API that stores each task as a later job,
    run by ``later_worker``: ``TASKS = {"default": {"BACKEND":
    "later_django.tasks.LaterBackend"}}``.

    ``enqueue()`` joins the caller's transaction, as ``later_django.enqueue``
    does; results are read back from the job's row."""

    task_class = LaterTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        registry.add_resolver(resolve)
        # Task paths already checked to import back to their task.
        self._importable: set[str] = set()

    def validate_task(self, task: Task) -> None:
        # queue_name is a later queue: declared in LATER["QUEUES"] (Django
        # checks it against the TASKS entry's QUEUES).
        try:
            queues.stored(task.queue_name, "queue_name")
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None
        super().validate_task(task)

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        self.validate_task(task)
        self._check_importable(task)
        call = TaskCall(
            args=compat.normalize_json(list(args)), kwargs=compat.normalize_json(dict(kwargs))
        )
        queue = task.queue_name
        if task.run_after is not None:
            options = EnqueueOptions(priority=task.priority, at=task.run_after, queue=queue)
        else:
            options = EnqueueOptions(priority=task.priority, queue=queue)
        job = JobBuilder().build(call, options)._replace(type_name=task.module_path)
        job_id = insert_built(job)
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=call.args,
            kwargs=call.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        # Told once the task is really enqueued: never for a rolled-back one.
        transaction.on_commit(
            lambda: compat.task_enqueued.send(type(self), task_result=result),
            using=conf.database,
        )
        return result

    def get_result(self, result_id: str) -> TaskResult:
        return results.get_result(result_id, self.alias)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        yield from super().check(**kwargs)
        undeclared = sorted(set(self.queues) - set(queues.declared()))
        if undeclared:
            yield checks.Error(
                f"TASKS[{self.alias!r}]['QUEUES'] names {', '.join(map(repr, undeclared))}, "
                "which LATER['QUEUES'] does not declare: its tasks could not be enqueued.",
                hint="Declare each in LATER['QUEUES'] (e.g. {'default': {}, 'emails': {}}).",
                id="later.E027",
            )

    def _check_importable(self, task: Task) -> None:
        # A worker finds the task by its path: one that does not import back
        # to this task (defined in a function, or renamed) could never run.
        path = task.module_path
        if path in self._importable:
            return
        found = results.find_task(path)
        if found is None or found.func is not task.func:
            raise InvalidTask(
                f"task {path} cannot be found at its import path, so a worker could not "
                "run it; define it with @task at module level under its own name"
            )
        self._importable.add(path)


def resolve(name: str) -> registry.Handler | None:
    """The handler of task jobs named ``name``, if it is the path of a task
    whose backend is a LaterBackend (the registry resolver it adds)."""
    task = results.find_task(name)
    if task is None or not isinstance(task.get_backend(), LaterBackend):
        return None
    return runner.handler(task, name, sender=LaterBackend)
