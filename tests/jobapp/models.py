"""A model the test handlers write to, so tests can see a job's writes."""

from __future__ import annotations

from django.db import models


class Note(models.Model):
    """One row per handler run that writes; ``text`` is unique, so a second
    write of the same text fails with IntegrityError."""

    text = models.CharField(max_length=100, unique=True)
    job_id = models.CharField(max_length=26)
    attempt = models.IntegerField(default=1)

    def __str__(self) -> str:
        return self.text
