"""Task results: the job's stage and times, plus the row the task's attempts
write (worker ids, errors, return value), read back as Django TaskResults.

Only task jobs write ``later_task_result``; plain jobs never touch it. The
row goes when the job is pruned (``DASHBOARD_RETENTION`` after it finished).
"""

from __future__ import annotations

import datetime as dt
import json
import traceback
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils.module_loading import import_string

from later_django.clock import to_datetime
from later_django.codec import decode
from later_django.conf import conf
from later_django.context import JobContext
from later_django.lookup import parse_history
from later_django.models import Job
from later_django.models import TaskResult as ResultRow
from later_django.registry import job
from later_django.states import Stage
from later_django.tasks import compat
from later_django.tasks.compat import Task, TaskError, TaskResult, TaskResultStatus

# What a job's stage means to Django's API.
STATUS = {
    Stage.ENQUEUED: TaskResultStatus.READY,
    Stage.DELAYED: TaskResultStatus.READY,
    Stage.WAITING: TaskResultStatus.READY,
    Stage.REQUEUED: TaskResultStatus.READY,
    Stage.RUNNING: TaskResultStatus.RUNNING,
    Stage.SUCCESS: TaskResultStatus.SUCCESSFUL,
    Stage.FAILED: TaskResultStatus.FAILED,
    Stage.CANCELLED: TaskResultStatus.FAILED,
}
# The worker id of an attempt whose process died before it could write one:
# the list still has one entry per attempt, as Django's attempt count needs.
UNKNOWN_WORKER = "unknown"


@dataclass
class TaskCall:
    """A task job's payload: the arguments, normalised to JSON types."""

    args: list[Any]
    kwargs: dict[str, Any]


@job(name="later_django.tasks.TaskCall")
def unnamed_task(ctx: JobContext, call: TaskCall) -> None:
    """Registered so task jobs can be built; a task job is renamed to its
    task's path before it is written, so a worker never runs this."""
    raise RuntimeError("a task job must be named by its task's import path")


def find_task(path: str) -> Task | None:
    """The Task object at ``path`` (a task's module path), or None."""
    try:
        found = import_string(path)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def get_result(result_id: str, backend_alias: str) -> TaskResult:
    """The TaskResult of the task job ``result_id``; TaskResultDoesNotExist if
    no such task job exists in this namespace (never was, or pruned)."""
    alias = conf.database
    row = (
        Job.objects.using(alias)
        .filter(id=str(result_id), namespace=conf.namespace)
        .values_list("type_name", "stage", "created_ms", "finished_ms", "history", "payload")
        .first()
    )
    task = find_task(row[0]) if row is not None else None
    if row is None or task is None:
        raise compat.TaskResultDoesNotExist(result_id)
    type_name, stage, created_ms, finished_ms, history, payload = row
    call = decode(bytes(payload), TaskCall)
    kept = ResultRow.objects.using(alias).filter(job_id=str(result_id)).first()
    running = [change.at for change in parse_history(history) if change.stage == Stage.RUNNING]
    status = STATUS[Stage(stage)]
    result = TaskResult(
        task=task,
        id=str(result_id),
        status=status,
        enqueued_at=to_datetime(created_ms),
        started_at=running[0] if running else None,
        last_attempted_at=running[-1] if running else None,
        finished_at=to_datetime(finished_ms)
        if finished_ms is not None and stage in (Stage.SUCCESS, Stage.FAILED, Stage.CANCELLED)
        else None,
        args=call.args,
        kwargs=call.kwargs,
        backend=backend_alias,
        errors=[TaskError(**error) for error in json.loads(kept.errors)] if kept else [],
        worker_ids=json.loads(kept.worker_ids) if kept else [],
    )
    if status == TaskResultStatus.SUCCESSFUL and kept and kept.return_value is not None:
        compat.set_field(result, "_return_value", json.loads(kept.return_value))
    return result


@dataclass(frozen=True, slots=True)
class Attempt:
    """What a starting attempt knows of its task job."""

    worker_ids: list[str]  # one per attempt so far, this one last
    enqueued_at: dt.datetime | None


def start_attempt(job_id: str, attempt: int) -> Attempt:
    """Record that ``attempt`` of the task job started, by the server holding
    its lease (its worker id)."""
    alias = conf.database
    with transaction.atomic(using=alias):
        job = Job.objects.using(alias).filter(id=job_id).values_list("lease_owner", "created_ms")
        owner, created_ms = next(iter(job), (None, None))
        row, _ = ResultRow.objects.using(alias).select_for_update().get_or_create(job_id=job_id)
        ids = json.loads(row.worker_ids)[: attempt - 1]
        ids += [UNKNOWN_WORKER] * (attempt - 1 - len(ids)) + [owner or UNKNOWN_WORKER]
        row.worker_ids = json.dumps(ids)
        row.save(using=alias, update_fields=["worker_ids"])
    return Attempt(ids, to_datetime(created_ms) if created_ms is not None else None)


def record_error(job_id: str, exc: BaseException) -> TaskError:
    """Append the error of a failed attempt; return it."""
    kind = type(exc)
    error = TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )
    alias = conf.database
    with transaction.atomic(using=alias):
        row, _ = ResultRow.objects.using(alias).select_for_update().get_or_create(job_id=job_id)
        errors = json.loads(row.errors)
        errors.append(
            {"exception_class_path": error.exception_class_path, "traceback": error.traceback}
        )
        row.errors = json.dumps(errors)
        row.save(using=alias, update_fields=["errors"])
    return error


def record_return(job_id: str, value: Any) -> None:
    """Store the (JSON-normalised) return value of the attempt that succeeded."""
    ResultRow.objects.using(conf.database).filter(job_id=job_id).update(
        return_value=json.dumps(value)
    )
