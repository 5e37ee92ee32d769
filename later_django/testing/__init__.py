"""Helpers for users' test suites: run jobs without a worker.

``drain()`` runs every due job in the calling thread and transaction;
``LATER["RUN_INLINE"] = True`` runs jobs when their enqueue commits
(later_django/inline.py); ``later_django.testing.pytest_plugin``
offers both as pytest fixtures. See docs/how-to/testing.md.
"""

from __future__ import annotations

from later_django.testing.runner import JobRun, adrain, drain

__all__ = ["JobRun", "adrain", "drain"]
