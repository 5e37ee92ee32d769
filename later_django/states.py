"""Job stages and which transitions between them are allowed."""

from __future__ import annotations

from django.db import models


class Stage(models.TextChoices):
    """A job's stage; its values are the strings ``JobInfo.stage`` holds.

    ``enqueued`` (ready), ``delayed`` (due later), ``waiting`` (for its
    parents), ``running``, ``requeued`` (a failed attempt waits for its
    retry), and the finished ``success``, ``failed`` and ``cancelled``."""

    ENQUEUED = "enqueued"
    DELAYED = "delayed"
    WAITING = "waiting"
    RUNNING = "running"
    REQUEUED = "requeued"
    SUCCESS = "success"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({Stage.SUCCESS, Stage.FAILED, Stage.CANCELLED})
# The stages of a job that has not finished, in a fixed order: the unique
# index's condition (models/jobs.py) is written from it.
UNFINISHED = ("enqueued", "delayed", "waiting", "running", "requeued")

PARENT_FAILED = "parent failed"
# A continuation whose parent was gone (pruned) when it was resolved.
PARENT_MISSING = "parent missing"
# A continuation whose parent was cancelled while it ran.
PARENT_CANCELLED = "parent cancelled"
