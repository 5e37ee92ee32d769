"""Django's Tasks API, from ``django.tasks`` (Django 6.x) or the
``django_tasks`` backport (Django 5.2, the ``tasks`` extra).

The two differ only in where things live and in one exception's name;
everything in later_django.tasks imports them from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Two sources of one API, typed apart by the stubs: checked as Any here.
    task_backends: Any
    BaseTaskBackend: Any
    Task: Any
    TaskContext: Any
    TaskError: Any
    TaskResult: Any
    TaskResultStatus: Any
    InvalidTask: Any
    TaskResultDoesNotExist: Any
    task_enqueued: Any
    task_finished: Any
    task_started: Any
    normalize_json: Any
    SOURCE: str
else:
    try:
        from django.tasks import task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

        SOURCE = "django.tasks"
    except ImportError:
        try:
            from django_tasks import task_backends  # type: ignore[no-redef]
            from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
            from django_tasks.base import (  # type: ignore[no-redef]
                Task,
                TaskContext,
                TaskError,
                TaskResult,
                TaskResultStatus,
            )
            from django_tasks.exceptions import (  # type: ignore[no-redef]
                InvalidTaskError as InvalidTask,
            )
            from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
            from django_tasks.signals import (  # type: ignore[no-redef]
                task_enqueued,
                task_finished,
                task_started,
            )
            from django_tasks.utils import normalize_json  # type: ignore[no-redef]

            SOURCE = "django_tasks"
        except ImportError as exc:
            raise ImportError(
                "later_django.tasks needs Django's Tasks API: Django 6.0 or later has it "
                "built in; on Django 5.2 install the backport with "
                "pip install 'later-django[tasks]'"
            ) from exc

__all__ = [
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def set_field(result: Any, name: str, value: Any) -> None:
    """Set a field of a frozen TaskResult, as Django's own backends do."""
    object.__setattr__(result, name, value)
