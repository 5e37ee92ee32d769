"""The package as users get it: ``python -m build`` makes the sdist, then the
wheel from the sdist; the wheel holds every module, template, static file
and migration of the app; installed into a clean virtualenv (its
dependencies from the package index), it runs the example project's demo,
serves its templates and static files, and answers ``later_health``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import later_django
from tests.helpers import PROJECT_DIR

# Builds, a virtualenv and pip: Django's version changes nothing here (tox.ini).
pytestmark = [pytest.mark.slow, pytest.mark.one_env]

PACKAGE = PROJECT_DIR / "later_django"
# What a build reads is the source tree; what is made, run or cached is left behind.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", ".tox", "__pycache__", "*.pyc", "*.egg-info", "build", "dist",
    "*.sqlite3*", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", "artifacts",
)  # fmt: skip


def package_files() -> set[str]:
    """Every file of later_django in the source tree, as a wheel names it."""
    return {
        path.relative_to(PROJECT_DIR).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def clean_env() -> dict[str, str]:
    """This environment without what points Python or Django at the tests."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "LATER_", "PYTHON", "VIRTUAL_ENV"))
        and key != "DATABASE_URL"
    }


def run(argv: list[str | Path], cwd: Path, env: dict[str, str]) -> str:
    """Run ``argv``; return its output, failing the test with it on an error."""
    result = subprocess.run(
        [str(arg) for arg in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, (
        f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


def test_wheel_installs_in_a_clean_venv_and_runs_the_example(tmp_path: Path):
    """The sdist and the wheel build; the wheel carries the whole app; a
    clean virtualenv with only the wheel and its dependencies runs the
    example's jobs with its own copy of later_django."""
    source = tmp_path / "source"
    shutil.copytree(PROJECT_DIR, source, ignore=NOT_SOURCE)
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--outdir", dist, source], tmp_path, clean_env())
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")

    expected = package_files()
    kinds = {kind: {f for f in expected if f"/{kind}/" in f} for kind in ("templates", "static")}
    kinds["migrations"] = {f for f in expected if "/migrations/0" in f}
    assert all(kinds.values()), kinds
    assert "later_django/py.typed" in expected
    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
        (metadata,) = [n for n in in_wheel if n.endswith(".dist-info/METADATA")]
        headers = Parser().parsestr(whl.read(metadata).decode())
    assert sorted(expected - in_wheel) == [], "the wheel lacks files of the app"
    assert headers["Version"] == later_django.__version__
    with tarfile.open(sdist) as tar:
        root = f"later_django-{later_django.__version__}/"
        in_sdist = {name.removeprefix(root) for name in tar.getnames()}
    assert sorted(expected - in_sdist) == [], "the sdist lacks files of the app"

    venv = tmp_path / "venv"
    env = clean_env()
    run([sys.executable, "-m", "venv", venv], tmp_path, env)
    python = venv / "bin" / "python"
    # The tasks extra: the example's Django @task needs the backport on Django 5.2.
    run([python, "-m", "pip", "install", "-q", f"{wheel}[tasks]"], tmp_path, env)
    where = run(
        [python, "-c", "import later_django as l; print(l.__file__); print(l.__version__)"],
        tmp_path,
        env,
    ).split()
    assert Path(where[0]).is_relative_to(venv), "later_django comes from the venv"
    assert where[1] == later_django.__version__

    example = tmp_path / "example"
    shutil.copytree(PROJECT_DIR / "example_project", example, ignore=NOT_SOURCE)
    manage = [python, "manage.py"]
    assert "Applying later_django.0019_server_version" in run(
        [*manage, "later_migrate"], example, env
    )
    run([*manage, "migrate", "-v0"], example, env)
    demo = run([*manage, "demo"], example, env)
    assert "paid=True; worker exited with code 0" in demo, demo

    templates = sorted(f for f in kinds["templates"] if f.endswith(".html"))
    names = [f.split("/templates/", 1)[1] for f in templates]
    loaded = run(
        [python, "-c",
         "import django; django.setup()\n"
         "from django.template.loader import get_template\n"
         f"for name in {names!r}: print(get_template(name).origin.name)"],
        example,
        {**env, "DJANGO_SETTINGS_MODULE": "example_project.settings"},
    ).split()  # fmt: skip
    assert len(loaded) == len(names)
    assert all(Path(path).is_relative_to(venv) for path in loaded), loaded
    static = sorted(f.split("/static/", 1)[1] for f in kinds["static"])
    found = run([*manage, "findstatic", "-v0", *static], example, env).split()
    assert len(found) == len(static)
    assert all(Path(path).is_relative_to(venv) for path in found), found

    health = run([*manage, "later_health", "--deep"], example, env)
    assert health.startswith("OK: database 'default' reachable; later's migrations current;")
