"""pytest fixtures for users' suites; enable with, in the root conftest.py::

    pytest_plugins = ["later_django.testing.pytest_plugin"]

Not registered as an entry point on purpose: installing later_django must
not add fixtures (or import Django) in every pytest run of the machine.
The fixtures need pytest-django, and a test that uses them needs database
access (``@pytest.mark.django_db``) to LATER["DATABASE"].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from later_django.testing.runner import JobRun, drain


@pytest.fixture
def later_drain() -> Callable[..., list[JobRun]]:
    """later_django.testing.drain: run every due job now, in the test's
    transaction, and return what ran."""
    return drain


@pytest.fixture
def later_inline(settings: Any) -> None:
    """Turn LATER["RUN_INLINE"] on for one test: each job runs when its
    enqueue commits. Inside a test wrapped in a transaction (``django_db``
    without ``transaction=True``) nothing commits: wrap the code under test
    in ``django_capture_on_commit_callbacks(execute=True)``, or use
    ``later_drain``."""
    settings.LATER = {**getattr(settings, "LATER", {}), "RUN_INLINE": True}
