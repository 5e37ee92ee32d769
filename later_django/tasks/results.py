"""Task results: the job's stage and times, plus the row the task's attempts
write (worker ids, errors, return value), read back as Django TaskResults.

Only task jobs write ``later_task_result``; plain jobs never touch it. The
row goes when the job is pruned (``DASHBOARD_RETENTION`` after it finished).
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from later_django.clock import to_datetime
from later_django.codec import decode
from later_django.conf import conf
from later_django.context import JobContext
from later_django.db.rows import TaskAttemptEnd
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
        .values_list(
            "type_name",
            "stage",
            "created_ms",
            "finished_ms",
            "history",
            "payload",
            "attempts",
            "lease_owner",
        )  # fmt: skip
        .first()
    )
    task = find_task(row[0]) if row is not None else None
    if row is None or task is None:
        raise compat.TaskResultDoesNotExist(result_id)
    type_name, stage, created_ms, finished_ms, history, payload, attempts, owner = row
    call = decode(bytes(payload), TaskCall)
    kept = ResultRow.objects.using(alias).filter(job_id=str(result_id)).first()
    running = [change.at for change in parse_history(history) if change.stage == Stage.RUNNING]
    status = STATUS[Stage(stage)]
    workers = json.loads(kept.worker_ids) if kept else []
    if stage == Stage.RUNNING and len(workers) < attempts:
        # The running attempt writes its worker id when it ends.
        workers += [UNKNOWN_WORKER] * (attempts - 1 - len(workers)) + [owner or UNKNOWN_WORKER]
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
        worker_ids=workers,
    )
    if status == TaskResultStatus.SUCCESSFUL and kept and kept.return_value is not None:
        compat.set_field(result, "_return_value", json.loads(kept.return_value))
    return result


@dataclass(frozen=True, slots=True)
class Earlier:
    """What the attempts before this one left: their worker ids (one per
    attempt, padded with ``unknown``) and their errors, as stored."""

    worker_ids: list[str]
    errors: list[dict[str, str]]


NONE_EARLIER = Earlier([], [])


def earlier_attempts(job_id: str, attempt: int) -> Earlier:
    """Read what attempts before ``attempt`` stored (nothing to read for the
    first attempt)."""
    if attempt <= 1:
        return NONE_EARLIER
    kept = (
        ResultRow.objects.using(conf.database)
        .filter(job_id=job_id)
        .values_list("worker_ids", "errors")
        .first()
    )
    ids, errors = (json.loads(kept[0]), json.loads(kept[1])) if kept else ([], [])
    ids = ids[: attempt - 1] + [UNKNOWN_WORKER] * (attempt - 1 - len(ids))
    return Earlier(ids, errors)


def lease_holder(job_id: str) -> str:
    """The id of the server that holds the job's lease (the running attempt's worker)."""
    owner = Job.objects.using(conf.database).filter(id=job_id).values_list("lease_owner", flat=True)
    return next(iter(owner), None) or UNKNOWN_WORKER


def error_of(exc: BaseException) -> TaskError:
    kind = type(exc)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )


def hand_over(
    ctx: JobContext,
    earlier: Earlier,
    *,
    error: TaskError | None = None,
    value: Any = None,
) -> None:
    """Hand the end of this attempt to the worker, which writes it with the
    job's outcome: its worker id, its error (if it failed) after the earlier
    ones, or its return value."""
    errors = list(earlier.errors)
    if error is not None:
        errors.append(
            {"exception_class_path": error.exception_class_path, "traceback": error.traceback}
        )
    workers = json.dumps(earlier.worker_ids)[:-1] + ("," if earlier.worker_ids else "")
    end = TaskAttemptEnd(
        job_id=str(ctx.job_id),
        earlier_workers=workers,
        errors=json.dumps(errors),
        return_value=None if error is not None else json.dumps(value),
    )
    object.__setattr__(ctx, "_attempt_end", end)
