"""Package metadata: what each extra installs, and where."""

from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement

from tests.helpers import PROJECT_DIR

PYPROJECT = PROJECT_DIR / "pyproject.toml"


def extra(name: str) -> list[Requirement]:
    data = tomllib.loads(PYPROJECT.read_text())
    return [Requirement(spec) for spec in data["project"]["optional-dependencies"][name]]


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_packaging_tasks_extra_installs_the_backport_on_every_python(python):
    """django-tasks is the backport for Django 5.2, which runs on Python 3.12
    too: no Python version may switch the extra off (a marker cannot test
    Django's version, so the extra has none)."""
    (requirement,) = extra("tasks")
    assert requirement.name == "django-tasks"
    marker = requirement.marker
    assert marker is None or marker.evaluate({"python_version": python})
