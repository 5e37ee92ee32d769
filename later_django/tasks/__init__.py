"""Django's Tasks API (``django.tasks``, or the ``django_tasks`` backport on
Django 5.2) backed by later: ``TASKS = {"default": {"BACKEND":
"later_django.tasks.LaterBackend"}}``. See docs/how-to/tasks.md."""

from __future__ import annotations

from later_django.tasks.backend import LaterBackend, LaterTask

__all__ = ["LaterBackend", "LaterTask"]
