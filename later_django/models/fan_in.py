"""The parent lists of fan-in jobs (docs/how-to/fan-in.md): one row per (child,
parent), written with the child and deleted when the child is pruned.

Only jobs enqueued with ``after=[...]`` of two or more parents have rows:
a plain job, or a continuation of one parent, never reads or writes it.
"""

from __future__ import annotations

from django.db import models

from .jobs import JobIdField


class FanIn(models.Model):
    """One parent of a fan-in job.

    The child's ``later_job.parent_id`` names the one parent it waits on
    now; this table holds all of them, so whoever finishes that one can
    tell whether the others succeeded, and a failing parent finds the
    children that wait on another."""

    pk = models.CompositePrimaryKey("child_id", "parent_id")
    child_id = JobIdField()
    parent_id = JobIdField()

    class Meta:
        db_table = "later_fan_in"
        indexes = [
            # A failing parent's fan-in children, and a job page's continuations.
            models.Index(fields=["parent_id"], name="later_fan_in_parent"),
        ]

    def __str__(self) -> str:
        return f"{self.child_id} after {self.parent_id}"
