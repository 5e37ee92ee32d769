"""Django Tasks (``@task``) run by later's workers in tests/api/test_tasks.py."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

from later_django import RetryPolicy

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


def _record(kind: str, tag: str) -> None:
    path = os.environ.get("LATER_TEST_RECORD")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{kind} {tag} {os.getpid()} {time.clock_gettime(time.CLOCK_REALTIME):.6f}\n")


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def record_run(tag: str) -> str:
    _record("task", tag)
    return tag


@task(retry=RetryPolicy.no_retries())
def explode(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True, retry=RetryPolicy.fixed(3, timedelta(milliseconds=50)))
def succeed_on_third(context, tag: str) -> dict[str, object]:
    if context.attempt < 3:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt, "workers": list(context.task_result.worker_ids)}


@task
async def on_the_loop(x: int) -> dict[str, object]:
    return {"doubled": x * 2, "thread": threading.current_thread().name}


@task(takes_context=True)
def lose_own_lease(context, fail: bool) -> int:
    """Hands its job's lease to another server, as a takeover would, then
    succeeds or fails: its outcome, and so its result, must not be stored."""
    from django.db import connections

    from later_django.conf import conf

    with connections[conf.database].cursor() as cursor:
        cursor.execute(
            "UPDATE later_job SET lease_owner = 'another-server' WHERE id = %s",
            [context.task_result.id],
        )
    if fail:
        raise ValueError("after its lease was taken")
    return 1
