"""The harness's no-op job as a Django task."""

from __future__ import annotations

from django.tasks import task
from jobrec import record


@task()
def noop(n: int, t: float) -> None:
    record(n, t)
